"""`python -m bench list` and `python -m bench run NAME [ARGS...]`: the benchmark suite.

`list` prints every benchmark of `bench.catalog`, one a line: its name, roughly how long it
takes, the published table it makes, what it needs. `run NAME ARGS...` runs one with its
published arguments and then ARGS (`run NAME --help` shows them all); it exits with the
benchmark's exit code, or 2 for a name that is no benchmark.
"""

from __future__ import annotations

import sys

from bench.catalog import find, listing

USAGE = """usage: python -m bench list
       python -m bench run NAME [ARGS...]   (python -m bench run NAME --help: its arguments)"""


def main(argv: list[str]) -> int:
    """The command line above; returns the exit code."""
    if argv == ["list"]:
        print(listing())
        return 0
    if len(argv) >= 2 and argv[0] == "run":
        try:
            benchmark = find(argv[1])
        except LookupError as err:
            print(err, file=sys.stderr)
            return 2
        # What the benchmark's own --help and usage errors show as its command.
        sys.argv = [f"python -m bench run {benchmark.name}", *argv[2:]]
        return benchmark.run(argv[2:])
    print(USAGE, file=sys.stderr)
    return 0 if argv in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
