"""The sharded recovery benchmark's workload for elasticrun: an FSDP2 language model in a
`hvd.elastic.ShardedState`, committed in host memory and replicated to another host.

    elasticrun -np 4 --min-np 1 --max-np 4 --failure-scope worker \\
        --host-discovery-script discovery_scripts/hosts_file.sh --discovery-interval 0.2 \\
        python bench/workloads/sharded_elastic.py --out /tmp/somewhere --commit-every 10

The model (`transformer.py`, its size from `--dim/--layers/--vocab`) is built and sharded by
`build(mesh)`, which the state calls again for every round's mesh; Adam; `--replicas`
replicas of each rank's shards. The first `--quiet-steps` steps take no commit (the step time
without commits); from then on `state.commit()` every `--commit-every` steps. Prints, beside
the `step`/`enter`/`event` lines of `bench/workloads`:

    metric NAME VALUE rank R pid P t T

with NAME one of `commit_s` (how long `state.commit()` blocked the step), `rest_mib` (this
process' resident memory just before a commit), `peak_mib` (its highest resident memory,
sampled every 10 ms, from one commit's start to the next's), `base_mib` (just before the
first commit after the quiet steps), `share_mib` (this rank's share of the state: its rows of
the parameters and of Adam's moments) and `param_share_mib` (of the parameters alone); and

    phase NAME S rank R pid P t T

after each call of the state's re-form and of the run loop's re-join, S its seconds: the
benchmark sums them over a recovery to show where its time goes. These are measured from
here, by wrapping the functions and methods the state calls (this file is a benchmark's
workload; the state itself is not changed): `rejoin` (the worker runtime: the driver's new
round and its process group), `restore`, `sync` (the state's whole re-form), within it
`agree` (its `allgather_object`s: what each rank holds, the manifest, the memory check),
`rewrap` (`_rebuild`: the round's mesh, `build(mesh)`, the checks), `replica_group`
(`_enter_round`: the round's replication group), `transfer` (`reshard`: the rows moved to
their new owners), `to_dtensor` (`state_dicts`), `snapshot` (`take`: the re-formed state's
commit copied to host memory; also at every commit); and, from a commit that sees a new round
to the re-join: `pack` (the commit's copy into host memory), `replicate_start`,
`replicate_wait`, `replicate_stop`, `check_updates` (the agreement on a new round, with what
follows it), `prepare` (the state's preparation to re-form), within it `merge_samplers`. A
wrapped name that the state no longer has is skipped.

A stand-in until `ShardedState` does it (issue 29): FSDP2's own collectives (the all-gather of
the forward, the reduce-scatter of the backward) raise torch's `RuntimeError` when a peer
dies, which the run loop does not take for a lost peer, so the survivors would exit. The
step raises such an error as `hvd.WorkerLostError` (`--no-lost-peer-errors` turns this off).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workloads import event  # noqa: E402

event("process up")  # before the heavy imports: `event started` comes after them

import torch  # noqa: E402

import elastic.torch as hvd  # noqa: E402
from bench.workloads import arg_parser, line, start_safety_timer  # noqa: E402
from bench.workloads.transformer import add_model_args, build, state_bytes, train_step  # noqa: E402

MIB = 1 << 20


def report(kind: str, name: str, value: float) -> None:
    """Print a `metric` or `phase` line (see the module's docstring)."""
    try:
        rank = hvd.rank()
    except Exception:  # noqa: BLE001 - between rounds: no rank to name
        rank = -1
    print(
        f"{kind} {name} {value:.4f} rank {rank} pid {os.getpid()} t {time.time():.6f}",
        flush=True,
    )


def rss_mib() -> float:
    """This process' resident memory now, MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


class PeakMemory:
    """The highest resident memory since the last `reset()`, sampled every 10 ms by a thread."""

    def __init__(self) -> None:
        self.peak = rss_mib()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, rss_mib())
            time.sleep(0.01)

    def reset(self) -> float:
        """The peak so far; sampling starts again from now."""
        peak, self.peak = self.peak, rss_mib()
        return max(peak, self.peak)


def timed(owner: Any, name: str, label: str) -> None:
    """Wrap `owner.name` (a module's function or a class' method) to print a `phase LABEL`
    line after each call; nothing when `owner` has no such name."""
    original: Callable[..., Any] | None = owner.__dict__.get(name)
    if original is None:
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            report("phase", label, time.perf_counter() - start)

    setattr(owner, name, wrapper)


def time_the_reform() -> None:
    """The phases of a recovery, as the module's docstring lists them."""
    from elastic.state.sharded import sharded_state
    from elastic.worker import runtime

    timed(runtime, "rejoin", "rejoin")
    cls = sharded_state.ShardedState
    for name, label in [
        ("restore", "restore"), ("sync_if_needed", "sync"), ("_rebuild", "rewrap"),
        ("_enter_round", "replica_group"),
    ]:  # fmt: skip
        timed(cls, name, label)
    for name, label in [
        ("allgather_object", "agree"), ("reshard", "transfer"), ("state_dicts", "to_dtensor"),
        ("take", "snapshot"),
    ]:  # fmt: skip
        timed(sharded_state, name, label)
    # From a commit that sees a new round to the re-join (the incumbents' stall at a grow).
    from elastic.state import state as plain_state
    from elastic.state import torch_state
    from elastic.state.sharded import replication, slots

    for owner, name, label in [
        (slots.Slots, "pack", "pack"), (replication.Replicator, "start", "replicate_start"),
        (replication.Replicator, "wait", "replicate_wait"),
        (replication.Replicator, "stop", "replicate_stop"),
        (plain_state.State, "_check_host_updates", "check_updates"),
        (torch_state.TorchState, "prepare_to_reform", "merge_samplers"),
        (cls, "prepare_to_reform", "prepare"),
    ]:  # fmt: skip
        timed(owner, name, label)


def main() -> None:
    parser = arg_parser(__doc__ or "")
    add_model_args(parser)
    parser.add_argument("--quiet-steps", type=int, default=0, help="steps without commits")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--no-lost-peer-errors", dest="lost_peer_errors", action="store_false",
        help="let FSDP2's RuntimeError end the worker (see above)",
    )  # fmt: skip
    args = parser.parse_args()
    start_safety_timer(args.max_seconds)
    logging.basicConfig(format="log t %(created).6f %(name)s: %(message)s")
    logging.getLogger("elastic").setLevel(logging.INFO)
    event("started")
    torch.set_num_threads(1)
    time_the_reform()
    memory = PeakMemory()
    hvd.init()
    event(f"initialized size {hvd.size()} rank {hvd.rank()}")
    state = hvd.elastic.ShardedState(lambda mesh: build(args, mesh), replicas=args.replicas, step=0)
    state.register_reset_callbacks([lambda: event(f"reset size {hvd.size()} rank {hvd.rank()}")])
    event(f"ready size {hvd.size()} rank {hvd.rank()} host {os.environ.get('HOROVOD_HOSTNAME')}")
    measured = {"shares": False, "base": False}

    @hvd.elastic.run
    def train(state: Any) -> None:
        model, optimizer = state.model, state.optimizer  # new objects after every re-form
        line("enter", state.step, hvd.size(), hvd.rank())
        while True:
            try:
                train_step(model, optimizer, args, state.step, hvd.rank())
            except RuntimeError as err:  # see the module's docstring
                if isinstance(err, hvd.WorkerLostError) or not args.lost_peer_errors:
                    raise
                raise hvd.WorkerLostError(f"FSDP2's collective failed: {err}") from err
            state.step += 1
            line("step", state.step, hvd.size(), hvd.rank())
            if state.step <= args.quiet_steps or state.step % args.commit_every:
                continue
            if not measured["shares"]:
                measured["shares"] = True
                report("metric", "share_mib", state_bytes(model, optimizer) / MIB)
                report("metric", "param_share_mib", state_bytes(model, _NoState()) / MIB)
            if not measured["base"]:
                measured["base"] = True
                report("metric", "base_mib", rss_mib())
            report("metric", "rest_mib", rss_mib())
            report("metric", "peak_mib", memory.reset())
            start = time.perf_counter()
            state.commit()
            report("metric", "commit_s", time.perf_counter() - start)

    train(state)


class _NoState:
    """An optimizer without state: `state_bytes` of the parameters alone."""

    state: dict[Any, Any] = {}


if __name__ == "__main__":
    main()
