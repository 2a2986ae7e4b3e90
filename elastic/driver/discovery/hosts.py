"""Host lists: parsing `-H` and hostfiles into ordered `HostSpec`s.

Two forms are accepted for each host, as in horovodrun: `hostname:slots` (in `-H`, in a
hostfile and in discovery output) and `hostname slots=N` (hostfile only). A host without a slot
count has one slot, and none has more than `MAX_SLOTS_PER_HOST`. Order is kept: ranks fill
hosts in the order given.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from elastic.driver.errors import UsageError
from elastic.protocol.notice import parse_notice_time

MAX_SLOTS_PER_HOST = 65_536
"""The most slots one host may have: far above any machine's accelerators or cores, and low
enough that a typo (or a hostile discovery script) cannot make the driver plan millions of
workers."""

_ENTRY = re.compile(
    r"(?P<name>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)"
    r"(?::(?P<slots>\S+)|\s+slots\s*=\s*(?P<slots_kv>\S+))?"
)


@dataclass(frozen=True)
class HostSpec:
    hostname: str
    slots: int
    # A preemption notice from discovery: when the host goes (Unix time; `math.inf`: soon,
    # no time given). Until then its workers leave and it gets no new ones.
    leaving_at: float | None = None


_NOTICE = re.compile(r"(?P<entry>.*?)\s+leaving(?:=(?P<when>\S*))?")


def split_notice(line: str, where: str) -> tuple[str, float | None]:
    """A discovery line's host entry and its notice: `host:slots leaving` (the host is being
    taken away, no time known: `math.inf`) or `host:slots leaving=T` (it goes at T: Unix
    seconds, or ISO 8601 with a zone, `2026-11-24T08:00:00Z`); None without one. Raises
    `UsageError` naming `where` for a time that is neither."""
    match = _NOTICE.fullmatch(line.strip())
    if match is None:
        return line, None
    when = match.group("when")
    if when is None:
        return match.group("entry"), math.inf
    try:
        at = parse_notice_time(when)
    except ValueError as err:
        raise UsageError(f"{where}: notice time {err}") from None
    return match.group("entry"), at


def parse_host_entry(entry: str, where: str) -> HostSpec:
    """Parse `host`, `host:N` or `host slots=N`; raise `UsageError` naming `where` if malformed
    or if the name starts with `-` (which ssh, and other tools, would take for an option).

    IPv6 addresses are written in brackets: `[::1]:2`.
    """
    if entry.strip().startswith("-"):
        raise UsageError(
            f"{where}: host name {_shown(entry)} starts with '-' (ssh would read it as an "
            "option); no host name may"
        )
    match = _ENTRY.fullmatch(entry.strip())
    if not match:
        raise UsageError(
            f"{where}: malformed host entry {_shown(entry)} (expected host or host:slots)"
        )
    count = match.group("slots") or match.group("slots_kv") or "1"
    if count.isdecimal() and len(count.lstrip("0")) > len(str(MAX_SLOTS_PER_HOST)):
        slots = MAX_SLOTS_PER_HOST + 1  # too many digits to convert, and too many slots
    else:
        try:
            slots = int(count)
        except ValueError:
            raise UsageError(f"{where}: slot count in {_shown(entry)} is not a number") from None
    if slots < 1:
        raise UsageError(f"{where}: slot count in {_shown(entry)} must be at least 1")
    if slots > MAX_SLOTS_PER_HOST:
        raise UsageError(
            f"{where}: slot count in {_shown(entry)} must be at most {MAX_SLOTS_PER_HOST}"
        )
    return HostSpec(match.group("name").strip("[]"), slots)


def _shown(entry: str) -> str:
    """`entry` for a one-line message: quoted, and cut when it is long (a count of a million
    digits must not make a megabyte-long error line)."""
    entry = entry.strip()
    return repr(entry) if len(entry) <= 80 else repr(entry[:80]) + "..."


def merge_hosts(specs: list[HostSpec], where: str) -> list[HostSpec]:
    """Reject a host named twice (a likely typo that would double its slots)."""
    seen: set[str] = set()
    for spec in specs:
        if spec.hostname in seen:
            raise UsageError(f"{where}: host {spec.hostname!r} is listed more than once")
        seen.add(spec.hostname)
    return specs


def parse_host_list(text: str) -> list[HostSpec]:
    """Parse the `-H` value: comma-separated host entries."""
    entries = text.split(",")
    if not text.strip() or any(not e.strip() for e in entries):
        raise UsageError(f"-H: malformed host list {text!r} (expected host1:slots,host2:slots)")
    return merge_hosts([parse_host_entry(e, "-H") for e in entries], "-H")


def parse_host_lines(text: str, where: str, notices: bool = False) -> list[HostSpec]:
    """Parse one host entry per line; blank lines and `#` comments are ignored. `notices`
    (discovery output): a line may end with a preemption notice (`split_notice`)."""
    specs = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        here = f"{where} line {number}"
        entry, leaving_at = split_notice(line, here) if notices else (line, None)
        spec = parse_host_entry(entry, here)
        specs.append(replace(spec, leaving_at=leaving_at) if leaving_at is not None else spec)
    return merge_hosts(specs, where)


def read_hostfile(path: str) -> list[HostSpec]:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise UsageError(f"--hostfile: cannot read {path}: {err.strerror}") from None
    specs = parse_host_lines(text, f"hostfile {path}")
    if not specs:
        raise UsageError(f"hostfile {path} lists no hosts")
    return specs
