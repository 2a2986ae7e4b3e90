"""Where a driver, or an operator's command, gets a job's token when etcd does not hold it.

etcd holds no token (`elastic.protocol.etcd`): a driver that takes a job up again, and
`elasticrun status/drain/stop --etcd-endpoints ...`, get it from, in this order:

1. `--token-file FILE` (the token on its first line, or a job file, whose `token` is read);
2. `$ELASTICRUN_TOKEN`;
3. the job file on this host (`elastic.driver.job_file`: 0600 in a 0700 folder, left by the
   job's earlier driver on this host, even one that was killed);
4. the user's terminal: a prompt that does not echo, when standard input is a terminal.

Without any of these, `TokenMissing` says, in one line, how to give it. The first two also
give a new job its token (it is then known before the job starts, on every host the operator
chooses); without them a new job makes a random one.
"""

from __future__ import annotations

import getpass
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.job_file import SUFFIX, runtime_dir

TOKEN_VARIABLE = "ELASTICRUN_TOKEN"
MIN_LENGTH = 32
"""The shortest token accepted from the operator: a reader of etcd can test guesses offline."""
_TOKEN = re.compile(r"[\x21-\x7e]+")  # visible ASCII: it travels in an HTTP header
HOW = f"give it with --token-file FILE or ${TOKEN_VARIABLE}"


class TokenMissing(LaunchError):
    """No token was given and none can be found or asked for; the message says how to give
    one."""


@dataclass(frozen=True)
class GivenToken:
    """A job token and where it came from (for messages: never the token itself)."""

    token: str = field(repr=False)
    source: str


def _checked(text: str, source: str) -> GivenToken:
    token = text.strip()
    if not _TOKEN.fullmatch(token):
        raise UsageError(f"{source}: the token must be visible ASCII characters, no spaces")
    if len(token) < MIN_LENGTH:
        raise UsageError(
            f"{source}: a token of {len(token)} characters is too easy to guess; use "
            f"{MIN_LENGTH} or more (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return GivenToken(token, source)


def _from_file(path: str) -> GivenToken:
    source = f"--token-file {path}"
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UsageError(f"{source}: cannot read it: {err.strerror or err}") from None
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if isinstance(found, dict) and isinstance(found.get("token"), str):
        return _checked(found["token"], source)  # a job file
    lines = text.strip().splitlines()
    return _checked(lines[0] if lines else "", source)


def given_token(token_file: str | None, environ: Mapping[str, str]) -> GivenToken | None:
    """The token the operator gave: `--token-file`, else `$ELASTICRUN_TOKEN`, else None.
    Raises `UsageError` (one line) for a file that cannot be read, or a token that is not
    visible ASCII or is shorter than `MIN_LENGTH`."""
    if token_file is not None:
        return _from_file(token_file)
    if environ.get(TOKEN_VARIABLE):
        return _checked(environ[TOKEN_VARIABLE], f"${TOKEN_VARIABLE}")
    return None


def _from_job_file(job_id: str, folder: Path) -> GivenToken | None:
    """The token in this host's job file of `job_id`, whether its driver runs or not."""
    path = folder / f"{job_id}{SUFFIX}"
    try:
        found = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("job_id") != job_id:
        return None
    token = found.get("token")
    return GivenToken(token, f"the job file {path}") if isinstance(token, str) else None


def _ask_terminal(job_id: str) -> str | None:
    """The token typed at the terminal (not echoed), or None when stdin is no terminal."""
    if not sys.stdin.isatty():
        return None
    try:
        return getpass.getpass(f"job {job_id}'s token (not echoed): ")
    except (EOFError, KeyboardInterrupt):
        return None


def find_token(
    job_id: str,
    given: GivenToken | None,
    wanted_for: str,
    *,
    folder: Path | None = None,
    ask: Callable[[str], str | None] = _ask_terminal,
) -> GivenToken:
    """Job `job_id`'s token: `given`, else this host's job file (in `folder`, default the
    runtime folder), else what `ask(job_id)` returns (the terminal). Raises `TokenMissing`,
    whose line says the token is needed `wanted_for` ("to take it up") and how to give it.
    Blocks while it asks: call it off the event loop."""
    if given is not None:
        return given
    folder = folder or runtime_dir()
    if (found := _from_job_file(job_id, folder)) is not None:
        return found
    typed = ask(job_id)
    if typed and typed.strip():
        return GivenToken(typed.strip(), "the terminal")
    raise TokenMissing(
        f"job {job_id}'s token is needed {wanted_for}, and etcd does not hold it: {HOW} "
        f"(the job file {job_id}{SUFFIX} in {folder} on the host where its driver ran holds "
        "it), or run this from a terminal to type it"
    )
