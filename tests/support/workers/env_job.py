"""A worker that reads its rank variables as a Horovod script would, beside what hvd says.

Prints one line `env PHASE {json}` before `hvd.init()` (PHASE `start`), after it (`init`)
and after every re-form (`reset`, from a reset callback): `environ` holds the `ELASTIC_*`
and `HOROVOD_*` rank variables found in `os.environ` (those unset are left out), `hvd` what
`hvd.rank()`, `hvd.size()`, ... and the host say (after init), `pid` the process. Then it
runs `--steps` steps of one allreduce and a commit each, printing `step S size N rank R`,
and holds at step `--hold-at-step` until `--hold-file` exists.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import elastic.torch as hvd

NAMES = ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE", "HOSTNAME")


def report(phase: str) -> None:
    environ = {
        f"{prefix}_{name}": os.environ[f"{prefix}_{name}"]
        for prefix in ("ELASTIC", "HOROVOD")
        for name in NAMES
        if f"{prefix}_{name}" in os.environ
    }
    said = {}
    if hvd.is_initialized():
        said = {
            "RANK": hvd.rank(),
            "SIZE": hvd.size(),
            "LOCAL_RANK": hvd.local_rank(),
            "LOCAL_SIZE": hvd.local_size(),
            "CROSS_RANK": hvd.cross_rank(),
            "CROSS_SIZE": hvd.cross_size(),
        }
    line = json.dumps({"environ": environ, "hvd": said, "pid": os.getpid()})
    print(f"env {phase} {line}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-delay", type=float, default=0.1)
    parser.add_argument("--hold-at-step", type=int, default=-1)
    parser.add_argument("--hold-file", default="")
    args = parser.parse_args()

    report("start")
    hvd.init()
    report("init")
    state = hvd.elastic.ObjectState(step=0)
    state.register_reset_callbacks([lambda: report("reset")])

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> None:
        while state.step < args.steps:
            hvd.allreduce(torch.ones(1), op=hvd.Sum)
            state.step += 1
            print(f"step {state.step} size {hvd.size()} rank {hvd.rank()}", flush=True)
            time.sleep(args.step_delay)
            while state.step == args.hold_at_step and not os.path.exists(args.hold_file):
                time.sleep(0.05)
            state.commit()

    train(state)
    print(f"done size {hvd.size()} rank {hvd.rank()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
