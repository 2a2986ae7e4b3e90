"""A worker's command line read as Python reads it: which interpreter, which of its options,
and what it runs (a script, `-m module` or `-c code`) with which arguments.

The driver reads it to start a warm standby with the same interpreter and options
(`standby_command`); the standby reads it again to run the target in its own process
(`elastic.worker.standby`). Commands this cannot read the way Python would (another
program, an option such as `-i` or `-x` that changes how the target runs) give None: they
run as plain processes, never in a standby.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

STANDBY_MODULE = "elastic.worker.standby"

_INTERPRETER = re.compile(r"python(\d+(\.\d+)*)?$")
_FLAGS = frozenset("bBdEIOPqsSuvR")  # options that change nothing a standby must redo
_WITH_VALUE = frozenset("WX")  # options with a value: `-W error`, `-Wdefault`, `-X dev`


@dataclass(frozen=True)
class PythonCommand:
    """`interpreter options... <kind> target arguments...`, as Python runs it."""

    interpreter: tuple[str, ...]  # the program and its options, in order
    kind: Literal["script", "module", "code"]
    target: str  # the script's path, the module's name, or the code
    arguments: tuple[str, ...]  # what the target sees after sys.argv[0]

    def argv(self) -> list[str]:
        """The target's `sys.argv`, as Python would set it (`-m`: the module's name until
        runpy puts its file there)."""
        first = {"script": self.target, "module": self.target, "code": "-c"}[self.kind]
        return [first, *self.arguments]


def read_python_command(command: Sequence[str]) -> PythonCommand | None:
    """Read `command` as a Python interpreter's command line.

    Returns:
        The command's parts, or None when `command` does not start with a program named
        `python`, `python3`, `python3.11`, ..., when an option is one a standby cannot honour
        (`-i`, `-x`, `-h`, `-V`, `--help`, an unknown one), or when no target follows.
    """
    if not command or not _INTERPRETER.match(os.path.basename(command[0])):
        return None
    interpreter = [command[0]]
    index = 1
    while index < len(command):
        word = command[index]
        if word in ("-m", "-c"):
            if index + 1 >= len(command):
                return None
            kind: Literal["module", "code"] = "module" if word == "-m" else "code"
            target, rest = command[index + 1], command[index + 2 :]
            return PythonCommand(tuple(interpreter), kind, target, tuple(rest))
        if word == "-" or not word.startswith("-"):  # the script ("-": stdin is not one)
            if word == "-":
                return None
            return PythonCommand(tuple(interpreter), "script", word, tuple(command[index + 1 :]))
        letters = word[1:]
        if word.startswith("--") or not letters:
            return None
        taken = _read_short_options(letters)
        if taken is None:
            return None
        interpreter.append(word)
        if taken == "value":  # `-W` alone: its value is the next word
            if index + 1 >= len(command):
                return None
            interpreter.append(command[index + 1])
            index += 1
        index += 1
    return None


def _read_short_options(letters: str) -> Literal["done", "value"] | None:
    """`-uB`, `-Werror`, `-W`: "done" when the word holds every value it needs, "value" when
    the next word is its value, None for an option a standby cannot honour."""
    for position, letter in enumerate(letters):
        if letter in _WITH_VALUE:
            return "done" if position + 1 < len(letters) else "value"
        if letter not in _FLAGS:
            return None
    return "done"


def standby_command(command: Sequence[str]) -> list[str] | None:
    """The command that starts a warm standby for workers that run `command`: the same
    interpreter with the same options, running `elastic.worker.standby`; None when `command`
    cannot run in a standby (see `read_python_command`)."""
    python = read_python_command(command)
    if python is None:
        return None
    return [*python.interpreter, "-m", STANDBY_MODULE]
