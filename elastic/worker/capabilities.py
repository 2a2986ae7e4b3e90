"""What this build offers, under Horovod's names: the `*_built()` and `*_enabled()` checks
scripts make before choosing a code path, and the parts that elasticrun does not offer
(MPI, the timeline), which say what to use instead."""

from __future__ import annotations

import torch
import torch.distributed as dist

from elastic.worker.context import current

__all__ = [
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "is_homogeneous",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rocm_built",
    "start_timeline",
    "stop_timeline",
]


def nccl_built() -> int:
    """NCCL's version code (e.g. 22105 for 2.21.5) when torch has NCCL, else 0 (Horovod's)."""
    if not dist.is_nccl_available():
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()[:3]
    except (RuntimeError, TypeError, ValueError):
        return 1  # built with NCCL, version unknown
    return major * 10000 + minor * 100 + patch


def gloo_built() -> bool:
    """True: collectives on CPU tensors go through torch's Gloo."""
    return dist.is_gloo_available()


def gloo_enabled() -> bool:
    """True: elasticrun runs every job over Gloo (and NCCL for CUDA tensors), never MPI."""
    return dist.is_gloo_available()


def mpi_built() -> bool:
    """False: elasticrun does not use MPI."""
    return False


def mpi_enabled() -> bool:
    """False: elasticrun does not use MPI."""
    return False


def mpi_threads_supported() -> bool:
    """False: there is no MPI, so no MPI threading either."""
    return False


def ccl_built() -> bool:
    """False: oneCCL is not used."""
    return False


def ddl_built() -> bool:
    """False: IBM DDL is not used."""
    return False


def cuda_built() -> bool:
    """Whether the installed torch was built with CUDA."""
    return torch.backends.cuda.is_built()


def rocm_built() -> bool:
    """Whether the installed torch was built for ROCm."""
    return torch.version.hip is not None


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks in the current round."""
    ctx = current("hvd.is_homogeneous")
    return ctx.slot.local_size * ctx.slot.cross_size == ctx.size


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Not offered: Horovod's timeline file format is specific to its background thread."""
    raise NotImplementedError(
        "hvd.start_timeline is not offered by elasticrun: record collectives with "
        "torch.profiler.profile() (its Chrome trace shows each torch.distributed call)"
    )


def stop_timeline() -> None:
    """Not offered (see `start_timeline`)."""
    start_timeline("")
