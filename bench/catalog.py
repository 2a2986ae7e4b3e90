"""Every benchmark of the suite, the published table it makes, and how to run it.

One entry per published table (docs/benchmarks.md, and the few figures published elsewhere):
its name, the module that runs it (a file of `bench/` with a `main(argv)`), the arguments of
the published run, roughly how long that run took on this project's 2-core machine, and what
the machine needs beyond the dev install. Two tables made by one module with different
arguments are two entries. `python -m bench list` prints this catalogue; `python -m bench run
NAME ARGS...` runs an entry with its published arguments followed by ARGS (a later flag wins
over an earlier one), and the module writes its JSON under `bench/results/` as it always has.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Benchmark:
    """One entry: `python -m bench run NAME` runs `module`'s `main([*args, *theirs])`."""

    name: str
    module: str  # "bench.recovery"
    makes: str  # the published table, by its heading (page or section first)
    takes: str  # roughly how long the published run took here
    args: tuple[str, ...] = ()  # the published run's arguments
    needs: str = ""  # what the machine needs beyond `pip install -e ".[dev]"`

    def load(self) -> ModuleType:
        """The entry's module, imported (ImportError when it cannot be)."""
        return importlib.import_module(self.module)

    def run(self, args: list[str]) -> int:
        """Run the benchmark with the published arguments, then `args`; its exit code (0 when
        its `main` returns None). Whatever the benchmark raises (SystemExit included) passes
        through."""
        main: Callable[[list[str]], int | None] = self.load().main
        return main([*self.args, *args]) or 0


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark(
        "allreduce_bandwidth",
        "bench.allreduce_bandwidth",
        "docs/benchmarks.md: hvd.allreduce vs torch.distributed.all_reduce (np 2 and 3)",
        "~3 min",
        ("--reps", "6"),
    ),
    Benchmark(
        "training_step",
        "bench.training_step",
        "docs/benchmarks.md: Training step: hvd.DistributedOptimizer vs DistributedDataParallel",
        "~3 min",
    ),
    Benchmark(
        "slot_refill",
        "bench.slot_refill",
        "docs/benchmarks.md: Warm standbys: a crashed worker's slot refilled",
        "~6 min (--trials 5); --bed ~10 min (--trials 3, root)",
        ("--trials", "5"),
    ),
    Benchmark(
        "recovery",
        "bench.recovery",
        "docs/benchmarks.md: Elastic recovery and scale-up: elasticrun vs torchrun",
        "~8 min",
    ),
    Benchmark(
        "sharded_recovery",
        "bench.sharded_recovery",
        "docs/benchmarks.md: Sharded recovery: FSDP2 under elasticrun vs torchrun + DCP",
        "~2.5 min",
    ),
    Benchmark(
        "watched_recovery",
        "bench.recovery",
        "docs/benchmarks.md: Watching a job: its recovery, scraped and polled every second",
        "~2 min",
        ("--trials", "6", "--systems", "elasticrun,elasticrun_observed"),
    ),
    Benchmark(
        "observe_cost",
        "bench.observe_cost",
        "docs/benchmarks.md: Watching a job: what one look costs the driver",
        "~10 s",
    ),
    Benchmark(
        "worker_churn",
        "bench.worker_churn",
        "docs/benchmarks.md: Churn: the driver after thousands of replaced workers",
        "~2 min",
    ),
    Benchmark(
        "host_faults",
        "bench.host_faults",
        "docs/benchmarks.md: Hosts that vanish: elasticrun vs torchrun on the multi-host bed",
        "~13 min",
        needs="root: the multi-host bed",
    ),
    Benchmark(
        "driver_restart",
        "bench.driver_restart",
        "docs/benchmarks.md: Surviving the driver: driver + worker killed, driver restarted",
        "~2.5 min",
        ("--trials", "3"),
        needs="etcd",
    ),
    Benchmark(
        "etcd_cost",
        "bench.etcd_cost",
        "docs/benchmarks.md: Surviving the driver: etcd backend vs memory",
        "~3 min",
        needs="etcd",
    ),
    Benchmark(
        "durable_commit_cost",
        "bench.durable_commit_cost",
        "docs/benchmarks.md: Durable commits: what writing commits costs training",
        "~3 min (GPU)",
        needs="a GPU for the published figures: add --device cuda --batch 8192 --steps 100",
    ),
    Benchmark(
        "sharded_commit_cost",
        "bench.sharded_commit_cost",
        "docs/benchmarks.md: ShardedState commits on one GPU: what they cost training",
        "~2 min (GPU)",
        needs="a GPU for the published figures (a ~350M-parameter model)",
    ),
    Benchmark(
        "goodput",
        "bench.goodput",
        "docs/benchmarks.md: Goodput on a real spot trace: hours 0-4, 1 trace hour = 60 s",
        "~13 min",
        needs="root: the multi-host bed",
    ),
    Benchmark(
        "goodput_half_speed",
        "bench.goodput",
        "docs/benchmarks.md: Goodput on a real spot trace: hours 0-2, 1 trace hour = 120 s",
        "~13 min",
        ("--window", "0:2", "--hour-s", "120"),
        needs="root: the multi-host bed",
    ),
    Benchmark(
        "driver_scale",
        "bench.driver_scale",
        "docs/benchmarks.md: Driver scale: 1,000-10,000 workers, beside torch's TCPStore",
        "~8 min",
        ("--sizes", "1000,4000,10000", "--out", "bench/results/scale.json"),
        needs="etcd",
    ),
    Benchmark(
        "horovod_examples",
        "bench.horovod_examples",
        "docs/benchmarks.md: Horovod's own examples, only the import changed",
        "~2.5 min",
        needs="a Horovod checkout and a Python with torchvision: --examples DIR --python PY",
    ),
    Benchmark(
        "heartbeat_transport",
        "bench.heartbeat_transport",
        "docs/http-api.md: what a heartbeat costs the driver (figures in the text)",
        "~1 min",
    ),
    Benchmark(
        "abuse",
        "bench.abuse",
        "docs/security.md: a job under abuse (the driver's memory, descriptors, answers)",
        "~3 min",
    ),
    Benchmark(
        "step_count_cost",
        "bench.step_count_cost",
        "docs/benchmarks.md: Training step: hvd.DistributedOptimizer vs DistributedDataParallel",
        "~20 s",
    ),
    Benchmark(
        "output_follower_cost",
        "bench.output_follower_cost",
        "none published: what following detached workers' output costs the event loop",
        "~15 s",
    ),
)


def find(name: str) -> Benchmark:
    """The entry called `name`; LookupError, naming the known ones, when there is none."""
    for benchmark in BENCHMARKS:
        if benchmark.name == name:
            return benchmark
    known = ", ".join(b.name for b in BENCHMARKS)
    raise LookupError(f"no benchmark {name!r}; the benchmarks are: {known}")


def listing() -> str:
    """`python -m bench list`: one line an entry, its name, how long it takes, the table it
    makes, and what it needs."""
    width = max(len(b.name) for b in BENCHMARKS)
    takes = max(len(b.takes) for b in BENCHMARKS)
    lines = []
    for b in BENCHMARKS:
        needs = f"  [needs {b.needs}]" if b.needs else ""
        lines.append(f"{b.name:<{width}}  {b.takes:<{takes}}  {b.makes}{needs}")
    return "\n".join(lines)
