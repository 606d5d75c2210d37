"""The oracle: run a case through ``CudaGraphModule`` and through the plain function, compare.

For every call of the sequence (warmup calls, the capturing call, replays with new values,
sometimes a call with a changed signature and one more good call), the inputs are built
twice from the case's source (or, for cases that reuse their objects, refreshed in place
in both worlds), then the wrapper is called on one copy and the plain function on the
other. Everything observable is compared:

- the result: types, structure (dict/TensorDict key order, lengths, batch sizes), values bit
  for bit (so ``-0.0`` is not ``0.0``), dtypes, shapes, devices;
- the arguments after the call: the same comparison (in-place writes, keys added or removed,
  items appended, batch sizes set);
- identity: which returned objects *are* the caller's objects (or another returned object),
  and which input objects ended up under other input keys (tensors, dicts, lists,
  TensorDicts, tensorclasses, dataclasses, distributions: the mutable objects);
- aliasing, by writing: each tensor reachable from the inputs and the result is written to
  (``add_(1)``/``logical_not_()``) and every other tensor is checked for a change; the sets
  must agree between the two worlds; then everything is restored;
- warnings the wrapper emits and the plain function does not.

Accepted: equal, or the wrapper raised a :class:`graphmodule.GraphModuleError` and left the
inputs untouched (the plain function is then not called). A signature (see :func:`signature`)
that once captured or replayed must keep working: a later call with an equal signature that
raises ``InputMismatchError`` is a failure, as is a ``GraphStateError`` without a failed
capture, and, without CUDA, a failed capture where the plain function runs. At the end,
every earlier result is compared again (a later call must not overwrite it).
"""

import dataclasses
import math
import struct
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

import torch
from tensordict import TensorDictBase, is_non_tensor, is_tensorclass

from graphmodule import (
    CaptureError,
    CudaGraphModule,
    GraphModuleError,
    GraphStateError,
    InputMismatchError,
)

from .strategies import Case, RandomCase, namespace, refresh, val

__all__ = ["Diff", "DifferentialFailure", "HarnessError", "check_case", "check_random_case", "last_bits", "run_case"]


class HarnessError(Exception):
    """The harness itself is inconsistent (e.g. two builds of one call differ)."""


class DifferentialFailure(AssertionError):
    """The wrapped call and the plain call differ. Subclassed per kind of difference."""

    kind = "difference"


_FAILURE_TYPES: dict[str, type] = {}


def failure_type(kind: str) -> type:
    """One exception class per kind, so that hypothesis reports each kind separately."""
    if kind not in _FAILURE_TYPES:
        name = "Differs_" + "".join(c if c.isalnum() else "_" for c in kind)
        _FAILURE_TYPES[kind] = type(name, (DifferentialFailure,), {"kind": kind})
    return _FAILURE_TYPES[kind]


@dataclass
class Diff:
    call: str
    kind: str  # e.g. "output:value", "input:keys", "identity", "aliasing", "spurious-error"
    path: str
    eager: str
    wrapper: str

    def __str__(self) -> str:
        return f"[{self.call}] {self.kind} at {self.path}:\n      eager:   {self.eager}\n      wrapper: {self.wrapper}"


# -- describing values ----------------------------------------------------------------------
def show(value: Any, limit: int = 160) -> str:
    if isinstance(value, BaseException):
        lines = str(value).splitlines()
        text = f"raised {type(value).__name__}: " + " | ".join(line.strip() for line in lines[:3])
    elif isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        body = data.tolist() if data.numel() <= 24 else f"<{data.numel()} values>"
        text = f"tensor{tuple(value.shape)} {value.dtype} {body}"
    elif isinstance(value, TensorDictBase) and not is_non_tensor(value):
        text = f"{type(value).__name__}(batch_size={list(value.batch_size)}, keys={list(value.keys())})"
    elif isinstance(value, float):
        text = repr(value)
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.dtype.is_floating_point:
        size = t.element_size()
        return t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[size])
    if t.dtype.is_complex:
        return torch.view_as_real(t.contiguous()).contiguous().view(torch.int64 if t.element_size() == 16 else torch.int32)
    return t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _same_float(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


# -- structural comparison --------------------------------------------------------------------
def _key_path(path: str, key: Any) -> str:
    return f"{path}[{key!r}]"


def _fields(obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)]


def _dist_attrs(d: torch.distributions.Distribution) -> list[str]:
    return sorted(k for k in vars(d) if not k.startswith("_"))


_DEFERRED: list | None = None  # value comparisons waiting for one batched check
_LAST_BITS = False  # floating values compared up to the last bits (see ``last_bits``)


@contextmanager
def last_bits():
    """Inside it ``compare`` accepts floating values that differ from eager's in the last bits
    (torch.testing's default tolerance for their dtype): for a call served in another memory
    layout than its graph's capture, copied into the capture's layout, where a kernel that picks
    its reduction order by strides (a matmul) rounds otherwise. A wrong value still differs."""
    global _LAST_BITS
    before, _LAST_BITS = _LAST_BITS, True
    try:
        yield
    finally:
        _LAST_BITS = before


def _close(e: torch.Tensor, w: torch.Tensor) -> bool:
    try:
        torch.testing.assert_close(w, e, check_stride=False, equal_nan=True)
    except AssertionError:
        return False
    return True


def _row(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.stride(0) != 1:  # a strided view (one element of stride 2 counts as contiguous)
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def _flat_bytes(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors' elements as one row of bytes, in order (copies where memory is not contiguous)."""
    return torch.cat([_row(t) for t in tensors])


class _Bytes:
    """The bytes of several tensors, to tell which of them another set of tensors (same shapes
    and dtypes) differs from in any bit: a few kernels and one host sync per device, however
    many tensors (one comparison and one reduction per pair made the GPU fuzz launch-bound)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.n = len(tensors)
        by_device: dict[Any, list[int]] = {}
        for i, t in enumerate(tensors):
            if t.numel():  # an empty tensor never differs
                by_device.setdefault(t.device, []).append(i)
        self.groups = []
        for index in by_device.values():
            rows = [tensors[i] for i in index]
            offsets = np.cumsum([0] + [t.numel() * t.element_size() for t in rows[:-1]])
            self.groups.append((index, offsets, _flat_bytes(rows)))

    def differs(self, tensors: list[torch.Tensor]) -> list[bool]:
        out = [False] * self.n
        for index, offsets, flat in self.groups:
            now = _flat_bytes([tensors[i] for i in index]).to(flat.device)
            ne = (now != flat).cpu().numpy()
            for i, d in zip(index, np.logical_or.reduceat(ne, offsets)):
                out[i] = bool(d)
        return out


def _check_deferred(pending: list) -> None:
    """The value comparisons ``compare`` put off: one host sync for all of them."""
    if not pending:
        return
    differs = _Bytes([w for _, w, _ in pending]).differs([e for e, _, _ in pending])
    for (e, w, add), d in zip(pending, differs):
        if d:
            add("value", show(e), show(w))


def compare(e: Any, w: Any, path: str, region: str, call: str, diffs: list[Diff]) -> None:
    """Append to ``diffs`` every difference between ``e`` (eager) and ``w`` (wrapper)."""

    def add(kind, a, b):
        diffs.append(Diff(call, f"{region}:{kind}", path, a, b))

    if type(e) is not type(w):
        add("type", f"{type(e).__name__}: {show(e)}", f"{type(w).__name__}: {show(w)}")
        return
    if isinstance(e, torch.Tensor):
        if e.shape != w.shape:
            add("shape", show(e), show(w))
        elif e.dtype != w.dtype:
            add("dtype", show(e), show(w))
        elif e.device != w.device:
            add("device", str(e.device), str(w.device))
        elif e.requires_grad != w.requires_grad:
            add("requires_grad", str(e.requires_grad), str(w.requires_grad))
        elif _LAST_BITS and e.is_floating_point():
            if not _close(e, w):
                add("value", show(e), show(w))
        elif _DEFERRED is not None:  # inside compare_worlds: all values checked at once
            _DEFERRED.append((e, w, add))
        elif not same_bits(e, w):
            add("value", show(e), show(w))
        return
    if is_tensorclass(e):
        if e.batch_size != w.batch_size:
            add("batch_size", str(list(e.batch_size)), str(list(w.batch_size)))
        for name in _fields(e):
            compare(getattr(e, name), getattr(w, name), f"{path}.{name}", region, call, diffs)
        return
    if isinstance(e, TensorDictBase):
        if is_non_tensor(e):
            compare(e.data, w.data, path, region, call, diffs)
            return
        if e.batch_size != w.batch_size:
            add("batch_size", str(list(e.batch_size)), str(list(w.batch_size)))
        if e.device != w.device:
            add("device", str(e.device), str(w.device))
        ke, kw = list(e.keys()), list(w.keys())
        if ke != kw:
            add("keys", str(ke), str(kw))
        for key in ke:
            if key in kw:
                compare(e.get(key), w.get(key), _key_path(path, key), region, call, diffs)
        return
    if dataclasses.is_dataclass(e) and not isinstance(e, type):
        for name in _fields(e):
            compare(getattr(e, name), getattr(w, name), f"{path}.{name}", region, call, diffs)
        return
    if isinstance(e, torch.distributions.Distribution):
        if e.batch_shape != w.batch_shape or e.event_shape != w.event_shape:
            add("shape", f"batch {list(e.batch_shape)} event {list(e.event_shape)}",
                f"batch {list(w.batch_shape)} event {list(w.event_shape)}")
        for name in _dist_attrs(e):
            compare(getattr(e, name), getattr(w, name, None), f"{path}.{name}", region, call, diffs)
        return
    if isinstance(e, dict):
        ke, kw = list(e.keys()), list(w.keys())
        if ke != kw:
            add("keys", str(ke), str(kw))
        for key in ke:
            if key in w:
                compare(e[key], w[key], _key_path(path, key), region, call, diffs)
        return
    if isinstance(e, (list, tuple)) and not isinstance(e, torch.Size):
        if len(e) != len(w):
            add("length", f"{len(e)} items: {show(e)}", f"{len(w)} items: {show(w)}")
        for i, (a, b) in enumerate(zip(e, w)):
            compare(a, b, f"{path}[{i}]", region, call, diffs)
        return
    if isinstance(e, float):
        if not _same_float(e, w):
            add("value", repr(e), repr(w))
        return
    try:
        equal = bool(e == w)
    except Exception:  # noqa: BLE001 - an object without a truth-valued ==
        equal = repr(e) == repr(w)
    if not equal:
        add("value", show(e), show(w))


# -- objects, identity, aliasing ------------------------------------------------------------
def _mutable(obj: Any) -> bool:
    if isinstance(obj, (torch.Tensor, dict, list, torch.distributions.Distribution)):
        return True
    if isinstance(obj, TensorDictBase):
        return not is_non_tensor(obj)
    return is_tensorclass(obj) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type))


def walk(obj: Any, path: str, out: list[tuple[str, Any]]) -> None:
    """Every mutable object reachable from ``obj``, with its path (parents first)."""
    if _mutable(obj):
        out.append((path, obj))
    if isinstance(obj, torch.Tensor):
        return
    if is_tensorclass(obj) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        for name in _fields(obj):
            walk(getattr(obj, name), f"{path}.{name}", out)
    elif isinstance(obj, TensorDictBase):
        if not is_non_tensor(obj):
            for key in obj.keys():
                walk(obj.get(key), _key_path(path, key), out)
    elif isinstance(obj, torch.distributions.Distribution):
        for name in _dist_attrs(obj):
            walk(getattr(obj, name), f"{path}.{name}", out)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            walk(value, _key_path(path, key), out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            walk(value, f"{path}[{i}]", out)


def walk_call(args: tuple, kwargs: dict, out_value: Any = None, with_output: bool = True) -> list[tuple[str, Any]]:
    objs: list[tuple[str, Any]] = []
    for i, a in enumerate(args):
        walk(a, f"args[{i}]", objs)
    for key, value in kwargs.items():
        walk(value, f"kwargs[{key!r}]", objs)
    if with_output:
        walk(out_value, "out", objs)
    return objs


def identity_map(objs: list[tuple[str, Any]]) -> dict[str, str]:
    """For each path, the first path (inputs first) that holds the same object."""
    first: dict[int, str] = {}
    out = {}
    for path, obj in objs:
        out[path] = first.setdefault(id(obj), path)
    return out


def _describe_identity(path: str, canon: str) -> str:
    if canon == path:
        return "its own object"
    return f"the same object as {canon}"


def _changed(slots: list[tuple[str, torch.Tensor]], snaps: "_Bytes") -> list[bool]:
    """Whether each slot's bits differ from its snapshot: one host sync for all of them
    (a ``torch.equal`` per pair waits for the GPU each time, which made the GPU fuzz slow)."""
    return snaps.differs([u for _, u in slots])


def probe(objs: list[tuple[str, Any]]) -> dict[str, Any]:
    """For each tensor path: the other tensor paths that change when it is written to."""
    slots = [(p, t) for p, t in objs if isinstance(t, torch.Tensor)]
    result: dict[str, Any] = {}
    with torch.no_grad():
        snaps = [t.detach().clone() for _, t in slots]
        before = _Bytes(snaps)
        for path, t in slots:
            try:
                if t.dtype == torch.bool:
                    t.logical_not_()
                else:
                    t.add_(1)
            except Exception as exc:  # noqa: BLE001 - e.g. memory that overlaps itself
                result[path] = f"not writable ({type(exc).__name__})"
            else:
                changed = _changed(slots, before)
                result[path] = sorted(q for (q, _), c in zip(slots, changed) if c and q != path)
            # what the write reached is restored (every slot, where the write raised midway)
            reached = changed if isinstance(result[path], list) else [True] * len(slots)
            for (q, u), s, c in zip(slots, snaps, reached):
                if not c:
                    continue
                try:
                    u.copy_(s)
                except Exception:  # noqa: BLE001 - overlapping memory: restored through its base
                    pass
        for (q, _), c in zip(slots, _changed(slots, before)):
            if c:
                raise HarnessError(f"probe could not restore {q}")
    return result


def compare_worlds(
    e_call: tuple, e_out: Any, w_call: tuple, w_out: Any, call: str, with_output: bool = True,
    region_in: str = "input",
) -> list[Diff]:
    """Everything observable about one call, eager (``e_``) against wrapper (``w_``)."""
    global _DEFERRED
    diffs: list[Diff] = []
    _DEFERRED = pending = []
    try:
        if with_output:
            compare(e_out, w_out, "out", "output", call, diffs)
        (ea, ek), (wa, wk) = e_call, w_call
        for i, (a, b) in enumerate(zip(ea, wa)):
            compare(a, b, f"args[{i}]", region_in, call, diffs)
        for key in ek:
            compare(ek[key], wk.get(key), f"kwargs[{key!r}]", region_in, call, diffs)
    finally:
        _DEFERRED = None
    _check_deferred(pending)
    e_objs = walk_call(ea, ek, e_out, with_output)
    w_objs = walk_call(wa, wk, w_out, with_output)
    e_ids, w_ids = identity_map(e_objs), identity_map(w_objs)
    for path, canon in e_ids.items():
        if path in w_ids and w_ids[path] != canon:
            diffs.append(Diff(call, "identity", path, _describe_identity(path, canon),
                              _describe_identity(path, w_ids[path])))
    e_probe, w_probe = probe(e_objs), probe(w_objs)
    for path, changed in e_probe.items():
        if path in w_probe and w_probe[path] != changed:
            diffs.append(Diff(call, "aliasing", path, f"writing into it changes {changed}",
                              f"writing into it changes {w_probe[path]}"))
    return diffs


# -- running a case --------------------------------------------------------------------------
@dataclass
class CallRecord:
    label: str
    k: int
    changed: bool
    eager: Any  # printable: a str, or a _Text described when printed
    wrapper: Any
    refused: BaseException | None = None  # the wrapper's GraphModuleError, where it refused the call


@dataclass
class Outcome:
    case: Any
    backend: str
    calls: list[CallRecord]
    diffs: list[Diff]

    @property
    def ok(self) -> bool:
        return not self.diffs

    def report(self) -> str:
        lines = [f"differential failure ({self.diffs[0].kind}) on backend={self.backend!r}", ""]
        lines.append("--- repro " + "-" * 60)
        lines.append(self.case.repro(self.backend) if hasattr(self.case, "repro") else repr(self.case))
        lines.append("--- calls " + "-" * 60)
        for c in self.calls:
            flag = " (changed signature)" if c.changed else ""
            lines.append(f"{c.label} k={c.k}{flag}: eager {c.eager}; wrapper {c.wrapper}")
        lines.append("--- differences " + "-" * 54)
        for d in self.diffs[:12]:
            lines.append(str(d))
        if len(self.diffs) > 12:
            lines.append(f"... and {len(self.diffs) - 12} more")
        return "\n".join(lines)


def _call(f, args: tuple, kwargs: dict) -> tuple[Any, BaseException | None, list[str]]:
    """``f(*args, **kwargs)``: its result or exception, and the warnings it emitted.

    Warnings are recorded, whatever the filters (pytest's "error" included), and compared
    between the two worlds: a warning only the wrapper emits is a difference.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out, err = f(*args, **kwargs), None
        except Exception as exc:  # noqa: BLE001 - compared below
            out, err = None, exc
    return out, err, [f"{w.category.__name__}: {w.message}" for w in caught]


class _Text:
    """A call's result, described when printed (a report): describing a tensor reads it on
    the host, a sync per call on a GPU. Tensors are snapshotted (an asynchronous copy), so
    the text shows the values of that call even if later calls write into them."""

    __slots__ = ("out", "err")

    def __init__(self, out: Any, err: BaseException | None) -> None:
        self.out = _snapshot(out)  # holds no result (outputs="safe" sees what callers hold)
        self.err = err

    def __str__(self) -> str:
        return show(self.err, 300) if self.err is not None else "returned " + show(self.out, 80)

    __repr__ = __str__


def _snapshot(out: Any) -> Any:
    """Copies of the tensors in ``out`` (through tuples, lists, dicts and TensorDicts)."""
    def copy(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) and not x.is_sparse else x

    try:
        return torch.utils._pytree.tree_map(copy, out)
    except Exception:  # noqa: BLE001 - an output pytree cannot rebuild: keep it as it is
        return out


def _short(out: Any, err: BaseException | None) -> str:
    return show(err, 300) if err is not None else "returned " + show(out, 80)


def signature(args: tuple, kwargs: dict) -> tuple:
    """What a call's inputs must keep for a replay: containers, keys and their order, shapes,
    dtypes, devices, batch sizes, constants (bit for bit), and which inputs alias which.

    Keyword arguments are matched by name, so their order is not part of it. Two calls with
    equal signatures must be treated alike: a wrapper that replayed one must replay the other.
    """

    def sig(x):
        if isinstance(x, torch.Tensor):
            return ("tensor", tuple(x.shape), str(x.dtype), str(x.device), x.requires_grad)
        if is_tensorclass(x):
            return ("tensorclass", type(x).__qualname__, tuple(x.batch_size),
                    tuple((f, sig(getattr(x, f))) for f in _fields(x)))
        if isinstance(x, TensorDictBase):
            if is_non_tensor(x):
                return ("non-tensor", sig(x.data))
            return ("td", type(x).__qualname__, tuple(x.batch_size), str(x.device),
                    tuple((k, sig(x.get(k))) for k in x.keys()))
        if isinstance(x, dict):
            return ("dict", tuple((k, sig(v)) for k, v in x.items()))
        if isinstance(x, (list, tuple)):
            return (type(x).__qualname__, tuple(sig(v) for v in x))
        if isinstance(x, float):
            return ("float", struct.pack("<d", x))
        return (type(x).__qualname__, repr(x))

    body = (tuple(sig(a) for a in args), tuple(sorted((k, sig(v)) for k, v in kwargs.items())))
    objs = walk_call(args, kwargs, with_output=False)
    groups: dict[int, list[str]] = {}
    for path, obj in objs:
        groups.setdefault(id(obj), []).append(path)
    same = tuple(sorted(tuple(sorted(paths)) for paths in groups.values() if len(paths) > 1))
    alias = tuple(sorted((p, tuple(c) if isinstance(c, list) else c) for p, c in probe(objs).items()))
    return body, same, alias


# capture failures that a CUDA capture gives too where the plain call runs (backend="simulate"
# refuses the same operations, see graphmodule._simulate)
REFUSED_BY_CUDA = ("host-sync", "data-dependent-shape")


def refused_by_cuda(err: BaseException | None, within: str = "") -> bool:
    """Whether ``err`` is a capture failure a CUDA capture gives too (the host waiting for the
    device); ``within``: only where a frame of the failing line's traceback is in that folder."""
    if not isinstance(err, CaptureError) or err.cause not in REFUSED_BY_CUDA:
        return False
    frames = traceback.extract_tb(err.__cause__.__traceback__) if err.__cause__ is not None else []
    return not within or any(within in f.filename for f in frames)


def run_case(case: Case, backend: str = "simulate", device: str = "cpu", outputs: str = "clone") -> Outcome:
    """Make the case's call sequence in both worlds; the differences of the first call that has any."""
    ns = case.compile(device)
    fn = ns["fn"]
    g = CudaGraphModule(fn, warmup=case.warmup, backend=backend, outputs=outputs)
    calls: list[CallRecord] = []
    history: list[tuple[str, Any, Any]] = []
    worked: set = set()  # signatures of calls that captured or replayed fine
    capture_failed = False
    force_fresh = False  # the two worlds diverged (the plain function ran alone): rebuild
    on_cpu = backend != "cuda"
    for label, k, changed, fresh in case.plan_calls():
        if fresh or force_fresh:
            build = ns["make_changed_inputs" if changed else "make_inputs"]
            (wa, wk), (ea, ek) = build(k), build(k)
            force_fresh = False
        else:  # the same objects as the call before (with its effects), new values
            refresh(wa, wk, k)
            refresh(ea, ek, k)
        if case._reverse(label):
            wk, ek = (dict(reversed(list(d.items()))) for d in (wk, ek))
        pre = compare_worlds((ea, ek), None, (wa, wk), None, label, with_output=False)
        if pre:
            raise HarnessError("the two worlds differ before a call:\n" + "\n".join(map(str, pre)))
        sig = signature(wa, wk)
        state_before = g.state
        w_out, w_err, w_warn = _call(g, wa, wk)
        # a capture that failed in this call (a CaptureError, or a warning and an eager run)
        failed_now = isinstance(w_err, CaptureError) or (g.state == "failed" and state_before != "failed")
        capture_failed = capture_failed or failed_now
        diffs: list[Diff] = []
        if isinstance(w_err, GraphModuleError):
            # accepted if it did nothing to the inputs and is allowed here; the plain
            # function is not called, so that both worlds still hold the same inputs
            diffs += [
                dataclasses.replace(d, kind="error-with-side-effects:" + d.kind.split(":")[-1])
                for d in compare_worlds((ea, ek), None, (wa, wk), None, label, with_output=False)
            ]
            eager_text = "(not called)"
            if failed_now and on_cpu and not refused_by_cuda(w_err):
                # without CUDA a capture runs the function on the graph's buffers, refusing
                # what a CUDA capture refuses (the host waiting for the device): it may fail
                # only there, or where the plain function fails
                e_out, e_err, _ = _call(fn, ea, ek)
                force_fresh = True
                eager_text = _short(e_out, e_err)
                if e_err is None:
                    diffs.append(Diff(label, "error:capture-failed-where-the-plain-call-ran", "call",
                                      eager_text, show(w_err, 400)))
            calls.append(CallRecord(label, k, changed, eager_text, _short(None, w_err), w_err))
            if isinstance(w_err, GraphStateError) and not capture_failed:
                diffs.append(Diff(label, "error:graph-state-without-failed-capture", "call",
                                  "no capture failed before", show(w_err, 400)))
            # refusals about memory layout (the strides of an input whose view is handed back,
            # aliasing between inputs, an expanded input written in place) are documented and
            # not part of `sig`, which models structure, dtypes, shapes and constants only
            layout_only = isinstance(w_err, InputMismatchError) and all(
                m.kind in ("stride", "alias", "overlap") for m in w_err.mismatches)
            if isinstance(w_err, InputMismatchError) and sig in worked and not layout_only:
                diffs.append(Diff(label, "error:spurious-input-mismatch", "call",
                                  "a call with the same signature captured/replayed fine", show(w_err, 400)))
        else:
            e_out, e_err, e_warn = _call(fn, ea, ek)
            calls.append(CallRecord(label, k, changed, _Text(e_out, e_err), _Text(w_out, w_err)))
            extra = [w for w in w_warn if w not in e_warn]
            if extra:
                diffs.append(Diff(label, "warning", "call", "no warning", " || ".join(extra)[:600]))
            if failed_now and on_cpu and e_err is None:
                diffs.append(Diff(label, "error:capture-failed-where-the-plain-call-ran", "call",
                                  _short(e_out, e_err), "state 'failed' after the call"))
            if w_err is not None:
                if e_err is None:
                    diffs.append(Diff(label, "error:wrapper-raised", "call", _short(e_out, e_err), show(w_err, 400)))
                elif type(w_err) is not type(e_err):
                    diffs.append(Diff(label, "error:different-error", "call", show(e_err), show(w_err, 400)))
                else:  # the same error: the same partial effects on the arguments
                    diffs += compare_worlds((ea, ek), None, (wa, wk), None, label, with_output=False)
            elif e_err is not None:
                diffs.append(Diff(label, "error:wrapper-did-not-raise", "call", show(e_err), _short(w_out, None)))
            else:
                diffs += compare_worlds((ea, ek), e_out, (wa, wk), w_out, label)
                if not label.startswith("warmup") and not failed_now:
                    worked.add(sig)
                if outputs != "safe" or len(calls) % 2:
                    # safe: every other result is dropped, so that lent buffers are replayed
                    # over as well as held (every result kept would only ever need new ones)
                    history.append((label, e_out, w_out))
        if diffs:
            return Outcome(case, backend, calls, diffs)
    if outputs in ("safe", "clone"):
        diffs = []
        for label, e_out, w_out in history:
            found: list[Diff] = []
            compare(e_out, w_out, "out", "output", f"{label}, after the last call", found)
            diffs += [dataclasses.replace(d, kind="stale-" + d.kind) for d in found]
        if diffs:
            return Outcome(case, backend, calls, diffs)
    return Outcome(case, backend, calls, [])


def check_case(case: Case, backend: str = "simulate", device: str = "cpu", outputs: str = "clone") -> Outcome:
    """Run ``case``; raise a :class:`DifferentialFailure` subclass with a printed diff if it fails."""
    outcome = run_case(case, backend, device, outputs)
    if not outcome.ok:
        raise failure_type(outcome.diffs[0].kind)(outcome.report())
    return outcome


# -- randomness, compared by distribution ------------------------------------------------------
def _stats(t: torch.Tensor) -> tuple[float, float, float]:
    x = t.detach().double()
    return x.mean().item(), x.std().item(), (x == 0).double().mean().item()


def check_random_case(rc: RandomCase, backend: str = "simulate", device: str = "cpu") -> None:
    """Deterministic parts equal; random parts of the same law; a replay draws afresh."""
    ns = namespace(device)
    exec(compile(rc.fn_src, "<fn>", "exec"), ns)
    fn = ns["fn"]
    g = CudaGraphModule(fn, warmup=rc.warmup, backend=backend)
    dtype = getattr(torch, rc.dtype)
    previous = None
    problems = []
    for k in range(rc.warmup + 1 + rc.replays):
        xe = val((rc.n,), k, dtype, 0, device)
        xw = val((rc.n,), k, dtype, 0, device)
        e_out, e_err, _ = _call(fn, (xe, rc.scale), {})
        w_out, w_err, w_warn = _call(g, (xw, rc.scale), {})
        if w_warn:
            problems.append(f"call {k}: the wrapper warned: {w_warn}")
        if e_err is not None or w_err is not None:
            if not isinstance(w_err, GraphModuleError):
                problems.append(f"call {k}: eager {_short(e_out, e_err)}; wrapper {_short(w_out, w_err)}")
            break
        diffs: list[Diff] = []
        compare(e_out[0], w_out[0], "out[0]", "output", f"call{k}", diffs)
        problems += [str(d) for d in diffs]
        e, w = e_out[1], w_out[1]
        if e.shape != w.shape or e.dtype != w.dtype or e.device != w.device:
            problems.append(f"call {k}: random output {show(e)} vs {show(w)}")
            break
        (me, se, ze), (mw, sw, zw) = _stats(e), _stats(w)
        n = e.numel()
        tol_mean = 6 * math.sqrt((se**2 + sw**2) / n) + 1e-9
        tol_std = 6 * math.sqrt((se**2 + sw**2) / (2 * n)) + 1e-9
        tol_zero = 6 * math.sqrt(max(ze * (1 - ze), 1e-4) * 2 / n)
        if abs(me - mw) > tol_mean or abs(se - sw) > tol_std or abs(ze - zw) > tol_zero:
            problems.append(
                f"call {k}: law differs: eager mean {me:.4f} std {se:.4f} zeros {ze:.4f}; "
                f"wrapper mean {mw:.4f} std {sw:.4f} zeros {zw:.4f}"
            )
        if previous is not None and same_bits(previous, w):
            problems.append(f"call {k}: the wrapper returned the same random draw as the call before")
        previous = w.detach().clone()
    if problems:
        raise failure_type("random")(f"random case on backend={backend!r}:\n{rc!r}\n" + "\n".join(problems))
