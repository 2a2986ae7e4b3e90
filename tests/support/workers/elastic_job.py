"""An elastic training job that proves nothing is lost or repeated across re-forms.

Every step of a plain DataLoader loop over the ElasticSampler, the ranks count (with an
allreduce) which samples they trained on, leaving out the padding repeats that even out the
shards, in a buffer of the model: TorchState commits, restores and syncs it with everything
else. After `--epochs` epochs every sample must have been counted exactly `--epochs` times,
however the job shrank, grew or rolled back meanwhile. Rank 0 writes `result.json` into `--out`
(with `--save-params`, every rank also writes its parameters to `params-RANK.json` there).
`--ddp elastic` trains a DDP model (`hvd.elastic.DistributedDataParallel`) with a torch
optimizer instead of `DistributedOptimizer`; `--ddp torch` torch's own DDP, to show what a
re-form does to it.

Prints `worker pid=P driver=URL` at start, `joined rank=R size=N pid=P` after `hvd.init()`,
`step S epoch E size N rank R` per step and `done size N rank R` at the end, then calls
`hvd.shutdown()` (unless `--no-shutdown`); `--exit-delay S` makes its interpreter's exit slow.
`--unheard-on HOST`: the workers on HOST register and join but send no heartbeat.
`--lose-step K --lose-step-on-rank R`: a race no test can force (Gloo's allreduce finishing
on some ranks and not on others when a peer dies in it), made to happen: at step K, rank R's
gradient allreduce finishes, then R SIGKILLs the job's last rank and raises `WorkerLostError`
before applying the step, as if its allreduce had failed; the other survivors have applied
step K and lose the last rank in the next collective. Once per job (`--fail-once-file`).
`--die-after-step K`: the last rank SIGKILLs itself right after applying step K, before the
count's allreduce: its peers have applied step K too and lose it before booking it. Once
per job (`--fail-once-file`).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import torch

import elastic.torch as hvd
from elastic.worker import context


def _first_to_create(path: str | None) -> bool:
    try:
        with open(path or os.devnull, "x" if path else "w"):
            return True
    except FileExistsError:
        return False


def _wait_for_file(path: str | None, timeout: float = 60.0) -> None:
    """Hold training here until `path` exists: tests release it once the event they wait for
    (a joiner ready, a host removed) has happened, so the job cannot finish before it."""
    print(f"holding for {path}", flush=True)
    deadline = time.monotonic() + timeout
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def _driver_status() -> str:
    """The driver's `/v1/status` answer, as a user with the job's token would fetch it."""
    request = urllib.request.Request(
        os.environ["ELASTIC_DRIVER_URL"] + "/v1/status",
        headers={"Authorization": f"Bearer {os.environ['ELASTIC_TOKEN']}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.read().decode()


def _model_and_optimizer(
    model: torch.nn.Module, ddp: str | None
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """What the step calls, and its optimizer: the model and a `DistributedOptimizer`; with
    `ddp`, the model in a DDP (the elastic wrapper, or torch's) and a torch optimizer."""
    if ddp is None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        return model, hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    if ddp == "elastic":
        net = hvd.elastic.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    else:
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    return net, torch.optim.SGD(net.parameters(), lr=0.01)


def _lose_a_step(args: argparse.Namespace, optimizer: torch.optim.Optimizer, state) -> None:
    """The race of `--lose-step` (see the module's docstring)."""
    victim = hvd.allgather_object(os.getpid())[-1]  # the last rank of the first round
    reduce = optimizer.synchronize

    def synchronize() -> None:
        reduce()
        if (
            state.step + 1 == args.lose_step
            and hvd.rank() == args.lose_step_on_rank
            and _first_to_create(args.fail_once_file)
        ):
            print(f"losing step {args.lose_step} on rank {hvd.rank()}", flush=True)
            os.kill(victim, signal.SIGKILL)
            raise hvd.WorkerLostError("injected: this rank's allreduce failed, its peers' did not")

    optimizer.synchronize = synchronize


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--fail-at-step", type=int, default=-1, help="raise at this step...")
    parser.add_argument("--fail-once-file", help="...once per job: the first to create this file")
    parser.add_argument("--hold-at-step", type=int, default=-1, help="wait at this step...")
    parser.add_argument("--hold-file", help="...until this file exists (a test's go-ahead)")
    parser.add_argument("--exit-delay", type=float, default=0.0, help="a slow atexit handler")
    parser.add_argument("--no-shutdown", action="store_true", help="never call hvd.shutdown()")
    parser.add_argument("--status-file", help="rank 0 saves /v1/status here at the end")
    parser.add_argument("--ddp", choices=["elastic", "torch"], help="a DDP model (see above)")
    parser.add_argument("--save-params", action="store_true", help="params-RANK.json at the end")
    parser.add_argument(
        "--leave-unheard-at-step",
        type=int,
        default=-1,
        help="the last rank wants to leave at this step, as after SIGTERM or a notice whose "
        "word to the driver was lost",
    )
    parser.add_argument("--lose-step", type=int, default=-1, help="see the docstring")
    parser.add_argument("--lose-step-on-rank", type=int, default=0)
    parser.add_argument("--die-after-step", type=int, default=-1, help="see the docstring")
    parser.add_argument(
        "--unheard-on",
        metavar="HOST",
        help="workers on HOST send no heartbeat: their heartbeats never reach the driver, as "
        "when a connection waits in a loaded driver's backlog (no test can load one so)",
    )
    args = parser.parse_args()

    print(f"worker pid={os.getpid()} driver={os.environ['ELASTIC_DRIVER_URL']}", flush=True)
    if args.unheard_on is not None and os.environ["ELASTIC_HOSTNAME"] == args.unheard_on:
        from elastic.worker.driver_link.heartbeats import BeatSender

        BeatSender.aim = lambda self, target: None  # never told where: it never beats
    if args.exit_delay:  # registered before init, as by a library imported earlier
        atexit.register(time.sleep, args.exit_delay)
    hvd.init()
    print(f"joined rank={hvd.rank()} size={hvd.size()} pid={os.getpid()}", flush=True)
    torch.manual_seed(0)
    n, b = args.samples, args.batch
    data = torch.randn(n, 4)
    target = data.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    model.register_buffer("counts", torch.zeros(n))
    net, optimizer = _model_and_optimizer(model, args.ddp)
    sampler = hvd.elastic.ElasticSampler(range(n), shuffle=True, seed=1)
    state = hvd.elastic.TorchState(
        model=net if args.ddp == "elastic" else model,
        optimizer=optimizer,
        sampler=sampler,
        epoch=0,
        step=0,
    )
    loader = torch.utils.data.DataLoader(range(n), sampler=sampler, batch_size=b)
    if args.lose_step >= 0:
        _lose_a_step(args, optimizer, state)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            for k, idx in enumerate(loader):  # padded shards: the same steps on every rank
                if state.step == args.fail_at_step and _first_to_create(args.fail_once_file):
                    raise ValueError(f"injected failure at step {state.step}")
                optimizer.zero_grad()
                loss = ((net(data[idx]) - target[idx]) ** 2).sum() / (b * hvd.size())
                loss.backward()
                optimizer.step()
                if (
                    state.step + 1 == args.die_after_step
                    and hvd.rank() == hvd.size() - 1
                    and _first_to_create(args.fail_once_file)
                ):
                    os.kill(os.getpid(), signal.SIGKILL)
                seen = torch.zeros(n)
                seen[idx[~state.sampler.padding_mask(k, b)]] = 1.0  # repeats are not counted
                hvd.allreduce_(seen, op=hvd.Sum)
                with torch.no_grad():
                    model.counts += seen
                state.sampler.record_batch(k, b)
                state.step += 1
                print(
                    f"step {state.step} epoch {state.epoch} size {hvd.size()} rank {hvd.rank()}",
                    flush=True,
                )
                time.sleep(args.step_delay)
                if state.step == args.hold_at_step:
                    _wait_for_file(args.hold_file)
                if state.step == args.leave_unheard_at_step and hvd.rank() == hvd.size() - 1:
                    context.current().events.request_leave("its word to the driver was lost")
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if args.save_params:
        parameters = {name: p.tolist() for name, p in model.named_parameters()}
        Path(args.out, f"params-{hvd.rank()}.json").write_text(json.dumps(parameters))
    if hvd.rank() == 0:
        result = {"counts": model.counts.tolist(), "epochs": args.epochs, "size": hvd.size()}
        Path(args.out, "result.json").write_text(json.dumps(result))
        if args.status_file:
            Path(args.status_file).write_text(_driver_status())
    print(f"done size {hvd.size()} rank {hvd.rank()}", flush=True)
    if not args.no_shutdown:
        hvd.shutdown()


if __name__ == "__main__":
    main()
