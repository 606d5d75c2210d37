"""Memory of k graphs sharing one pool, against k separate wrappers (one pool each).

A 4-layer MLP is captured for k batch sizes, either by one wrapper with ``max_graphs=k``
(one memory pool for all its graphs) or by k wrappers. The device memory reserved and
allocated after the captures, minus before, is printed for both, and the pool size that
``stats.pool_bytes`` reports.

    python benchmarks/memory.py [--k 4] [--out DIR]        # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from graphmodule import CudaGraphModule  # noqa: E402

BATCHES = (256, 512, 1024, 2048, 4096, 8192)


def measure(k: int, shared: bool) -> dict:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                        nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 16)).cuda()
    inputs = [torch.randn(b, 256, device="cuda") for b in BATCHES[:k]]
    torch.cuda.synchronize()
    before = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
    if shared:
        wrappers = [CudaGraphModule(net, warmup=1, max_graphs=k)] * k
    else:
        wrappers = [CudaGraphModule(net, warmup=1) for _ in range(k)]
    with torch.no_grad():
        for g, x in zip(wrappers, inputs):
            for _ in range(3):
                g(x)
    torch.cuda.synchronize()
    after = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated())
    pools = sum({id(g): g.stats.pool_bytes for g in wrappers}.values())
    out = {"k": k, "shared": shared, "reserved_mib": (after[0] - before[0]) / 2**20,
           "allocated_mib": (after[1] - before[1]) / 2**20, "pool_mib": pools / 2**20,
           "graphs": sum({id(g): g.stats.graphs for g in wrappers}.values())}
    del wrappers
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("memory.py needs a CUDA GPU; nothing measured.")
        return 0
    rows = [measure(args.k, shared) for shared in (True, False)]
    print(f"| {args.k} graphs of a 4-layer MLP (batch {', '.join(map(str, BATCHES[:args.k]))}) | "
          "reserved MiB | allocated MiB | pool MiB (stats.pool_bytes) |")
    print("|---|---|---|---|")
    for r in rows:
        name = "one wrapper, max_graphs=k (one pool)" if r["shared"] else "k wrappers (k pools)"
        print(f"| {name} | {r['reserved_mib']:.1f} | {r['allocated_mib']:.1f} | {r['pool_mib']:.1f} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "memory.json"), "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
