"""Which collectives Gloo runs on CUDA tensors in this torch build, each in a fresh pair of
spawned processes (a crash costs one line, not the run): the several-ranks-on-one-GPU mode
that tests/gpu/test_sharded_gpu.py relies on. Prints one line per collective and writes
them as JSON.

    python tests/gpu/probe_gloo_cuda.py [OUT.json]
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import traceback
from datetime import timedelta

PROBES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "fsdp2_step",
)


def _probe(name: str, rank: int, store_path: str, queue: multiprocessing.Queue) -> None:
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.set_device(0)
        store = dist.FileStore(store_path, 2)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30)
        )
        dev = torch.device("cuda", 0)
        t = torch.full((8,), float(rank + 1), device=dev)
        if name == "all_reduce":
            dist.all_reduce(t)
            ok = t.cpu().tolist() == [3.0] * 8
        elif name == "broadcast":
            dist.broadcast(t, 0)
            ok = t.cpu().tolist() == [1.0] * 8
        elif name == "all_gather":
            out = [torch.empty_like(t) for _ in range(2)]
            dist.all_gather(out, t)
            ok = [o[0].item() for o in out] == [1.0, 2.0]
        elif name == "all_gather_into_tensor":
            out = torch.empty(16, device=dev)
            dist.all_gather_into_tensor(out, t)
            ok = out.cpu().tolist() == [1.0] * 8 + [2.0] * 8
        elif name == "reduce_scatter_tensor":
            out = torch.empty(4, device=dev)
            dist.reduce_scatter_tensor(out, t)
            ok = out.cpu().tolist() == [3.0] * 4
        else:
            from torch import nn
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cuda", (2,))
            model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)).to(dev)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters())
            model(torch.ones(4, 8, device=dev)).sum().backward()
            opt.step()
            torch.cuda.synchronize()
            ok = True
        dist.destroy_process_group()
        queue.put((rank, "ok" if ok else "wrong result"))
    except BaseException:
        queue.put((rank, traceback.format_exc(limit=3).strip().splitlines()[-1]))


def run(name: str) -> str:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_probe, args=(name, r, store_path, queue)) for r in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(45)
        outcomes = {}
        while not queue.empty():
            rank, what = queue.get()
            outcomes[rank] = what
        for r, p in enumerate(procs):
            if p.is_alive():
                p.kill()
                outcomes.setdefault(r, "still running after 45 s")
            elif r not in outcomes:
                outcomes[r] = f"exited with code {p.exitcode}"
    if all(v == "ok" for v in outcomes.values()):
        return "ok"
    return "; ".join(f"rank {r}: {outcomes[r]}" for r in sorted(outcomes))


def main() -> None:
    results = {}
    for name in PROBES:
        results[name] = run(name)
        print(f"gloo on cuda tensors: {name}: {results[name]}", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
