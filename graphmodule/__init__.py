"""graphmodule: run PyTorch code as CUDA graphs with one line, and never silently wrong.

>>> from graphmodule import CudaGraphModule
>>> policy = CudaGraphModule(my_policy)  # doctest: +SKIP

Modules, one concept each:

- ``_module``: ``CudaGraphModule``: its construction, the hot path of a call and the slow
  path's choice (warmup, a new signature, a refusal).
- ``_lifecycle``: its life cycle as a table: ``State`` (warmup → captured, failed, eager), the
  ``Phase`` behind it (in eager, why: no CUDA, ``backend="eager"``, a failed capture), the
  events that move it and every transition (one not in the table raises).
- ``_capturing``: the slow path's ends: a capture and what its outcome does to the life cycle
  (a graph, a failure that raises or runs eagerly), a stale graph dropped.
- ``_surface``: what a wrapper shows besides calls: ``state``, ``stats``, ``graph``,
  ``pool``, ``explain()``, ``debug_dump()``, tensordict's attributes, ``repr``, copies.
- ``_options``: its options (a frozen dataclass).
- ``_graphs``: the graphs a wrapper holds, and the slow path's work on them: finding a
  call's graph, warmup calls (counted there only, per signature: ``Warming``), capturing,
  capturing again, dropping stale and evicted ones.
- ``_index``: which graph a call of another signature matched last (several graphs held).
- ``_variants``: which calls get a graph of their own by default (``max_graphs=None``): those
  that differ from the held graphs only in Python values and modes, up to 8.
- ``_entry``: one captured graph as one value; ``decide``, whether a call replays it (the
  one decision every path takes); the replay path (``_run``: a graph's replay laid out once
  for the common calls: one result, or a TensorDict module's writes).
- ``_eager``: a signature served without a graph (no CUDA, or a failed capture), in a graph's
  place; without CUDA, checked by a simulated capture of its first call, so that it is refused
  where a GPU's graph would be, with the same messages.
- ``_record``: capturing a call, from its arguments to an entry (the cold path).
- ``_tree``: flattening inputs (optree for containers; a TensorDict is a slot), and the
  ``Layout`` that reads a later call's leaves in the captured order: hot.
- ``_slots``: a TensorDict (or tensorclass) among the inputs, read by key (exactly, or the
  keys a TensorDict module reads): its captured structure and the reader chosen then: hot.
- ``_spec``: ``InputSpec``, the captured signature (``TensorFacts``, constants, modes) and
  the per-call match: hot.
- ``_explain``: what differs when a call does not match, and ``explain()``'s text: cold.
- ``_refuse``: the input checks that refuse a call beyond its signature: before a capture
  (one function for the graph and the eager paths) and at each call of a graph that depends
  on more (aliasing, strides, nested TensorDicts, inference and expanded inputs).
- ``_inputs``: static input buffers, aliased as the caller's inputs were.
- ``_materialized``: the input tree handed to the function at capture, and where each of its
  objects sits in a call (``Ref``), found again in a later call (``resolve``).
- ``_effects``: writes to inputs and containers, replayed onto the caller's objects.
- ``_rebind``: what a call rebinds outside its arguments (``.grad``, attributes): found at
  capture, bound again after each replay, what each call must find watched (``_gradwatch``:
  the ``.grad`` a graph reads, checked at each call).
- ``_outputs``: how the graph's buffers become the call's result (``_recipes``: the typed
  records saying where each part of it comes from).
- ``_graphentry``: ``GraphEntry``, what every entry among a wrapper's graphs offers (a
  captured graph, ``_entry``, or a signature served eagerly, ``_eager``), and ``Outputs``, what
  serves an entry's calls.
- ``_signature``: ``Signature``, the graphs of one signature: a graph's twins and output sets,
  the hot path's choice of the set a call replays, and the captures again the state machine
  asks for; ``_outputsets``: that state machine of ``outputs="safe"`` (lent results, twins,
  copies), pure (``_lend``: lending the buffers; ``_twin``: a twin's own buffers).
- ``_policy``: ``outputs=`` as a value (``OutputPolicy``) and the one function that plans
  each capture from it (``plan_capture``: results copied, lent now or later, the graph's
  memory its own or beside another graph's), a frozen ``CapturePlan`` the others read.
- ``_discover``: what the graph reads from outside its inputs, found at capture
  (``_reads``: the attribute chains code reads off ``self``, its globals and closure
  variables, found in its bytecode; ``_places``: watched places other than a container entry,
  and the Python values watched by value; ``_pyeffects``: the Python state a function
  changes, refused at capture).
- ``_stale``: the check, at every call, that what it reads is unchanged
  (``_dictwatch``: the dict watchers that let it skip what did not change).
- ``_hooks``: hooks, whose Python a replay would not run: what they read, the hooks served
  without a run (``pure``), ``allow_hook`` (``_hookeffects``: each hook judged at capture by
  what it changes, served or refused naming it; ``_hookdicts``: the hook dicts a call runs, its
  modules', parameters' and optimizers', and the watch that they hold the captured hooks).
- ``_grad``: graphs as layers: the backward graph, and the autograd node outputs join.
- ``_gradtrace``: what a call did with autograd, read around its capture: the inputs it
  tracks, the autograd nodes behind its outputs, whether it ran backward itself (a train step).
- ``_optim``: optimizers the function steps, made capturable before their first step (as
  torch.compile does) where exact; the cause and the fix where not.
- ``_mode``: grad mode, train/eval, interaction type, autocast, inference mode, default dtype,
  deterministic algorithms: part of the signature.
- ``_runners``: the runner protocol the wrapper calls (run eagerly, capture, replay,
  release, the pool, the streams; what a runner has beyond it comes back as values in the
  ``CaptureResult``) and the eager runner. ``_runner_cuda``: the CUDA runner, the only code
  that touches CUDA graphs, streams and pools; ``_runner_simulate``: the simulated runner;
  ``_backend``: the runner a backend name asks for; ``_scope``: what captures share in the
  process (``SCOPE``: which thread captures, one capture at a time, the pools in use).
- ``_simulate``: the simulated graph: the tensor operations a capture dispatched, replayed
  with no Python, as a GPU replays its kernels; host syncs refused as CUDA refuses them.
- ``_diagnose``: the likely cause of a failed capture.
- ``_distributed``: graphs beside ``torch.distributed``: released before their process group
  goes; the rules of capturing a DDP step.
- ``_dispatch``: TensorDict keys, calling conventions (``TensorDictCalls``: a TensorDict
  module's call styles, chosen at construction), keyword order.
- ``_paths``: names of places in a call, for messages.
- ``_errors``, ``_stats``: what users catch and read (``MismatchKind``: each kind of
  mismatch with its advice).
"""

from ._errors import (
    CaptureError,
    GraphModuleError,
    GraphStateError,
    InputMismatchError,
    Mismatch,
    MismatchKind,
    MissingKeyError,
    RequiresGradError,
    StaleGraphError,
    UnsupportedError,
)
from ._hooks import allow_hook
from ._module import CudaGraphModule
from ._lifecycle import State
from ._options import Options
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
    "MismatchKind",
    "MissingKeyError",
    "Options",
    "RequiresGradError",
    "StaleGraphError",
    "State",
    "UnsupportedError",
    "__version__",
    "allow_hook",
]
