"""The benchmark suite finds its way: `python -m bench list` names every benchmark, every
benchmark of `bench/` is in the catalogue, each entry's module imports and has `main(argv)`,
and `python -m bench run` refuses a name it does not know. Nothing is measured here."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

from bench.catalog import BENCHMARKS, find
from tests.support.paths import REPOSITORY as ROOT

NOT_BENCHMARKS = {"__init__", "__main__", "catalog"}  # the suite's own modules in bench/


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_list_prints_every_benchmark_on_one_line() -> None:
    done = bench("list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [b.name for b in BENCHMARKS]
    for line, benchmark in zip(lines, BENCHMARKS, strict=True):
        assert benchmark.takes in line and benchmark.makes in line


def test_every_benchmark_module_is_in_the_catalogue() -> None:
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")} - NOT_BENCHMARKS
    assert modules == {b.module.removeprefix("bench.") for b in BENCHMARKS}


def test_entries_have_unique_names_and_published_tables() -> None:
    names = [b.name for b in BENCHMARKS]
    assert len(names) == len(set(names))
    assert all(b.makes and b.takes for b in BENCHMARKS)


@pytest.mark.parametrize("name", [b.name for b in BENCHMARKS])
def test_each_entry_imports_and_takes_argv(name: str) -> None:
    module = find(name).load()
    parameters = list(inspect.signature(module.main).parameters.values())
    assert [p.name for p in parameters] == ["argv"] and parameters[0].default is None


def test_support_modules_import() -> None:
    for path in sorted((ROOT / "bench" / "support").glob("*.py")):
        importlib.import_module(f"bench.support.{path.stem}")


def test_run_passes_arguments_through_and_refuses_unknown_names() -> None:
    done = bench("run", "observe_cost", "--help")
    assert done.returncode == 0 and "python -m bench run observe_cost" in done.stdout
    done = bench("run", "no_such_benchmark")
    assert done.returncode == 2 and "observe_cost" in done.stderr
    assert bench().returncode == 2


def test_find_refuses_an_unknown_name() -> None:
    with pytest.raises(LookupError, match="recovery"):
        find("elastic_recovery")
