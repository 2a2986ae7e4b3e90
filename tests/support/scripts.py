"""Scripts a test writes for a job to run (workers, discovery scripts, checks)."""

from __future__ import annotations

from pathlib import Path


def write_script(directory: Path, name: str, body: str) -> Path:
    """Write `body` to `directory/name`; return its path."""
    path = directory / name
    path.write_text(body)
    return path
