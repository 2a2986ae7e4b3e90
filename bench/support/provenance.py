"""What a benchmark's JSON records about the code measured, the machine's load around it, and
the command that runs it again."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.support.paths import ROOT


def git_state() -> dict[str, Any]:
    """The commit measured, and the files that differ from it (the code may be in flux)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "changed": git("status", "--short").splitlines()}


def load_averages(before: tuple[float, float, float]) -> dict[str, list[float]]:
    """The 1, 5 and 15 minute load averages `before` (`os.getloadavg()` at the start) and now."""
    return {
        "before": [round(x, 2) for x in before],
        "after": [round(x, 2) for x in os.getloadavg()],
    }


def command_line(name: str, argv: list[str] | None) -> str:
    """The command that runs benchmark `name` again with `argv` (this process' own arguments
    when None): `python -m bench run NAME ARGS...`, quoted for a shell."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", "bench", "run", name, *args])


def device_name(device: str) -> str:
    """ "cpu", or the GPU's model name for a CUDA device."""
    if not device.startswith("cuda"):
        return device
    import torch

    return torch.cuda.get_device_name()


def write_document(out: Path, document: dict[str, Any], summary: dict[str, Any]) -> None:
    """Write a benchmark's JSON `document` to `out` (its folder made) and print its
    `summary`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, default=str))
    print(json.dumps(summary, indent=2), flush=True)
