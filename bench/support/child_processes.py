"""A benchmark's child processes: their environment and how many files they may open."""

from __future__ import annotations

import os

from bench.support.paths import ROOT


def child_env() -> dict[str, str]:
    """The environment of a benchmark's child process: this checkout first on the path."""
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        "GRPC_VERBOSITY": "ERROR",
    }


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process' open-file limit (RLIMIT_NOFILE) to its hard limit; return the
    soft and hard limits it had. Thousands of workers' gRPC streams and HTTP connections each
    take a descriptor in the driver and in the client processes."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard
