"""The simulated graph of ``backend="simulate"``: a replay that runs no Python, as a GPU's.

A CUDA graph replays the kernels its capture launched, on the same memory, with the values
the capture baked in, and runs none of the function's Python. The simulator does the same
on any device. During the capture a ``TorchDispatchMode`` (below autograd, so a backward
inside the function is recorded too, as its aten operations) records each tensor operation
the function dispatches, with its arguments; a replay runs those operations only, on the
same tensor objects (the capture's memory), with the Python values they had at capture:

- an operation that made a new tensor computes it again and writes it into the captured
  tensor's memory, so that later operations and the graph's results read the same objects;
- views (outputs the operation's schema says alias an input) and allocations (``empty``)
  are skipped: the captured object already views that memory, as a graph's kernels do;
- in-place and ``out=`` operations run again as recorded; random ones draw fresh numbers
  from their generator, as a graph's random offset advances at each replay;
- what makes the host wait for the device (``.item()``, ``if tensor:``, ``torch.equal``,
  ``nonzero``, boolean-mask indexing) is refused at capture, as a CUDA capture refuses it:
  on the simulator every tensor stands for a device tensor (``torch.equal`` answered from
  sizes and memory alone, as CUDA answers it, is served);
- a capture that fails leaves the memory the function wrote as it was (a CUDA capture
  records kernels without running them): what existed before is saved at its first write;
- a function compiled with ``torch.compile`` is recorded as its eager operations (its
  kernels dispatch none): values as the compiled kernels' up to the last bits.

>>> import torch
>>> graph = record(lambda: torch.ones(2) * 3)
>>> graph.out
tensor([3., 3.])
>>> graph.replay()  # runs aten.ones and aten.mul into the same tensor
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, NamedTuple

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ._lend import by_address

__all__ = ["HOST_SYNC", "Op", "SimulatedGraph", "excusing_optimizer_syncs", "record"]

aten = torch.ops.aten

# the error a CUDA capture gives where the host waits for the device (``_diagnose`` names its cause)
HOST_SYNC = ("operation not permitted when stream is capturing (refused as by a CUDA capture: this "
             "operation makes the host wait for the device)")

# operations whose result the host reads: a device tensor's value must reach the host
_READS_ON_HOST = {
    "aten::_local_scalar_dense",  # .item(), float(t), `if t:`, print
    "aten::equal",
    "aten::nonzero",  # and argwhere, nonzero_numpy (data-dependent shapes)
    "aten::masked_select",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::unique_dim_consecutive",
    "aten::bincount",
}
# boolean masks among the indices: the kernel turns them into positions (nonzero) on the host
_MASK_INDEXED = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_", "aten::_unsafe_index",
                 "aten::_unsafe_index_put"}
# allocations: a replay leaves their memory as it is (what fills it is recorded after them)
_ALLOCATIONS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                "aten::new_empty_strided", "aten::empty_permuted"}


class Op(NamedTuple):
    """One recorded operation: ``func(*args, **kwargs)``, and where its new tensors go."""

    func: Any  # an OpOverload
    args: tuple
    kwargs: dict
    # (position among the result's tensors, the captured tensor) of each tensor it made anew:
    # a replay writes the fresh result there
    made: tuple


class SimulatedGraph:
    """The operations a capture recorded, and what the captured function returned.

    ``replay()`` runs them in order; ``release()`` drops them and the memory they hold
    (a graph keeps its pool's memory until it is released too)."""

    __slots__ = ("ops", "out", "freed")

    def __init__(self, ops: list[Op], out: Any, freed: list[tuple[Any, int, int]] = ()) -> None:
        self.ops, self.out = ops, out
        # memory the function freed by hand after using it (FSDP's all-gather buffers:
        # storage.resize_(0)), as (storage, bytes while used, bytes at the end): a graph's
        # kernels keep their addresses in its pool; a replay gives it back while it runs
        self.freed = list(freed)

    def replay(self) -> None:
        for storage, used, _ in self.freed:
            storage.resize_(used)
        # below autograd and autocast, as kernels are: no autograd graph, no version bumps, no
        # casts the capture did not record (those it did are among the operations)
        with torch._C._AutoDispatchBelowADInplaceOrView(), torch._C._DisableAutocast():
            for func, args, kwargs, made in self.ops:
                result = func(*args, **kwargs)
                if made:
                    fresh = tree_leaves(result)
                    for position, captured in made:
                        captured.copy_(fresh[position])
        for storage, _, end in self.freed:
            storage.resize_(end)

    def release(self) -> None:
        self.ops, self.freed = [], []
        self.out = None


def _storage(t: Any) -> Any:
    """The memory of a plain tensor (``None`` for anything else: a wrapper subclass such as
    DTensor has none of its own, its local tensors do)."""
    if not isinstance(t, torch.Tensor):
        return None
    try:
        storage = t.untyped_storage()
        storage.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return storage


def _in_engine() -> bool:
    """Whether the operation comes from C++ code the autograd engine runs (DDP's reducer reading
    its bookkeeping, host tensors on a GPU too), not from Python: the innermost Python frame
    outside torch's dispatch wrappers is the engine's entry."""
    frame = sys._getframe(2)
    while frame is not None and any(part in frame.f_code.co_filename for part in _WRAPPERS):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_name == "_engine_run_backward"


_WRAPPERS = (os.path.join("torch", "_dynamo", ""), os.path.join("torch", "_compile.py"),
             os.path.join("torch", "utils", "_python_dispatch"))


def _equal_on_metadata(args: tuple) -> bool | None:
    """``torch.equal``'s answer where CUDA gives it without the device (``cuda_equal``): other
    sizes, no elements, or the same memory seen the same way (True, NaNs or not); else None."""
    a, b = args[0], args[1]
    if a.dtype != b.dtype or a.device != b.device:
        return None  # (torch's own error, or the refusal)
    if a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    sa, sb = _storage(a), _storage(b)
    if (sa is not None and sb is not None and sa.data_ptr() == sb.data_ptr()
            and a.storage_offset() == b.storage_offset()
            and a.stride() == b.stride() and a.layout == b.layout and a.is_neg() == b.is_neg()
            and a.is_conj() == b.is_conj()):
        return True
    return None


def _masked(args: tuple) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices or ())


class _Recorder(TorchDispatchMode):
    """Records the tensor operations run inside it (see :func:`record`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Op] = []
        # the memory the function writes that existed before it, as it was: a failed capture
        # leaves it so (a CUDA capture records its kernels without running them)
        self.saved: dict[int, tuple[Any, Any]] = {}
        self.new: set[int] = set()  # memory the capture allocated
        self.used: dict[int, tuple[Any, int]] = {}  # each storage an operation used, its largest size then

    def freed(self) -> list[tuple[Any, int, int]]:
        """Storages smaller now than when an operation used them (see ``SimulatedGraph.freed``)."""
        return [(storage, used, storage.nbytes()) for storage, used in self.used.values() if storage.nbytes() < used]

    def _use(self, tensors: Any) -> None:
        for t in tensors:
            storage = _storage(t)
            if storage is not None:
                key, size = storage.data_ptr(), storage.nbytes()
                if size and self.used.get(key, (None, 0))[1] < size:
                    self.used[key] = (storage, size)

    def restore(self) -> None:
        """Put back what the function wrote into memory it did not allocate."""
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for storage, before in self.saved.values():
                if storage.nbytes() != before.nbytes():  # (freed or grown since: FSDP's all-gather buffers)
                    storage.resize_(before.nbytes())
                storage.copy_(before)
        self.saved.clear()

    def _allocated(self, tensors: Any) -> None:
        for t in tensors:
            storage = _storage(t)
            if storage is not None:
                self.new.add(storage.data_ptr())

    def _save(self, schema: Any, args: tuple, kwargs: dict) -> None:
        for arg in schema.arguments:
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = kwargs.get(arg.name) if arg.kwarg_only or arg.name in kwargs else None
            if value is None and not arg.kwarg_only:
                index = schema.arguments.index(arg)
                value = args[index] if index < len(args) else None
            for t in tree_leaves(value):
                storage = _storage(t)
                key = storage.data_ptr() if storage is not None else None
                if storage is not None and key not in self.saved and key not in self.new and storage.nbytes():
                    self.saved[key] = (storage, storage.clone())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        name = schema.name
        if name == "aten::equal" and _equal_on_metadata(args) is not None:
            return _equal_on_metadata(args)  # (no device read on CUDA either)
        if (name in _READS_ON_HOST or (name in _MASK_INDEXED and _masked(args))) and not (
                _in_engine() or getattr(_EXCUSED, "steps", 0)):
            raise RuntimeError(HOST_SYNC)
        if schema.is_mutable:
            self._save(schema, args, kwargs)
        result = func(*args, **kwargs)
        if name in _ALLOCATIONS:
            self._allocated(tree_leaves(result))
            return result
        made = _made(schema, result, args, kwargs)
        self._allocated(t for _, t in made)
        if made or schema.is_mutable:
            self._use(tree_leaves((args, kwargs)))
            self.ops.append(Op(_waited(func) if func.namespace == "c10d" else func, args, kwargs, made))
        # (else a view, or a query of metadata: the capture's result stands at every replay)
        return result


_EXCUSED = threading.local()  # steps: optimizer steps of this thread running now whose host syncs are excused


def excusing_optimizer_syncs(body: Callable[[], Any]) -> Callable[[], Any]:
    """``body``, with the host syncs inside optimizer steps not refused while it is recorded.

    For the checks without CUDA (``_eager``): on a GPU the wrapper makes a plain optimizer
    capturable before its first step (``_optim``), which torch refuses for CPU tensors, so
    the step counts a plain CPU step reads on the host say nothing of what a GPU refuses."""

    def excused() -> Any:
        thread = threading.get_ident()

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            if threading.get_ident() == thread:
                _EXCUSED.steps = getattr(_EXCUSED, "steps", 0) + 1

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            if threading.get_ident() == thread:
                _EXCUSED.steps -= 1

        handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
        try:
            return body()
        finally:
            for handle in handles:
                handle.remove()
            _EXCUSED.steps = 0

    return excused


def _waited(func: Any) -> Callable[..., Any]:
    """A collective (``c10d``) that a replay waits for, as the function did after it at capture:
    on a CPU its work is asynchronous (gloo), where a graph's is ordered on the stream."""

    def run(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        for leaf in tree_leaves(result):
            if isinstance(leaf, torch.ScriptObject) and hasattr(leaf, "wait"):
                leaf.wait()
        return result

    return run


def _made(schema: Any, result: Any, args: tuple, kwargs: dict) -> tuple:
    """The tensors among ``result`` that the operation made anew (no alias in its schema)."""
    results = result if isinstance(result, (tuple, list)) and len(schema.returns) > 1 else (result,)
    made = []
    position = 0
    inputs = None
    memory = None
    for ret, value in zip(schema.returns, results):
        leaves = tree_leaves(value)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if inputs is None:  # (an operation that hands back an input object: nothing made)
                    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                    inputs = {id(t) for t in tensors}
                if ret.alias_info is None:
                    if id(leaf) not in inputs:
                        made.append((position, leaf))
                elif id(leaf) not in inputs:
                    # may alias (aten::to, reached undecomposed under inference mode): made where
                    # it copied, in memory none of its inputs has
                    if memory is None:
                        memory = {_ptr(t) for t in tensors}
                    if _ptr(leaf) not in memory and _ptr(leaf) != 0:
                        made.append((position, leaf))
            position += 1
    return tuple(made)


def _ptr(t: torch.Tensor) -> int:
    storage = _storage(t)
    return storage.data_ptr() if storage is not None else 0


def record(body: Callable[[], Any]) -> SimulatedGraph:
    """Run ``body`` once, recording the tensor operations it dispatches: the graph that
    replays them. Raises ``RuntimeError(HOST_SYNC)`` where the host would wait for the device."""
    recorder = _Recorder()
    try:
        # code torch.compile made runs its kernels (Triton, C++) without dispatching aten
        # operations, which the recorder would miss: the capture runs the compiled functions'
        # Python eagerly, whose operations compute what their kernels compute
        with torch.compiler.set_stance("force_eager"), recorder:
            out = body()
    except BaseException:
        recorder.restore()
        raise
    return SimulatedGraph(_by_address(recorder.ops), out, recorder.freed())


def _by_address(ops: list[Op]) -> list[Op]:
    """``ops`` with the results another graph lent, which they read or write, held as a GPU's
    graph holds memory: by its address (a tensor over the same memory, not over the lent
    storage, whose uses tell whether a caller still holds the result)."""
    aliases: dict[int, Any] = {}

    def swap(x: Any) -> Any:
        if _storage(x) is None:
            return x
        if id(x) not in aliases:
            aliases[id(x)] = by_address(x)
        alias = aliases[id(x)]
        return x if alias is None else alias

    out = []
    for op in ops:
        args, kwargs = tree_map(swap, (op.args, op.kwargs))
        out.append(op._replace(args=args, kwargs=kwargs))
    return out
