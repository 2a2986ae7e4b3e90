"""Preemption notices: when a host goes, as discovery lines and preemption checks write it."""

from __future__ import annotations

import math
from datetime import datetime


def parse_notice_time(text: str) -> float:
    """`text` as Unix seconds: a number, or ISO 8601 with a zone (`2026-11-24T08:00:00Z`).
    Raises `ValueError` saying why for anything else (no zone, not finite)."""
    try:
        at = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            raise ValueError(
                f"{_shown(text)} is neither Unix seconds nor ISO 8601 with a zone "
                "(2026-11-24T08:00:00Z)"
            ) from None
        at = parsed.timestamp()
    if not math.isfinite(at) or at <= 0:
        raise ValueError(f"{_shown(text)} is not a time")
    return at


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:80]) + "..."
