"""An FSDP2 (``fully_shard``) train step as one CUDA graph, on every process.

    torchrun --nproc_per_node=N examples/fsdp_train_step.py [--steps 200] [--width 256 --depth 4 --batch 64]

Each Linear and the whole model are sharded with ``torch.distributed.fsdp.fully_shard``; each
process wraps its whole step (forward with the parameters' all-gathers, ``loss.backward()``
with the gradients' reduce-scatters, ``Adam(capturable=True).step()`` on its shards) in one
``CudaGraphModule`` and runs it beside an eager twin sharded the same way, on the same
batches: the losses and the shards must agree exactly.

What the wrapper needs around FSDP2:

- no more than the default ``warmup=2``: FSDP2 initializes itself lazily in its first
  forward, which must run eagerly (``warmup=1`` captured and matched eager too);
- a NCCL process group for CUDA tensors;
- ``capturable=True`` for the optimizer, which steps on the DTensor shards inside the graph;
- nothing at exit: the wrapper's graphs are released before ``destroy_process_group()``
  (or at interpreter exit), which NCCL needs to finalize its communicators.

Without CUDA it runs on gloo with simulated graphs (``--graph-backend simulate``), which
checks the wiring, not the speed.
"""

from __future__ import annotations

import copy
import os
import sys

if __package__ in (None, ""):  # run as a file: make ``examples`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from examples.common.distributed import Pair, Setup, finish, flags, init, mlp, train_step
from graphmodule import CudaGraphModule


def shard(model: nn.Sequential, setup: Setup) -> nn.Module:
    """Each Linear, then the whole model, sharded over all processes."""
    mesh = init_device_mesh(setup.device.type, (setup.world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main(argv: list[str] | None = None) -> dict:
    args = flags(__doc__.splitlines()[0], warmup=2).parse_args(argv)
    setup = init(args.graph_backend)
    model = mlp(args.width, args.depth, setup.device)
    graphed_model, eager_model = shard(copy.deepcopy(model), setup), shard(model, setup)
    graphed = CudaGraphModule(train_step(graphed_model, setup.device), warmup=args.warmup,
                              backend=setup.graph_backend)
    return finish("FSDP2", setup, args, Pair(graphed, train_step(eager_model, setup.device), graphed_model, eager_model))


if __name__ == "__main__":
    main()
