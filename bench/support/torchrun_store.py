"""torchrun's c10d rendezvous endpoint as a process of its own: a `TCPStore` server.

    python -m bench.support.torchrun_store [--max-seconds S]

Prints `serving PORT` once it listens on every address (the port chosen by the system), then
serves until SIGTERM or SIGINT, or for `--max-seconds` at most, so that no store outlives a
benchmark that was itself killed. `bench/host_faults.py` runs it in the multi-host bed's root
namespace, where no fault is injected, and starts every torchrun agent with
`--rdzv-conf is_host=false`: no agent serves the store, so no host that vanishes takes the
rendezvous state with it (left to itself, the agent on the endpoint's host would serve it).
"""

from __future__ import annotations

import argparse
import signal
from datetime import timedelta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-seconds", type=float, default=600.0, help="safety: exit after")
    args = parser.parse_args()
    ending = {signal.SIGTERM, signal.SIGINT, signal.SIGALRM}
    signal.pthread_sigmask(signal.SIG_BLOCK, ending)  # delivered to sigwait below, not Python
    signal.setitimer(signal.ITIMER_REAL, args.max_seconds)

    import torch.distributed as dist

    store = dist.TCPStore(
        "0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
    )
    print(f"serving {store.port}", flush=True)
    signal.sigwait(ending)


if __name__ == "__main__":
    main()
