"""Reading a worker's command line as Python reads it, for warm standbys."""

from __future__ import annotations

import pytest

from elastic.protocol.python_command import (
    PythonCommand,
    read_python_command,
    standby_command,
)


@pytest.mark.parametrize(
    ("command", "read"),
    [
        (["python", "t.py", "--lr", "0.1"], PythonCommand(("python",), "script", "t.py",
                                                          ("--lr", "0.1"))),
        (["/usr/bin/python3.11", "-u", "-B", "dir/t.py"],
         PythonCommand(("/usr/bin/python3.11", "-u", "-B"), "script", "dir/t.py", ())),
        (["python3", "-W", "error", "-Xdev", "-m", "pkg.train", "-m", "x"],
         PythonCommand(("python3", "-W", "error", "-Xdev"), "module", "pkg.train", ("-m", "x"))),
        (["python", "-uW", "ignore", "-c", "print(1)", "a"],
         PythonCommand(("python", "-uW", "ignore"), "code", "print(1)", ("a",))),
        (["python", "-OO", "t.py"], PythonCommand(("python", "-OO"), "script", "t.py", ())),
    ],
)  # fmt: skip
def test_a_python_command_is_read_as_python_reads_it(
    command: list[str], read: PythonCommand
) -> None:
    assert read_python_command(command) == read


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["bash", "run.sh"],
        ["torchrun", "t.py"],
        ["pythonx", "t.py"],
        ["python"],  # the interactive interpreter
        ["python", "-"],  # a script from stdin
        ["python", "-i", "t.py"],  # stays interactive after the script
        ["python", "-x", "t.py"],  # skips the script's first line
        ["python", "-ui", "t.py"],
        ["python", "--check-hash-based-pycs", "always", "t.py"],
        ["python", "-m"],
        ["python", "-W"],
    ],
)
def test_a_command_no_standby_can_run_as_python_would_is_refused(command: list[str]) -> None:
    assert read_python_command(command) is None
    assert standby_command(command) is None


def test_the_standby_runs_the_same_interpreter_with_the_same_options() -> None:
    assert standby_command(["python3", "-u", "-X", "dev", "t.py", "-v"]) == [
        "python3", "-u", "-X", "dev", "-m", "elastic.worker.standby",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (["python", "t.py", "a"], ["t.py", "a"]),
        (["python", "-m", "pkg.train", "a"], ["pkg.train", "a"]),
        (["python", "-c", "code", "a"], ["-c", "a"]),
    ],
)
def test_the_target_sees_the_argv_python_gives_it(command: list[str], argv: list[str]) -> None:
    read = read_python_command(command)
    assert read is not None and read.argv() == argv
