"""graphmodule: run PyTorch code as CUDA graphs with one line, and never silently wrong.

>>> from graphmodule import CudaGraphModule
>>> policy = CudaGraphModule(my_policy)  # doctest: +SKIP

Modules, one concept each:

- ``_module``: ``CudaGraphModule``, the state machine (warmup → capture → replay).
- ``_options``: its options (a frozen dataclass) and state (an enum).
- ``_entry``: one captured graph as one value, and the replay path every call takes.
- ``_record``: capturing a call, from its arguments to an entry (the cold path).
- ``_tree``: flattening inputs (optree for containers, TensorDicts by key): hot.
- ``_spec``: ``InputSpec``, the captured signature and the per-call match: hot.
- ``_explain``: what differs when a call does not match: cold.
- ``_inputs``: static input buffers, aliased as the caller's inputs were.
- ``_effects``: writes to inputs and containers, replayed onto the caller's objects.
- ``_outputs``: how the graph's buffers become the call's result.
- ``_stale``: what the graph reads from outside its inputs, checked each call.
- ``_grad``: graphs as layers: the backward graph, and the autograd node outputs join.
- ``_mode``: grad mode, train/eval, interaction type: part of the signature.
- ``_capture``: the only module that touches CUDA graphs (and its CPU stand-ins).
- ``_diagnose``: the likely cause of a failed capture.
- ``_distributed``: graphs beside ``torch.distributed``: released before their process group
  goes; the rules of capturing a DDP step.
- ``_dispatch``: TensorDict keys, calling conventions, keyword order.
- ``_paths``: names of places in a call, for messages.
- ``_errors``, ``_stats``: what users catch and read.
- ``_native``: the compiled hot path (opt-in: ``GRAPHMODULE_NATIVE=1`` or ``enable_native()``).
"""

import os as _os

from ._errors import (
    CaptureError,
    GraphModuleError,
    GraphStateError,
    InputMismatchError,
    Mismatch,
    MissingKeyError,
    RequiresGradError,
    StaleGraphError,
    UnsupportedError,
)
from ._module import CudaGraphModule
from ._native import enable_native, native_enabled
from ._options import Options, State
from ._stats import GraphStats

__version__ = "0.2.0"

__all__ = [
    "CaptureError",
    "CudaGraphModule",
    "GraphModuleError",
    "GraphStateError",
    "GraphStats",
    "InputMismatchError",
    "Mismatch",
    "MissingKeyError",
    "Options",
    "RequiresGradError",
    "StaleGraphError",
    "State",
    "UnsupportedError",
    "__version__",
    "enable_native",
    "native_enabled",
]

if _os.environ.get("GRAPHMODULE_NATIVE", "") == "1":
    enable_native()
