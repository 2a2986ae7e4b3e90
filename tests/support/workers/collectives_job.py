"""A worker that runs every collective on inputs derived from its rank and writes the results.

Run by `elasticrun`; `inputs(rank, size)` is also what the test uses to compute the expected
results in a single process. Usage: collectives_job.py OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import elastic.torch as hvd


def inputs(rank: int, size: int) -> dict[str, torch.Tensor]:
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    splits = [(rank + j) % 2 + 1 for j in range(size)]
    return {
        "x": base * (rank + 1) + rank - 1.5,
        "i": torch.arange(4, dtype=torch.int64) * (rank + 2) + rank,
        "rows": torch.full((rank + 1, 2), float(rank)),
        "splits": torch.tensor(splits, dtype=torch.int32),
        "a2a": rank * 100 + torch.arange(sum(splits), dtype=torch.float32),
        "b": torch.arange(5, dtype=torch.float32) + 10 * rank,
    }


def run(out: Path) -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    data = inputs(rank, size)
    x = data["x"]
    results: dict[str, object] = {}
    for name, op in [
        ("average", hvd.Average),
        ("sum", hvd.Sum),
        ("min", hvd.Min),
        ("max", hvd.Max),
        ("product", hvd.Product),
    ]:
        results[name] = hvd.allreduce(x, op=op).tolist()
    results["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    results["int_sum"] = hvd.allreduce(data["i"], op=hvd.Sum)
    inplace = x.clone()
    hvd.allreduce_(inplace, op=hvd.Sum)
    results["inplace_sum"] = inplace
    results["grouped"] = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)
    handle = hvd.allreduce_async(x, op=hvd.Max)
    hvd.barrier()
    assert hvd.poll(handle) in (True, False)
    results["async_max"] = hvd.synchronize(handle)
    results["allgather"] = hvd.allgather(data["rows"])
    output, received = hvd.alltoall(data["a2a"], splits=data["splits"])
    results["alltoall"], results["alltoall_splits"] = output, received
    results["broadcast"] = hvd.broadcast(data["b"], root_rank=size - 1)
    handle = hvd.broadcast_async_(data["b"].clone(), root_rank=0)
    results["broadcast_async_inplace"] = hvd.synchronize(handle)
    results["object"] = hvd.broadcast_object({"from": rank, "tag": "root"}, root_rank=size - 1)
    results["objects"] = hvd.allgather_object(("rank", rank))
    results["coords"] = [rank, size, hvd.local_rank(), hvd.local_size(),
                         hvd.cross_rank(), hvd.cross_size()]  # fmt: skip
    plain = {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in results.items()}
    plain["grouped"] = [t.tolist() for t in results["grouped"]]  # type: ignore[union-attr]
    (out / f"rank.{rank}.json").write_text(json.dumps(plain))
    print(f"collectives done rank={rank}")
    hvd.shutdown()


if __name__ == "__main__":
    run(Path(sys.argv[1]))
