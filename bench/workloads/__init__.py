"""Training workloads for the recovery benchmarks, one for elasticrun and one for torchrun each:
the tiny MLP of `bench/recovery.py` here (`tiny_*.py`), and the FSDP2 language model of
`bench/sharded_recovery.py` (`transformer.py`, `sharded_*.py`, which print the same lines).

The tiny ones both train the same small MLP (64 -> 768 -> 768 -> 768 -> 1, ~1.2M parameters)
on the same synthetic regression data with plain SGD, `BATCH` samples per rank and step (about
20 ms of forward + backward + update on one thread of this machine's CPUs), and commit
(`tiny_elastic.py`: `state.commit()`, in memory) or checkpoint (`tiny_torchrun.py`: rank 0
writes a file) every `--commit-every` steps; with `--compute-s S`, each step first sleeps S
seconds, as if an accelerator computed meanwhile, so that hosts sharing this machine's CPUs
still train about as fast each as alone (bench/goodput.py). Every rank prints one line per step:

    step S size N rank R pid P t T

with S the global step just completed (1, 2, ...), N the number of workers, T `time.time()`
right after the step; and, when it (re)starts training, the step it resumes from:

    enter step S size N rank R pid P t T

The benchmark parses these lines from the launchers' output. A safety timer ends a worker
after `--max-seconds`, so no worker outlives a benchmark that was itself killed.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

FEATURES = 64
HIDDEN = 768
BATCH = 80  # per rank and step
SAMPLES = 48_000
LR = 0.01


def arg_parser(description: str) -> argparse.ArgumentParser:
    """The arguments both workloads take; a workload may add its own before parsing."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="folder for checkpoints (torchrun)")
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="safety: exit after")
    parser.add_argument(
        "--compute-s",
        type=float,
        default=0.0,
        help="seconds each step also waits before its forward pass, standing in for an "
        "accelerator's compute (the goodput benchmark's; default 0)",
    )
    return parser


def parse_args(description: str) -> argparse.Namespace:
    return arg_parser(description).parse_args()


def start_safety_timer(seconds: float) -> None:
    """End this process (exit code 3) after `seconds`, whatever it is doing."""
    timer = threading.Timer(seconds, os._exit, (3,))
    timer.daemon = True
    timer.start()


def build_model():  # -> torch.nn.Module
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )


def make_data(samples: int):  # -> tuple[torch.Tensor, torch.Tensor]
    """The same synthetic regression data on every rank (seeded)."""
    import torch

    generator = torch.Generator().manual_seed(1234)
    features = torch.randn(samples, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, 1, generator=generator)
    targets = features @ weights + 0.1 * torch.randn(samples, 1, generator=generator)
    return features, targets


def line(kind: str, step: int, size: int, rank: int) -> None:
    """Print a `step`/`enter` line (see the module's docstring)."""
    print(
        f"{kind} {step} size {size} rank {rank} pid {os.getpid()} t {time.time():.6f}",
        flush=True,
    )


def event(what: str) -> None:
    """Print a timestamped event line: `event WHAT pid P t T`."""
    print(f"event {what} pid {os.getpid()} t {time.time():.6f}", flush=True)
