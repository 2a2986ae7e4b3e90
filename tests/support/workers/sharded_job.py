"""An FSDP2 job under `hvd.elastic.run` with `ShardedState`, that proves each re-form goes on
from a commit bit for bit and that no sample is lost or repeated.

The model (a tiny language model: embedding, one block, a norm and a head, with row counts
no world size of the tests divides evenly) is built by `build(mesh)` with `fully_shard`
over the mesh the state gives, and trained with AdamW on synthetic tokens read through an
`ElasticSampler`. Every step the ranks count (an allreduce) which samples they trained on,
leaving out the padding repeats, in a plain value of the state; after `--epochs` epochs
every sample must have been counted exactly `--epochs` times. Rank 0 writes `result.json`
into `--out`.

Before every commit (and, with `--check-every-step`, before each step's
`state.check_host_updates()`) rank 0 saves the gathered full state (parameters, AdamW's
moments and step counts) to `--out/commit-step{S}.pt`. Each time the training function is
entered after a re-form, the ranks gather the full state again and rank 0 compares it, bit
for bit, with the one saved at the step the state went on from, printing
`re-formed round R size N at step S (commit C): bitwise equal to the commit; WHERE FROM`
(or `... differs in [names]; ...`), where WHERE FROM is `state.last_restore.reason`.

Prints `worker pid=P` at start, `joined rank=R size=N pid=P host=H` after `hvd.init()`,
`step S epoch E size N rank R` per step and `done size N rank R` at the end.
`--hold-at-step S --hold-file F` holds every rank after each step from S on until F exists
(a test's go-ahead once the events it waits for have happened), checking for host updates
meanwhile: the job re-forms while it holds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import sharded_checks  # this script's folder is first on its path
import torch
from tiny_lm import VOCAB, build, train_step

import elastic.torch as hvd
from elastic.worker import context

SEQ = 6


def full_state(state: Any) -> dict[str, torch.Tensor]:
    """`sharded_checks.full_state`, its peer's death the `WorkerLostError` the run loop
    re-forms on (its all-gathers are torch's own, which raise a RuntimeError)."""
    try:
        return sharded_checks.full_state(state)
    except RuntimeError as err:
        if isinstance(err, hvd.elastic.WorkerLostError):
            raise
        raise hvd.elastic.WorkerLostError(f"gathering the full state: {err}") from err


def dump(state: Any, out: Path) -> None:
    """Rank 0 saves the gathered full state as the commit about to be taken at this step."""
    full = full_state(state)
    if hvd.rank() == 0:
        path = out / f"commit-step{state.step}.pt"
        torch.save(full, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)


def check_reform(state: Any, out: Path) -> None:
    """At each entry of the training function: compare with the commit gone on from."""
    full = full_state(state)
    if hvd.rank() != 0:
        return
    path = out / f"commit-step{state.step}.pt"
    if state.step == 0 and not path.exists():  # the job's start: its initial state
        torch.save(full, path)
        return
    ctx = context.current()
    where = f"round {ctx.round} size {hvd.size()} at step {state.step} (commit "
    where += f"{state.commit_count})"
    if not path.exists():
        print(f"re-formed {where}: no commit saved at that step", flush=True)
        return
    differ = sharded_checks.differing(full, torch.load(path, weights_only=True))
    verdict = "bitwise equal to the commit" if not differ else f"differs in {differ}"
    restored = state.last_restore.reason if state.last_restore else "nothing restored"
    print(f"re-formed {where}: {verdict}; {restored}", flush=True)


def hold(state: Any, out: Path, go: str) -> None:
    """Hold every rank after this step until `go` exists, checking for host updates all the
    while, so that the job re-forms (a dead peer, a joiner, a leaver) while it holds."""
    if os.path.exists(go):
        return
    dump(state, out)  # the commit a re-form here takes, or rolls back to
    print(f"holding at step {state.step} for {go}", flush=True)
    while not os.path.exists(go):
        time.sleep(0.1)
        state.check_host_updates()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=480)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--commit-every", type=int, default=3)
    parser.add_argument("--check-every-step", action="store_true")
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--hold-at-step", type=int, default=-1)
    parser.add_argument("--hold-file")
    args = parser.parse_args()
    out = Path(args.out)

    torch.set_num_threads(1)
    print(f"worker pid={os.getpid()}", flush=True)
    hvd.init()
    host = context.current().slot.hostname
    print(f"joined rank={hvd.rank()} size={hvd.size()} pid={os.getpid()} host={host}", flush=True)
    n, b = args.samples, args.batch
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))
    sampler = hvd.elastic.ElasticSampler(range(n), shuffle=True, seed=1)
    state = hvd.elastic.ShardedState(
        build, replicas=args.replicas, sampler=sampler, counts=torch.zeros(n), epoch=0, step=0
    )
    loader = torch.utils.data.DataLoader(range(n), sampler=sampler, batch_size=b)

    @hvd.elastic.run
    def train(state: Any) -> None:
        check_reform(state, out)
        while state.epoch < args.epochs:
            for k, idx in enumerate(loader):  # padded shards: the same steps on every rank
                train_step(state, tokens, idx, k, b)
                print(
                    f"step {state.step} epoch {state.epoch} size {hvd.size()} rank {hvd.rank()}",
                    flush=True,
                )
                time.sleep(args.step_delay)
                if args.hold_file and state.step >= args.hold_at_step:
                    hold(state, out, args.hold_file)
                if state.step % args.commit_every == 0:
                    dump(state, out)
                    state.commit()
                elif args.check_every_step:
                    dump(state, out)
                    state.check_host_updates()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            dump(state, out)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        result = {"counts": state.counts.tolist(), "epochs": args.epochs, "size": hvd.size()}
        (out / "result.json").write_text(json.dumps(result))
    print(f"done size {hvd.size()} rank {hvd.rank()}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
