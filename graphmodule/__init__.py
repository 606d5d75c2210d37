"""graphmodule: run PyTorch code as CUDA graphs with one line, and never silently wrong.

>>> from graphmodule import CudaGraphModule
>>> policy = CudaGraphModule(my_policy)  # doctest: +SKIP

Modules, one concept each:

- ``_module``: ``CudaGraphModule``, the state machine (warmup → capture → replay).
- ``_tree``: flattening inputs (optree for containers, TensorDicts by key).
- ``_spec``: ``InputSpec``, the captured signature and the per-call check.
- ``_buffers``: static input buffers, effects on inputs, outputs.
- ``_capture``: the only module that touches CUDA graphs (and its CPU stand-ins).
- ``_dispatch``: TensorDict keys and calling conventions.
- ``_errors``, ``_stats``: what users catch and read.
"""

from ._errors import (
    CaptureError,
    GraphModuleError,
    GraphStateError,
    InputMismatchError,
    Mismatch,
    RequiresGradError,
)
from ._module import CudaGraphModule
from ._stats import GraphStats

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "CudaGraphModule",
    "GraphModuleError",
    "GraphStateError",
    "GraphStats",
    "InputMismatchError",
    "Mismatch",
    "RequiresGradError",
    "__version__",
]
