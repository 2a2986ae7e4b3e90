"""Where a launcher flag's value comes from: the command line, an `ELASTICRUN_*` environment
variable, a `--config-file`, or the flag's default, in that order of precedence.

The rule: a flag `--some-flag` (every long name of it: `-np` and `--num-proc` alike) can also be
given as the variable `ELASTICRUN_SOME_FLAG` and as the config-file key `some-flag` or
`some_flag`. A switch (`--tls`, `--verbose`) takes 1/0, true/false or yes/no; a flag with two
values (`--blacklist-cooldown-range`) takes them separated by spaces or commas (a YAML list in a
file). Every value is converted and checked as the command line's would be, and a bad one is one
`UsageError` naming the variable, or the file and key.

Nothing here reads the world: the functions take the parser, the command line and the
environment. `from_environment` gives the variables' flags (and the unknown variables, for one
warning), `config_file.config_flags` the file's, and `layered_defaults` merges them into the
values to install as the parser's defaults, with the source of each.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastic.driver.errors import UsageError

ENV_PREFIX = "ELASTICRUN_"
SECRET_VARIABLES = frozenset({"ELASTICRUN_TOKEN", "ELASTICRUN_ETCD_PASSWORD"})
"""`ELASTICRUN_*` variables that carry a secret, which has no flag: read where it is needed
(`journal/job_token.py`, `cli/backend_flags.py`), never taken for an unknown flag."""
_TRUE = {"1", "true", "yes"}
_FALSE = {"0", "false", "no"}
_TYPE_WORDS = {int: "a whole number", float: "a number"}


@dataclass
class FlagValues:
    """Values for some flags (by argparse dest) and, for each, where it was read ("environment
    variable ELASTICRUN_MIN_NP", "config.yaml, key min_np")."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def put(self, dest: str, value: Any, source: str) -> None:
        """Record `value`; raise `UsageError` when this source already gave the flag under
        another of its names."""
        if dest in self.sources:
            raise UsageError(f"{self.sources[dest]} and {source} give the same flag: keep one")
        self.values[dest] = value
        self.sources[dest] = source


def flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every flag that another source may set, by each of its names (upper case, '_' for '-',
    no dashes; one-letter short names are left out): {"NUM_PROC": -np's action, "NP": ...}."""
    names: dict[str, argparse.Action] = {}
    for action in parser._actions:  # argparse has no public list of its actions
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        for option in action.option_strings:
            name = option.lstrip("-").replace("-", "_").upper()
            if len(name) > 1:
                names[name] = action
    return names


def flag_name(action: argparse.Action) -> str:
    """The name a message uses for a flag: its first long option (`--num-proc`)."""
    longs = [o for o in action.option_strings if o.startswith("--")]
    return (longs or action.option_strings)[0]


def convert(action: argparse.Action, raw: Any, source: str) -> Any:
    """`raw` (a string, or what YAML read: a number, a bool, a list) as the flag's value;
    `UsageError` naming `source` and the flag when it is not one."""
    flag = flag_name(action)
    if action.nargs == 0:  # a switch (store_true)
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise UsageError(f"{source}: {flag} takes 1/0, true/false or yes/no, got {raw!r}")
    if isinstance(action.nargs, int):
        items = raw if isinstance(raw, list) else re.split(r"[\s,]+", str(raw).strip())
        if len(items) != action.nargs:
            raise UsageError(f"{source}: {flag} takes {action.nargs} values, got {raw!r}")
        return tuple(_one(action, item, source, flag) for item in items)
    if isinstance(raw, list | dict):
        raise UsageError(f"{source}: {flag} takes one value, got {raw!r}")
    return _one(action, raw, source, flag)


def _one(action: argparse.Action, raw: Any, source: str, flag: str) -> Any:
    if isinstance(raw, bool) and action.type is not None:  # YAML's `true` is no number
        raise UsageError(f"{source}: {flag} takes {_TYPE_WORDS.get(action.type)}, got {raw!r}")
    text = str(raw).strip()
    value: Any = text
    if action.type is not None:
        try:
            value = action.type(text)  # type: ignore[operator]
        except ValueError:
            word = _TYPE_WORDS.get(action.type, "another kind of value")  # type: ignore[arg-type]
            raise UsageError(f"{source}: {flag} takes {word}, got {raw!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise UsageError(f"{source}: {flag} must be one of {choices}, got {raw!r}")
    return value


def from_environment(
    parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> tuple[FlagValues, list[str]]:
    """The flags the `ELASTICRUN_*` variables give, and the names of those that name no flag
    (sorted). An empty variable counts as unset."""
    names = flag_actions(parser)
    found = FlagValues()
    unknown = []
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or environ[variable] == "":
            continue
        if variable in SECRET_VARIABLES:
            continue
        action = names.get(variable[len(ENV_PREFIX) :])
        if action is None:
            unknown.append(variable)
            continue
        source = f"environment variable {variable}"
        found.put(action.dest, convert(action, environ[variable], source), source)
    return found, unknown


def unknown_variables_warning(parser: argparse.ArgumentParser, unknown: Iterable[str]) -> str:
    """One line naming every unknown `ELASTICRUN_*` variable, with the likeliest meant name."""
    known = list(flag_actions(parser))
    described = []
    for variable in unknown:
        close = difflib.get_close_matches(variable[len(ENV_PREFIX) :], known, n=1)
        meant = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
        described.append(variable + meant)
    return "ignoring environment variable(s) that name no elasticrun flag: " + ", ".join(described)


def command_line_dests(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests of the flags given on the command line (parses `argv` once with every default
    suppressed; a bad command line raises here as it would anyway)."""
    saved = {action: action.default for action in parser._actions}
    try:
        for action in saved:
            action.default = argparse.SUPPRESS
        given = vars(parser.parse_args(argv))
    finally:
        for action, default in saved.items():
            action.default = default
    return set(given) - {"command", "help"}


def layered_defaults(
    parser: argparse.ArgumentParser,
    argv: list[str],
    layers: list[FlagValues],
) -> FlagValues:
    """Merge `layers` (highest precedence first) into the defaults the parser should take,
    below the command line: a flag the command line gives keeps its value there, and a flag
    of a mutually exclusive group (`-H` / `--hostfile`) is dropped from every source below
    the one that gives a member of its group."""
    given = command_line_dests(parser, argv)
    groups = [
        {a.dest for a in group._group_actions}  # argparse keeps the members private
        for group in parser._mutually_exclusive_groups
    ]
    merged = FlagValues()
    taken = set(given)  # dests decided by a higher source
    for layer in layers:
        blocked = set(taken)
        for group in groups:
            if group & taken:
                blocked |= group
        for group in groups:
            both = sorted(group & set(layer.values) - blocked)
            if len(both) > 1:
                names = " and ".join(layer.sources[dest] for dest in both)
                raise UsageError(f"{names} give flags that exclude each other: keep one")
        for dest, value in layer.values.items():
            if dest not in blocked:
                merged.values[dest] = value
                merged.sources[dest] = layer.sources[dest]
        taken |= set(layer.values)
    return merged
