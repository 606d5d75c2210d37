"""Hypothesis strategies for differential cases: a call tree and a function body, as source.

A :class:`Case` is Python source, not closures: ``make_inputs(k)`` builds the inputs of
the ``k``-th call (same signature for every ``k``, new values), ``make_changed_inputs(k)``
the same inputs with one change of signature, and ``fn`` is the function to wrap. The
oracle executes exactly that source, so the repro printed with a failure is what ran:
paste it after :data:`REPRO_HEADER`.

Generation is symbolic: the input tree is drawn first (tensors from a pool, so that one
tensor can appear twice or as a view of another input), then the body is drawn one
statement at a time over an environment that knows which tensors, containers and
constants the function can reach, their shapes and dtypes, and which keys are still
there after earlier ``pop``/``del`` statements. Every operation is exact on the values
``val`` produces (small multiples of 0.5), so eager and graphed results must be equal
bit for bit; randomness has its own strategy (:func:`random_cases`).
"""

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase, is_non_tensor, is_tensorclass, tensorclass

__all__ = [
    "Case",
    "FOCUS",
    "Out",
    "Pair",
    "RANDOM_BODIES",
    "REPRO_HEADER",
    "RandomCase",
    "cases",
    "namespace",
    "random_cases",
    "refresh",
    "val",
]


# -- the vocabulary the generated source uses -------------------------------------------
def val(shape, k, dtype=torch.float32, salt=0, device="cpu"):
    """Deterministic values for the ``k``-th call: floats are multiples of 0.5 in [-2.5, 2.5],
    integers in [-5, 5] (0 included), so that every operation of the vocabulary is exact.

    Different ``k`` give different values of the same signature; ``salt`` tells tensors
    of one call apart.
    """
    n = math.prod(shape)
    base = (torch.arange(n, dtype=torch.int64) * 7 + 3 * salt + 5 * k + 1) % 11 - 5
    if dtype == torch.bool:
        out = base % 2 == 0
    elif dtype.is_floating_point:
        out = base.to(dtype) / 2
    else:
        out = base.to(dtype)
    return out.reshape(shape).to(device)


def _tensors(obj, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif is_tensorclass(obj) or (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        for f in dataclasses.fields(obj):
            _tensors(getattr(obj, f.name), out)
    elif isinstance(obj, TensorDictBase):
        if not is_non_tensor(obj):
            for key in obj.keys():
                _tensors(obj.get(key), out)
    elif isinstance(obj, dict):
        for value in obj.values():
            _tensors(value, out)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            _tensors(value, out)


def refresh(args, kwargs, k) -> None:
    """New values for the ``k``-th call, written in place into every tensor of the call.

    The repeated-call pattern (``g(td)`` again and again on one TensorDict): the objects,
    their containers and what earlier calls did to them stay.
    """
    tensors: list = []
    _tensors((args, kwargs), tensors)
    with torch.no_grad():
        for i, t in enumerate(tensors):
            t.copy_(val(tuple(t.shape), k, t.dtype, 100 + i, t.device))


@tensorclass
class Pair:
    """A tensorclass for inputs and outputs."""

    obs: torch.Tensor
    reward: torch.Tensor


@dataclass
class Out:
    """A plain dataclass for outputs."""

    a: Any
    b: Any


REPRO_HEADER = """\
import functools, torch
from tensordict import TensorDict
from torch.distributions import Normal
from graphmodule import CudaGraphModule
from tests.differential.strategies import Pair, Out, val, refresh
val = functools.partial(val, device="cpu")   # or "cuda" with backend="cuda"
"""


def namespace(device="cpu") -> dict:
    """The globals the generated source runs in (what :data:`REPRO_HEADER` imports)."""
    return {
        "torch": torch,
        "TensorDict": TensorDict,
        "Normal": torch.distributions.Normal,
        "Pair": Pair,
        "Out": Out,
        "val": functools.partial(val, device=device),
        "math": math,
        "refresh": refresh,
    }


# -- a case ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One generated (or hand-written) differential case.

    ``inputs_src`` defines ``make_inputs(k) -> (args, kwargs)``; ``changed_src`` (optional)
    defines ``make_changed_inputs(k)``, the same call with one change of signature,
    made after the replays and followed by one more good call. ``fn_src`` defines ``fn``.
    """

    inputs_src: str
    fn_src: str
    warmup: int = 2
    replays: int = 3
    changed_src: str | None = None
    changed_what: str = ""
    reorder_kwargs: bool = True  # replays pass keyword arguments in reversed order
    reuse: bool = False  # each call gets the objects of the call before, refreshed in place
    tags: frozenset = field(default_factory=frozenset)

    def source(self) -> str:
        parts = [self.inputs_src.rstrip()]
        if self.changed_src:
            parts.append(f"# changed signature: {self.changed_what}\n" + self.changed_src.rstrip())
        parts.append(self.fn_src.rstrip())
        return "\n\n".join(parts) + "\n"

    def repro(self, backend: str = "simulate") -> str:
        """A script that makes the call sequence through the wrapper and eagerly."""
        calls = ", ".join(
            f"({k}, {'make_changed_inputs' if changed else 'make_inputs'}, {self._reverse(label)}, {fresh})"
            for label, k, changed, fresh in self.plan_calls()
        )
        labels = ", ".join(label for label, _, _, _ in self.plan_calls())
        return (
            REPRO_HEADER
            + "\n"
            + self.source()
            + f"\ng = CudaGraphModule(fn, warmup={self.warmup}, backend={backend!r})\n"
            + f"for k, make, reverse_kwargs, fresh in [{calls}]:  # {labels}\n"
            + "    if fresh:  # new objects (else: the objects of the call before, new values)\n"
            + "        (args, kwargs), (args2, kwargs2) = make(k), make(k)\n"
            + "    else:\n"
            + "        refresh(args, kwargs, k); refresh(args2, kwargs2, k)\n"
            + "    if reverse_kwargs:\n"
            + "        kwargs, kwargs2 = dict(reversed(kwargs.items())), dict(reversed(kwargs2.items()))\n"
            + "    out = g(*args, **kwargs)\n"
            + "    want = fn(*args2, **kwargs2)\n"
            + "    print(k, out, want, args, args2, kwargs, kwargs2, sep='\\n  ')\n"
        )

    def _reverse(self, label: str) -> bool:
        """Replays 1, 3, ... pass keyword arguments in reversed order (they match by name)."""
        return self.reorder_kwargs and label.startswith("replay") and int(label[6:]) % 2 == 1

    def plan_calls(self) -> list[tuple[str, int, bool, bool]]:
        """The call sequence: (label, k, changed signature, fresh objects)."""
        return [
            (label, k, changed, not self.reuse or i == 0 or changed or label == "after-changed")
            for i, (label, k, changed) in enumerate(self.plan())
        ]

    def plan(self) -> list[tuple[str, int, bool]]:
        """The call sequence: (label, k, changed)."""
        out = [(f"warmup{i}", i, False) for i in range(self.warmup)]
        k = self.warmup
        out.append(("capture", k, False))
        for i in range(self.replays):
            k += 1
            out.append((f"replay{i}", k, False))
        if self.changed_src:
            out.append(("changed", k + 1, True))
            out.append(("after-changed", k + 2, False))
        return out

    def compile(self, device="cpu") -> dict:
        ns = namespace(device)
        exec(compile(self.inputs_src, "<make_inputs>", "exec"), ns)
        if self.changed_src:
            exec(compile(self.changed_src, "<make_changed_inputs>", "exec"), ns)
        exec(compile(self.fn_src, "<fn>", "exec"), ns)
        return ns

    def __repr__(self) -> str:  # hypothesis prints the falsifying example with this
        return (
            f"Case(warmup={self.warmup}, replays={self.replays}, reuse={self.reuse}, tags={sorted(self.tags)})\n"
            + self.source()
        )


def chance(draw, prob: float) -> bool:
    """True with probability ``prob``; shrinks to False (the feature off)."""
    return draw(st.integers(0, 99)) >= 100 - round(100 * prob)


# -- the input tree as data -------------------------------------------------------------
KEYS = ["x", "b", "a", "obs", "act", "y"]  # 'b' before 'a': insertion order != sorted order
FLOAT_CONSTS = [0.0, -0.0, 1.5, -2.0, 0.5]


@dataclass
class Base:
    shape: tuple
    dtype: str  # "float32", ...
    salt: int


@dataclass
class Node:
    kind: str  # tensor | const | dict | list | tuple | td | tc | nontensor
    base: int = -1  # tensor: index into the pool
    view: str = ""  # tensor: "", "[1:]", ".t()", "[0]", ".unsqueeze(0)"
    value: Any = None  # const / nontensor
    items: list = field(default_factory=list)  # [(key, Node)] for dict/td/tc, [Node] for list/tuple
    batch: tuple = ()


def view_shape(shape: tuple, view: str) -> tuple | None:
    """The shape of ``x{view}`` for ``x`` of ``shape``; ``None`` where it does not apply."""
    if view == "":
        return shape
    if view == "[1:]":
        return (shape[0] - 1,) + shape[1:] if len(shape) >= 1 and shape[0] >= 2 else None
    if view == ".t()":
        return (shape[1], shape[0]) if len(shape) == 2 else None
    if view == "[0]":
        return shape[1:] if len(shape) >= 1 else None
    if view == ".unsqueeze(0)":
        return (1,) + shape
    raise AssertionError(view)


VIEWS = ["[1:]", ".t()", "[0]", ".unsqueeze(0)"]


def _fmt_const(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)  # repr keeps -0.0
    return repr(value)


class InputTree:
    """Positional and keyword arguments over a pool of base tensors."""

    def __init__(self, pool: list[Base], args: list[Node], kwargs: list[tuple[str, Node]]):
        self.pool, self.args, self.kwargs = pool, args, kwargs

    def copy(self) -> "InputTree":
        return copy.deepcopy(self)

    def render(self, name: str = "make_inputs") -> str:
        lines = [f"def {name}(k):"]
        used = sorted(self._used_bases())
        for i in used:
            b = self.pool[i]
            lines.append(f"    t{i} = val({b.shape!r}, k, torch.{b.dtype}, {b.salt})")
        args = ", ".join(self._render(n) for n in self.args)
        if len(self.args) == 1:
            args += ","
        kwargs = ", ".join(f"{k!r}: {self._render(n)}" for k, n in self.kwargs)
        lines.append(f"    return ({args}), {{{kwargs}}}")
        return "\n".join(lines) + "\n"

    def _used_bases(self) -> set:
        out = set()

        def walk(n):
            if n.kind == "tensor":
                out.add(n.base)
            for item in n.items:
                walk(item[1] if isinstance(item, tuple) else item)

        for n in self.args:
            walk(n)
        for _, n in self.kwargs:
            walk(n)
        return out

    def _render(self, n: Node) -> str:
        if n.kind == "tensor":
            return f"t{n.base}{n.view}"
        if n.kind in ("const", "nontensor"):
            return _fmt_const(n.value)
        if n.kind == "dict":
            return "{" + ", ".join(f"{k!r}: {self._render(v)}" for k, v in n.items) + "}"
        if n.kind == "list":
            return "[" + ", ".join(self._render(v) for v in n.items) + "]"
        if n.kind == "tuple":
            inner = ", ".join(self._render(v) for v in n.items)
            return f"({inner},)" if len(n.items) == 1 else f"({inner})"
        if n.kind == "td":
            inner = ", ".join(f"{k!r}: {self._render(v)}" for k, v in n.items)
            return f"TensorDict({{{inner}}}, batch_size={list(n.batch)})"
        if n.kind == "tc":
            inner = ", ".join(f"{k}={self._render(v)}" for k, v in n.items)
            return f"Pair({inner}, batch_size={list(n.batch)})"
        raise AssertionError(n.kind)

    def shape_of(self, n: Node) -> tuple:
        return view_shape(self.pool[n.base].shape, n.view)

    def dtype_of(self, n: Node) -> torch.dtype:
        return getattr(torch, self.pool[n.base].dtype)

    def all_nodes(self):
        """(node, parent_kind, batch-prefix the node must keep) for every node."""
        out = []

        def walk(n, parent, prefix):
            out.append((n, parent, prefix))
            if n.kind in ("td", "tc"):
                for _, v in n.items:
                    walk(v, n.kind, n.batch)
            else:
                for item in n.items:
                    walk(item[1] if isinstance(item, tuple) else item, n.kind, ())

        for n in self.args:
            walk(n, "args", ())
        for _, n in self.kwargs:
            walk(n, "kwargs", ())
        return out


# -- focus: what a test emphasises ------------------------------------------------------
@dataclass(frozen=True)
class Focus:
    name: str
    alias: float = 0.15  # probability that a tensor leaf re-uses the pool
    td: float = 0.2  # weight of TensorDicts among containers
    tc: float = 0.08
    consts: float = 0.2
    ops: tuple = (0, 4)
    w_compute: int = 4
    w_inplace: int = 2
    w_mutate: int = 2
    w_observe: int = 1
    changed: float = 0.5
    td_mutate: float = 0.3  # probability that a mutation goes to a TensorDict, if there is one
    reuse: float = 0.25  # probability that calls reuse the objects of the call before


FOCUS = {
    "mixed": Focus("mixed", ops=(1, 5)),
    "tensordict": Focus("tensordict", td=0.7, tc=0.1, ops=(2, 6), w_mutate=4, w_observe=2, td_mutate=0.8),
    "aliasing": Focus("aliasing", alias=0.6, ops=(1, 5), w_inplace=5, w_mutate=2),
    "mutation": Focus("mutation", w_inplace=4, w_mutate=5, ops=(2, 6)),
    "outputs": Focus("outputs", ops=(0, 3), w_inplace=1, w_mutate=1),
    "signature": Focus("signature", consts=0.5, changed=1.0),
}


# -- drawing the inputs -----------------------------------------------------------------
class _InputDrawer:
    def __init__(self, draw, focus: Focus):
        self.draw, self.focus = draw, focus
        self.pool: list[Base] = []

    def p(self, prob: float) -> bool:
        return chance(self.draw, prob)

    def new_base(self, prefix: tuple) -> int:
        draw = self.draw
        extra = tuple(draw(st.lists(st.integers(1, 4), min_size=0 if prefix else 1, max_size=2)))
        dtype = draw(st.sampled_from(["float32", "float32", "float32", "float64", "int64", "bool"]))
        self.pool.append(Base(prefix + extra, dtype, len(self.pool)))
        return len(self.pool) - 1

    def tensor(self, prefix: tuple = ()) -> Node:
        draw = self.draw
        if self.pool and self.p(self.focus.alias):
            options = []
            for i, b in enumerate(self.pool):
                for view in [""] + VIEWS:
                    shape = view_shape(b.shape, view)
                    if shape is not None and shape[: len(prefix)] == prefix:
                        options.append((i, view))
            if options:
                i, view = draw(st.sampled_from(options))
                return Node("tensor", base=i, view=view)
        i = self.new_base(prefix)
        view = ""
        if self.p(0.15):  # a view of a tensor nobody else holds
            views = [v for v in VIEWS if (s := view_shape(self.pool[i].shape, v)) is not None
                     and s[: len(prefix)] == prefix and len(s) >= 1]
            if views:
                view = draw(st.sampled_from(views))
        return Node("tensor", base=i, view=view)

    def const(self) -> Node:
        draw = self.draw
        kind = draw(st.sampled_from(["float", "float", "int", "bool", "str", "none"]))
        if kind == "float":
            value = draw(st.sampled_from(FLOAT_CONSTS * 3 + [float("nan"), float("inf")]))
        elif kind == "int":
            value = draw(st.integers(-3, 3))
        elif kind == "bool":
            value = draw(st.booleans())
        elif kind == "str":
            value = draw(st.sampled_from(["a", "mode", ""]))
        else:
            value = None
        return Node("const", value=value)

    def keys(self, n: int) -> list[str]:
        return self.draw(st.lists(st.sampled_from(KEYS), min_size=n, max_size=n, unique=True))

    def td(self, batch: tuple, depth: int) -> Node:
        draw = self.draw
        n = draw(st.integers(1, 3))
        # sometimes every entry shares a leading dim beyond the batch size (so that the
        # body can set a larger batch_size)
        prefix = batch + ((draw(st.integers(1, 4)),) if self.p(0.3) else ())
        items = []
        for key in self.keys(n):
            r = draw(st.integers(0, 99))
            if depth > 0 and r >= 70:
                # a nested TensorDict, sometimes with more batch dims than its parent
                child = prefix + tuple(draw(st.lists(st.integers(1, 4), max_size=1)))
                items.append((key, self.td(child, depth - 1)))
            elif r >= 65:
                items.append((key, Node("nontensor", value=draw(st.sampled_from(["abc", "z"])))))
            else:
                items.append((key, self.tensor(prefix)))
        return Node("td", items=items, batch=batch)

    def batch(self) -> tuple:
        return tuple(self.draw(st.lists(st.integers(1, 4), max_size=2))) if self.p(0.7) else ()

    def node(self, depth: int) -> Node:
        draw = self.draw
        f = self.focus
        kinds = ["tensor"] * 6 + ["const"] * round(10 * f.consts)
        if depth > 0:
            kinds += ["dict"] * 2 + ["list", "tuple"] + ["td"] * round(10 * f.td) + ["tc"] * round(10 * f.tc)
        kind = draw(st.sampled_from(kinds))
        if kind == "tensor":
            return self.tensor()
        if kind == "const":
            return self.const()
        if kind == "dict":
            keys = self.keys(draw(st.integers(0, 3)))
            return Node("dict", items=[(k, self.node(depth - 1)) for k in keys])
        if kind in ("list", "tuple"):
            return Node(kind, items=[self.node(depth - 1) for _ in range(draw(st.integers(0, 3)))])
        if kind == "td":
            return self.td(self.batch(), depth - 1)
        if kind == "tc":
            batch = tuple(draw(st.lists(st.integers(1, 4), max_size=1)))
            return Node("tc", items=[("obs", self.tensor(batch)), ("reward", self.tensor(batch))], batch=batch)
        raise AssertionError(kind)

    def tree(self) -> InputTree:
        draw = self.draw
        n_args = draw(st.integers(1, 3))
        n_kwargs = draw(st.integers(0, 2))
        args = [self.node(2) for _ in range(n_args)]
        kwargs = [(f"k{i}", self.node(2)) for i in range(n_kwargs)]
        return InputTree(self.pool, args, kwargs)


# -- one change of signature --------------------------------------------------------------
def _changed_const(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, float):
        if value == 0.0:
            return -0.0 if math.copysign(1, value) > 0 else 0.0
        if math.isnan(value):
            return 0.0
        return value + 1.0
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return 0  # None -> 0


_CHANGE_ORDER = ["const", "dtype", "shape", "extra-key", "missing-key", "list-append", "td-extra-key",
                 "td-batch", "unalias", "alias"]


def draw_change(draw, tree: InputTree) -> tuple[InputTree, str] | None:
    """The same tree with one change of signature, and what changed."""
    tree = tree.copy()
    nodes = tree.all_nodes()
    options = []
    for n, parent, prefix in nodes:
        if n.kind in ("const", "nontensor"):
            options.append(("const", n))
        if n.kind == "td" and len(n.batch) > len(prefix):
            options.append(("td-batch", n))
        if n.kind == "dict":
            options.append(("extra-key", n))
            if n.items:
                options.append(("missing-key", n))
        if n.kind == "list":
            options.append(("list-append", n))
        if n.kind == "td":
            options.append(("td-extra-key", n))
    # a base tensor: dtype always; shape where no TensorDict holds its last dim in its batch
    need: dict[int, int] = {}
    for n, parent, prefix in nodes:
        if n.kind == "tensor":
            need[n.base] = max(need.get(n.base, 0), len(prefix) + (1 if n.view in ("[0]", ".t()") else 0))
    for i, b in enumerate(tree.pool):
        if i in need:
            options.append(("dtype", i))
            if len(b.shape) > need[i] and len(b.shape) >= 1:
                options.append(("shape", i))
    # aliasing: two uses of one tensor made two tensors, or two same-shape tensors made one
    uses: dict[int, list[Node]] = {}
    for n, parent, prefix in nodes:
        if n.kind == "tensor":
            uses.setdefault(n.base, []).append(n)
    for i, ns in uses.items():
        if len(ns) >= 2:
            options.append(("unalias", ns[-1]))
    plain = [n for n, _, _ in nodes if n.kind == "tensor" and n.view == ""]
    for a in plain:
        for b in plain:
            if a.base < b.base and tree.pool[a.base].shape == tree.pool[b.base].shape and \
                    tree.pool[a.base].dtype == tree.pool[b.base].dtype:
                options.append(("alias", (a, b)))
    if not options:
        return None
    kind = draw(st.sampled_from(sorted({k for k, _ in options}, key=_CHANGE_ORDER.index)))
    target = draw(st.sampled_from([t for k, t in options if k == kind]))
    if kind == "const":
        old = target.value
        target.value = _changed_const(old)
        what = f"constant {_fmt_const(old)} -> {_fmt_const(target.value)}"
    elif kind == "extra-key":
        key = next(k for k in KEYS + ["extra"] if k not in [k2 for k2, _ in target.items])
        tree.pool.append(Base((2,), "float32", len(tree.pool)))
        target.items.append((key, Node("tensor", base=len(tree.pool) - 1)))
        what = f"dict gets an extra key {key!r}"
    elif kind == "missing-key":
        key, _ = target.items.pop(draw(st.integers(0, len(target.items) - 1)))
        what = f"dict loses key {key!r}"
    elif kind == "list-append":
        target.items.append(Node("const", value=1))
        what = "list gets one more item"
    elif kind == "td-extra-key":
        key = next(k for k in KEYS + ["extra"] if k not in [k2 for k2, _ in target.items])
        tree.pool.append(Base(target.batch + (2,), "float32", len(tree.pool)))
        target.items.append((key, Node("tensor", base=len(tree.pool) - 1)))
        what = f"TensorDict gets an extra key {key!r}"
    elif kind == "td-batch":
        old = target.batch
        target.batch = old[:-1]
        what = f"a TensorDict's batch_size {list(old)} -> {list(target.batch)}"
    elif kind == "dtype":
        b = tree.pool[target]
        new = {"float32": "float64", "float64": "float32", "int64": "int32", "bool": "uint8"}[b.dtype]
        what = f"t{target}: dtype {b.dtype} -> {new}"
        b.dtype = new
    elif kind == "shape":
        b = tree.pool[target]
        old = b.shape
        b.shape = old[:-1] + (old[-1] + 1,)
        what = f"t{target}: shape {old} -> {b.shape}"
    elif kind == "unalias":
        b = tree.pool[target.base]
        tree.pool.append(Base(b.shape, b.dtype, b.salt))  # same values, another tensor
        old = target.base
        target.base = len(tree.pool) - 1
        what = f"a use of t{old} gets its own tensor t{target.base} (same values)"
    else:  # alias
        a, b = target
        what = f"t{b.base} replaced by t{a.base} (one tensor passed twice)"
        b.base = a.base
    return tree, what


# -- the body: a symbolic environment -----------------------------------------------------
@dataclass
class TRef:
    expr: str
    shape: tuple
    dtype: torch.dtype
    path: tuple  # where it lives in the inputs ((), for locals)
    input: bool  # an input tensor or a view of one (else: a new tensor)


@dataclass
class CRef:
    kind: str  # dict | list | td | tc
    expr: str
    path: tuple
    batch: tuple = ()
    parent_batch: tuple = ()
    length: int = 0  # list
    nontensor: bool = False  # td holds non-tensor entries


@dataclass
class KRef:  # a non-tensor value the body can use
    expr: str
    value: Any
    path: tuple


class Env:
    def __init__(self):
        self.tensors: list[TRef] = []
        self.containers: list[CRef] = []
        self.consts: list[KRef] = []
        self.local_objs: list[tuple[str, str, tuple]] = []  # (expr, kind, batch) of local TDs etc.
        self.n_locals = 0
        self.lines: list[str] = []

    def local(self) -> str:
        name = f"v{self.n_locals}"
        self.n_locals += 1
        return name

    def drop_under(self, path: tuple) -> None:
        """Forget every reference at or under ``path`` (a key was popped or rebound)."""
        def under(p):
            return p[: len(path)] == path and len(p) >= len(path)

        self.tensors = [t for t in self.tensors if not (t.path and under(t.path))]
        self.containers = [c for c in self.containers if not under(c.path)]
        self.consts = [c for c in self.consts if not (c.path and under(c.path))]

    def children(self, c: CRef) -> tuple[list[TRef], list[CRef], list[KRef]]:
        n = len(c.path) + 1
        return (
            [t for t in self.tensors if t.path and len(t.path) == n and t.path[:-1] == c.path],
            [x for x in self.containers if len(x.path) == n and x.path[:-1] == c.path],
            [x for x in self.consts if x.path and len(x.path) == n and x.path[:-1] == c.path],
        )

    def leaf_tensors(self, c: CRef) -> list[TRef]:
        n = len(c.path)
        return [t for t in self.tensors if t.path and len(t.path) > n and t.path[:n] == c.path]


def env_from_tree(tree: InputTree) -> Env:
    env = Env()

    def walk(n: Node, expr: str, path: tuple, batch: tuple, parent_kind: str):
        if n.kind == "tensor":
            env.tensors.append(TRef(expr, tree.shape_of(n), tree.dtype_of(n), path, True))
        elif n.kind in ("const", "nontensor"):
            env.consts.append(KRef(expr, n.value, path))
        elif n.kind == "dict":
            env.containers.append(CRef("dict", expr, path))
            for k, v in n.items:
                walk(v, f"{expr}[{k!r}]", path + (k,), (), "dict")
        elif n.kind in ("list", "tuple"):
            if n.kind == "list":
                env.containers.append(CRef("list", expr, path, length=len(n.items)))
            for i, v in enumerate(n.items):
                walk(v, f"{expr}[{i}]", path + (i,), (), n.kind)
        elif n.kind == "td":
            nontensor = any(v.kind == "nontensor" for _, v in n.items)
            env.containers.append(CRef("td", expr, path, n.batch, batch, nontensor=nontensor))
            for k, v in n.items:
                walk(v, f"{expr}[{k!r}]", path + (k,), n.batch, "td")
        elif n.kind == "tc":
            env.containers.append(CRef("tc", expr, path, n.batch))
            for k, v in n.items:
                walk(v, f"{expr}.{k}", path + (k,), n.batch, "tc")

    for i, n in enumerate(tree.args):
        walk(n, f"a{i}", (("arg", i),), (), "args")
    for name, n in tree.kwargs:
        walk(n, name, (("kw", name),), (), "kwargs")
    return env


def _prefix(shapes: list[tuple]) -> tuple:
    if not shapes:
        return ()
    out = []
    for dims in zip(*shapes):
        if all(d == dims[0] for d in dims):
            out.append(dims[0])
        else:
            break
    return tuple(out)


class _BodyDrawer:
    def __init__(self, draw, focus: Focus, env: Env):
        self.draw, self.focus, self.env = draw, focus, env
        self.tags: set[str] = set()

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    # -- expressions ------------------------------------------------------------------
    def compute_expr(self, t: TRef) -> tuple[str, tuple, torch.dtype]:
        """A new tensor computed from ``t``: (source, shape, dtype)."""
        options = []
        if t.dtype == torch.bool:
            options += [(f"~{t.expr}", t.shape, torch.bool), (f"{t.expr}.float()", t.shape, torch.float32)]
        elif t.dtype.is_floating_point:
            options += [
                (f"({t.expr} * 2 + 1)", t.shape, t.dtype),
                (f"(-{t.expr})", t.shape, t.dtype),
                (f"{t.expr}.abs()", t.shape, t.dtype),
                (f"{t.expr}.clamp(min=0)", t.shape, t.dtype),
            ]
            if len(t.shape) == 2:
                options.append((f"({t.expr} @ {t.expr}.t())", (t.shape[0], t.shape[0]), t.dtype))
        else:
            options += [(f"({t.expr} + 1)", t.shape, t.dtype), (f"({t.expr} * 2).double()", t.shape, torch.float64)]
        if len(t.shape) >= 1:
            sdtype = t.dtype if t.dtype != torch.bool else torch.int64
            if t.dtype in (torch.int32, torch.uint8):
                sdtype = torch.int64
            options += [(f"{t.expr}.flip(0)", t.shape, t.dtype), (f"{t.expr}.sum(0)", t.shape[1:], sdtype)]
        # with a constant argument
        for c in self.env.consts:
            v = c.value
            if isinstance(v, float) and t.dtype.is_floating_point:
                options.append((f"({t.expr} * {c.expr})", t.shape, t.dtype))
            elif isinstance(v, (bool, int)) and not isinstance(v, bool) and t.dtype != torch.bool:
                options.append((f"({t.expr} + {c.expr})", t.shape, t.dtype if t.dtype != torch.uint8 else torch.int64))
            elif isinstance(v, bool) and t.dtype.is_floating_point:
                options.append((f"({t.expr} if {c.expr} else -{t.expr})", t.shape, t.dtype))
            elif isinstance(v, str) and t.dtype.is_floating_point:
                options.append((f"({t.expr} * (2 if {c.expr} == 'mode' else 3))", t.shape, t.dtype))
            elif v is None and t.dtype.is_floating_point:
                options.append((f"({t.expr} + (1 if {c.expr} is None else 2))", t.shape, t.dtype))
        # with another tensor of the same shape
        for o in self.env.tensors:
            if o is not t and o.shape == t.shape and t.dtype.is_floating_point and o.dtype.is_floating_point:
                options.append((f"({t.expr} + {o.expr})", t.shape, torch.promote_types(t.dtype, o.dtype)))
        return self.pick(options)

    def view_expr(self, t: TRef) -> tuple[str, tuple] | None:
        views = [(v, s) for v in VIEWS if (s := view_shape(t.shape, v)) is not None]
        if not views:
            return None
        v, s = self.pick(views)
        return f"{t.expr}{v}", s

    def value_expr(self, prefix: tuple = (), allow_const: bool = False) -> tuple[str, tuple | None, torch.dtype | None]:
        """Something to store: a tensor (input as is, a view, new) or a constant."""
        tensors = [t for t in self.env.tensors if t.shape[: len(prefix)] == prefix]
        kinds = []
        if tensors:
            kinds += ["as-is", "compute", "compute", "view"]
        if allow_const or not tensors:
            kinds.append("const")
        kind = self.pick(kinds)
        if kind == "const":
            if self.env.consts and self.draw(st.booleans()):
                c = self.pick(self.env.consts)
                return c.expr, None, None
            return repr(self.pick([1, 2.5, "s", None])), None, None
        t = self.pick(tensors)
        if kind == "as-is":
            return t.expr, t.shape, t.dtype
        if kind == "view":
            v = self.view_expr(t)
            if v is not None and v[1][: len(prefix)] == prefix:
                return v[0], v[1], t.dtype
        src, shape, dtype = self.compute_expr(t)
        if shape[: len(prefix)] != prefix:
            return t.expr, t.shape, t.dtype
        return src, shape, dtype

    # -- statements ---------------------------------------------------------------------
    def op_compute(self) -> bool:
        if not self.env.tensors:
            return False
        t = self.pick(self.env.tensors)
        src, shape, dtype = self.compute_expr(t)
        name = self.env.local()
        self.env.lines.append(f"{name} = {src}")
        self.env.tensors.append(TRef(name, shape, dtype, (), False))
        self.tags.add("compute")
        return True

    def op_inplace(self) -> bool:
        targets = [t for t in self.env.tensors if t.input]
        if not targets:
            return False
        t = self.pick(targets)
        if t.dtype == torch.bool:
            stmts = [f"{t.expr}.logical_not_()"]
        else:
            stmts = [f"{t.expr}.add_(1)", f"{t.expr}.mul_(2)", f"{t.expr}.data.add_(1)"]
            if len(t.shape) >= 1:
                stmts.append(f"{t.expr}[0].add_(1)")
        sources = [o for o in self.env.tensors if o.shape == t.shape and o is not t]
        if sources:
            o = self.pick(sources)
            stmts.append(f"{t.expr}.copy_({o.expr} * 2)" if o.dtype.is_floating_point else f"{t.expr}.copy_({o.expr})")
        stmt = self.pick(stmts)
        self.env.lines.append(stmt)
        self.tags.add("inplace-data" if ".data." in stmt else "inplace")
        return True

    def op_mutate(self) -> bool:
        env = self.env
        mutable = [c for c in env.containers if c.kind in ("dict", "list", "td", "tc")]
        if not mutable:
            return False
        tds = [c for c in mutable if c.kind == "td"]
        c = self.pick(tds if tds and chance(self.draw, self.focus.td_mutate) else mutable)
        tensors, subs, consts = env.children(c)
        if c.kind == "dict":
            keys = [t.path[-1] for t in tensors] + [x.path[-1] for x in subs] + [x.path[-1] for x in consts]
            choice = self.pick(["set-new", "set-new", "rebind", "pop", "del"] if keys else ["set-new"])
            if tensors and chance(self.draw, 0.2):
                choice = "pop-reset"
                self._pop_reset(c, self.pick(tensors), ())
            elif choice == "set-new":
                key = self.pick([k for k in KEYS + ["new"] if k not in keys])
                src, shape, dtype = self.value_expr(allow_const=True)
                env.lines.append(f"{c.expr}[{key!r}] = {src}")
                self._register(c, key, src, shape, dtype)
            else:
                key = self.pick(keys)
                env.drop_under(c.path + (key,))
                if choice == "rebind":
                    src, shape, dtype = self.value_expr(allow_const=True)
                    env.lines.append(f"{c.expr}[{key!r}] = {src}")
                    self._register(c, key, src, shape, dtype)
                else:
                    self._remove(c, key, choice, tensors + subs + consts)
            self.tags.add(f"dict-{choice}")
            return True
        if c.kind == "list":
            choice = self.pick(["append", "append", "pop"] if c.length else ["append"])
            if choice == "append":
                src, shape, dtype = self.value_expr(allow_const=True)
                env.lines.append(f"{c.expr}.append({src})")
                self._register(c, c.length, src, shape, dtype)
                c.length += 1
            else:
                c.length -= 1
                name = env.local()
                env.lines.append(f"{name} = {c.expr}.pop()")
                env.drop_under(c.path + (c.length,))
                self._popped(name, tensors + subs + consts, c.length)
            self.tags.add(f"list-{choice}")
            return True
        if c.kind == "tc":
            fld = self.pick(["obs", "reward"])
            src, shape, dtype = self.value_expr(prefix=c.batch)
            if shape is None:
                return False
            env.drop_under(c.path + (fld,))
            env.lines.append(f"{c.expr}.{fld} = {src}")
            self._register(c, fld, src, shape, dtype, attr=True)
            self.tags.add("tc-set")
            return True
        # a TensorDict
        keys = [t.path[-1] for t in tensors] + [x.path[-1] for x in subs] + [x.path[-1] for x in consts]
        choices = ["set-new", "set-new"]
        if tensors:
            choices.append("rebind")
        if keys:
            choices += ["del", "pop"]
        candidates = self._batch_candidates(c)
        if candidates:
            choices += ["batch_size", "batch_size"]
        choices.append("set-nested")
        if tensors:
            choices.append("pop-reset")
        if [x for x in subs if x.kind == "td"]:
            choices.append("change-nested-then-remove")
        choice = self.pick(choices)
        if choice == "pop-reset":
            self._pop_reset(c, self.pick(tensors), c.batch)
        elif choice == "change-nested-then-remove":
            self._change_nested_then_remove(c, self.pick([x for x in subs if x.kind == "td"]))
        elif choice in ("set-new", "set-nested", "rebind"):
            src, shape, dtype = self.value_expr(prefix=c.batch)
            if shape is None or shape[: len(c.batch)] != c.batch:
                return False
            if choice == "rebind":
                key = self.pick([t.path[-1] for t in tensors])
                env.drop_under(c.path + (key,))
            else:
                key = self.pick([k for k in KEYS + ["new"] if k not in keys])
            if choice == "set-nested":
                env.lines.append(f"{c.expr}[{key!r}, 'leaf'] = {src}")
                sub = CRef("td", f"{c.expr}[{key!r}]", c.path + (key,), c.batch, c.batch)
                env.containers.append(sub)
                self._register(sub, "leaf", src, shape, dtype)
            else:
                env.lines.append(f"{c.expr}[{key!r}] = {src}")
                self._register(c, key, src, shape, dtype)
        elif choice == "batch_size":
            new = self.pick(candidates)
            env.lines.append(f"{c.expr}.batch_size = {list(new)}")
            c.batch = new
            for s in subs:
                s.parent_batch = new
        else:
            key = self.pick(keys)
            env.drop_under(c.path + (key,))
            self._remove(c, key, choice, tensors + subs + consts)
        self.tags.add(f"td-{choice}")
        return True

    def _pop_reset(self, c: CRef, t: TRef, prefix: tuple) -> None:
        """``v = c.pop(key); c[key] = f(v)``: the key moves to the end of the container."""
        env = self.env
        key = t.path[-1]
        env.drop_under(c.path + (key,))
        name = env.local()
        env.lines.append(f"{name} = {c.expr}.pop({key!r})")
        local = TRef(name, t.shape, t.dtype, (), True)
        env.tensors.append(local)
        src, shape, dtype = name, t.shape, t.dtype
        if self.draw(st.booleans()):
            src2, shape2, dtype2 = self.compute_expr(local)
            if shape2[: len(prefix)] == prefix:
                src, shape, dtype = src2, shape2, dtype2
        env.lines.append(f"{c.expr}[{key!r}] = {src}")
        self._register(c, key, src, shape, dtype)

    def _change_nested_then_remove(self, c: CRef, sub: CRef) -> None:
        """Write into a nested TensorDict (a key, its batch size, a value), then remove it."""
        env = self.env
        key = sub.path[-1]
        tensors = env.leaf_tensors(sub)
        options = ["set"]
        candidates = self._batch_candidates(sub)
        if candidates:
            options.append("batch_size")
        if tensors:
            options.append("inplace")
        what = self.pick(options)
        if what == "batch_size":
            env.lines.append(f"{sub.expr}.batch_size = {list(self.pick(candidates))}")
        elif what == "inplace":
            t = self.pick(tensors)
            env.lines.append(f"{t.expr}.logical_not_()" if t.dtype == torch.bool else f"{t.expr}.mul_(2)")
        else:
            src, shape, _ = self.value_expr(prefix=sub.batch)
            if shape is not None and shape[: len(sub.batch)] == sub.batch:
                env.lines.append(f"{sub.expr}['new'] = {src}")
        env.drop_under(sub.path)
        if self.draw(st.booleans()):
            env.lines.append(f"{env.local()} = {c.expr}.pop({key!r})")
        else:
            env.lines.append(f"del {c.expr}[{key!r}]")

    def _batch_candidates(self, c: CRef) -> list[tuple]:
        if c.nontensor:
            return []
        tensors, subs, consts = self.env.children(c)
        if consts or not (tensors or subs):
            return []
        common = _prefix([t.shape for t in tensors] + [s.batch for s in subs])
        out = []
        for n in range(len(c.parent_batch), len(common) + 1):
            cand = common[:n]
            if cand[: len(c.parent_batch)] == c.parent_batch and cand != c.batch:
                out.append(cand)
        return out

    def _register(self, c: CRef, key, src: str, shape, dtype, attr: bool = False) -> None:
        expr = f"{c.expr}.{key}" if attr else f"{c.expr}[{key!r}]"
        if shape is not None:
            # now held by the caller's container: writing into it writes into the caller's state
            self.env.tensors.append(TRef(expr, shape, dtype, c.path + (key,), True))
        else:
            self.env.consts.append(KRef(expr, None, c.path + (key,)))

    def _remove(self, c, key, choice: str, refs) -> None:
        """``v = c.pop(key)`` (tracking what ``v`` holds) or ``del c[key]``."""
        env = self.env
        if choice == "pop":
            name = env.local()
            env.lines.append(f"{name} = {c.expr}.pop({key!r})")
            self._popped(name, refs, key)
        else:
            env.lines.append(f"del {c.expr}[{key!r}]")

    def _popped(self, name: str, before: list, key) -> None:
        for ref in before:
            if ref.path and ref.path[-1] == key:
                if isinstance(ref, TRef):
                    self.env.tensors.append(TRef(name, ref.shape, ref.dtype, (), True))
                elif isinstance(ref, KRef):
                    self.env.consts.append(KRef(name, ref.value, ()))
                return

    def op_observe(self) -> bool:
        """Statements whose result depends on container order, batch sizes or TensorDict ops."""
        env = self.env
        options = []
        for c in env.containers:
            if c.kind in ("dict", "td"):
                options.append(("keys", c))
            if c.kind == "list":
                options.append(("len", c))
            if c.kind == "td":
                options.append(("batch", c))
                if env.leaf_tensors(c):
                    options.append(("cat", c))
                if not c.nontensor:
                    options += [("apply", c), ("clone", c), ("exclude", c)]
                    if c.batch:
                        options.append(("index", c))
            if c.kind == "tc" and c.batch:
                options.append(("index", c))
        if not options:
            return False
        what, c = self.pick(options)
        name = env.local()
        if what == "keys":
            env.lines.append(f"{name} = list({c.expr}.keys())")
            env.consts.append(KRef(name, [], ()))
        elif what == "len":
            env.lines.append(f"{name} = len({c.expr})")
            env.consts.append(KRef(name, 0, ()))
        elif what == "batch":
            env.lines.append(f"{name} = tuple({c.expr}.batch_size)")
            env.consts.append(KRef(name, (), ()))
        elif what == "cat":
            env.lines.append(
                f"{name} = torch.cat([x.reshape(-1).double() for x in {c.expr}.values(True, True)"
                " if isinstance(x, torch.Tensor)])"
            )
            n = sum(math.prod(t.shape) for t in env.leaf_tensors(c))
            env.tensors.append(TRef(name, (n,), torch.float64, (), False))
        elif what == "apply":
            env.lines.append(f"{name} = {c.expr}.apply(lambda x: x * 2)")
            env.local_objs.append((name, "td", c.batch))
        elif what == "clone":
            env.lines.append(f"{name} = {c.expr}.clone()")
            env.local_objs.append((name, "td", c.batch))
        elif what == "exclude":
            tensors, subs, consts = env.children(c)
            keys = [x.path[-1] for x in tensors + subs + consts]
            key = self.pick(keys) if keys else "x"
            env.lines.append(f"{name} = {c.expr}.exclude({key!r})")
            env.local_objs.append((name, "td", c.batch))
        elif what == "index":
            env.lines.append(f"{name} = {c.expr}[0]")
            env.local_objs.append((name, c.kind, c.batch[1:]))
        self.tags.add(f"observe-{what}")
        return True

    # -- the return value -----------------------------------------------------------------
    def out_item(self, depth: int) -> tuple[str, tuple | None]:
        """One returned value: (source, shape if it is a tensor)."""
        env = self.env
        kinds = ["new", "new", "input", "view", "const"]
        if env.containers:
            kinds.append("container")
        if env.local_objs:
            kinds.append("local-obj")
        if depth > 0:
            kinds += ["struct", "struct"]
        kind = self.pick(kinds)
        if kind in ("new", "input", "view") and env.tensors:
            if kind == "new":
                locals_ = [t for t in env.tensors if not t.input]
                if locals_ and self.draw(st.booleans()):
                    t = self.pick(locals_)
                    return t.expr, t.shape
                src, shape, _ = self.compute_expr(self.pick(env.tensors))
                self.tags.add("out-new")
                return src, shape
            t = self.pick(env.tensors)
            if kind == "view":
                v = self.view_expr(t)
                if v is not None:
                    self.tags.add("out-view")
                    return v
            self.tags.add("out-input" if t.input else "out-new")
            return t.expr, t.shape
        if kind == "container":
            c = self.pick(env.containers)
            self.tags.add(f"out-input-{c.kind}")
            return c.expr, None
        if kind == "local-obj":
            expr, okind, _ = self.pick(env.local_objs)
            self.tags.add("out-local-td")
            return expr, None
        if kind == "struct" and depth > 0:
            return self.out_struct(depth - 1), None
        if env.consts and self.draw(st.booleans()):
            self.tags.add("out-const")
            return self.pick(env.consts).expr, None
        return repr(self.pick([None, 1, -0.0, "s"])), None

    def shared(self) -> list[tuple[str, tuple]]:
        """A local bound once and returned twice, or with a view of it."""
        env = self.env
        if not env.tensors:
            return []
        t = self.pick(env.tensors)
        name = t.expr
        choice = self.pick(["twice", "view-of-output"])
        if choice == "twice":
            self.tags.add("out-same-twice")
            return [(name, t.shape), (name, t.shape)]
        v = self.view_expr(TRef(name, t.shape, t.dtype, (), False))
        if v is None:
            return [(name, t.shape), (name, t.shape)]
        self.tags.add("out-view-of-output")
        return [(name, t.shape), v]

    def out_struct(self, depth: int) -> str:
        draw = self.draw
        n = draw(st.integers(1, 3))
        items = [self.out_item(depth) for _ in range(n)]
        if chance(self.draw, 0.35):
            items += self.shared()
        kind = self.pick(["tuple", "tuple", "list", "dict", "td", "td", "tc", "dataclass", "normal"])
        tensors = [(s, shape) for s, shape in items if shape is not None]
        if kind in ("td", "tc", "normal") and len(tensors) < 2 and self.env.tensors:
            src, shape, _ = self.compute_expr(self.pick(self.env.tensors))
            items.append((src, shape))
            tensors.append((src, shape))
        if kind == "td" and tensors:
            return self._out_td(tensors)
        if kind == "tc" and len(tensors) >= 2:
            (s1, sh1), (s2, sh2) = tensors[:2]
            batch = _prefix([sh1, sh2])
            batch = batch[: draw(st.integers(0, len(batch)))]
            self.tags.add("out-tensorclass")
            return f"Pair(obs={s1}, reward={s2}, batch_size={list(batch)})"
        if kind == "normal" and tensors:
            s, _ = tensors[0]
            self.tags.add("out-normal")
            if draw(st.booleans()):
                return f"Normal({s}.double(), {s}.double().abs() + 1, validate_args=False)"
            return f"Normal({s}.double(), {s}.double().abs() + 1)"
        if kind == "dataclass":
            self.tags.add("out-dataclass")
            a = items[0][0]
            b = items[1][0] if len(items) > 1 else "None"
            return f"Out(a={a}, b={b})"
        if kind == "dict":
            self.tags.add("out-dict")
            keys = draw(st.lists(st.sampled_from(KEYS + ["z", "w", "q"]), min_size=len(items),
                                 max_size=len(items), unique=True))
            return "{" + ", ".join(f"{k!r}: {s}" for k, (s, _) in zip(keys, items)) + "}"
        if kind == "list":
            return "[" + ", ".join(s for s, _ in items) + "]"
        inner = ", ".join(s for s, _ in items)
        return f"({inner},)" if len(items) == 1 else f"({inner})"

    def _out_td(self, tensors: list[tuple[str, tuple]]) -> str:
        draw = self.draw
        self.tags.add("out-td")
        keys = iter(draw(st.lists(st.sampled_from(KEYS + ["z", "w", "q", "r"]), min_size=len(tensors) + 1,
                                  max_size=len(tensors) + 1, unique=True)))
        nested = len(tensors) >= 2 and draw(st.booleans())
        if nested:
            # the last tensor goes into a child TensorDict, which may have more batch dims
            parent_items, (cs, cshape) = tensors[:-1], tensors[-1]
            child_batch = cshape[: draw(st.integers(0, len(cshape)))]
            pbatch = _prefix([sh for _, sh in parent_items] + [child_batch])
            pbatch = pbatch[: draw(st.integers(0, len(pbatch)))]
            if len(child_batch) > len(pbatch):
                self.tags.add("out-td-nested-batch")
            child = f"TensorDict({{{next(keys)!r}: {cs}}}, batch_size={list(child_batch)})"
            inner = ", ".join(f"{next(keys)!r}: {s}" for s, _ in parent_items)
            return f"TensorDict({{{inner}, {next(keys)!r}: {child}}}, batch_size={list(pbatch)})"
        batch = _prefix([sh for _, sh in tensors])
        batch = batch[: draw(st.integers(0, len(batch)))]
        inner = ", ".join(f"{next(keys)!r}: {s}" for s, _ in tensors)
        return f"TensorDict({{{inner}}}, batch_size={list(batch)})"

    def output(self) -> str:
        if chance(self.draw, 0.25):
            src, _ = self.out_item(0)
            return src
        return self.out_struct(1)


@st.composite
def cases(draw, focus: str = "mixed") -> Case:
    """A :class:`Case`: inputs, a body over them, and the call sequence."""
    f = FOCUS[focus]
    drawer = _InputDrawer(draw, f)
    tree = drawer.tree()
    env = env_from_tree(tree)
    body = _BodyDrawer(draw, f, env)
    n_ops = draw(st.integers(*f.ops))
    ops = (
        [body.op_compute] * f.w_compute
        + [body.op_inplace] * f.w_inplace
        + [body.op_mutate] * f.w_mutate
        + [body.op_observe] * f.w_observe
    )
    for _ in range(n_ops):
        draw(st.sampled_from(ops))()
    ret = body.output()
    params = ", ".join(f"a{i}" for i in range(len(tree.args)))
    if tree.kwargs:
        params += (", " if params else "") + "*, " + ", ".join(name for name, _ in tree.kwargs)
    fn_src = f"def fn({params}):\n" + "".join(f"    {line}\n" for line in env.lines) + f"    return {ret}\n"
    changed_src, changed_what = None, ""
    if chance(draw, f.changed):
        change = draw_change(draw, tree)
        if change is not None:
            changed_tree, changed_what = change
            changed_src = changed_tree.render("make_changed_inputs")
    tags = set(body.tags) | _input_tags(tree)
    return Case(
        inputs_src=tree.render(),
        fn_src=fn_src,
        warmup=draw(st.integers(1, 2)),
        replays=draw(st.integers(1, 3)),
        changed_src=changed_src,
        changed_what=changed_what,
        reuse=chance(draw, f.reuse),
        tags=frozenset(tags),
    )


def _input_tags(tree: InputTree) -> set[str]:
    tags = set()
    seen = {}
    for n, parent, prefix in tree.all_nodes():
        tags.add(f"in-{n.kind}")
        if n.kind == "tensor":
            if n.view:
                tags.add("in-view")
            if n.base in seen:
                tags.add("in-alias")
            seen[n.base] = n
        if n.kind == "td" and any(v.kind == "td" and len(v.batch) > len(n.batch) for _, v in n.items):
            tags.add("in-td-nested-batch")
        if n.kind == "const" and isinstance(n.value, float) and n.value == 0:
            tags.add("in-zero-float")
    if tree.kwargs:
        tags.add("in-kwargs")
    return tags


# -- randomness: compared by distribution -----------------------------------------------
RANDOM_BODIES = {
    "randn_like": "def fn(x, scale):\n    return x * 2, x + torch.randn_like(x) * scale\n",
    "rand_like": "def fn(x, scale):\n    return x * 2, torch.rand_like(x) * scale\n",
    "randn_shape": "def fn(x, scale):\n    return x * 2, torch.randn(x.shape, device=x.device, dtype=x.dtype) * scale\n",
    "dropout": "def fn(x, scale):\n    return x * 2, torch.nn.functional.dropout(x.abs() + scale, p=0.5, training=True)\n",
    "bernoulli": "def fn(x, scale):\n    return x * 2, torch.bernoulli(torch.full_like(x, 0.3)) * scale\n",
    "normal_sample": (
        "def fn(x, scale):\n    d = Normal(x, torch.ones_like(x) * scale, validate_args=False)\n"
        "    return x * 2, d.sample()\n"
    ),
}


@dataclass(frozen=True)
class RandomCase:
    body: str
    n: int
    dtype: str
    scale: float
    warmup: int
    replays: int

    @property
    def fn_src(self) -> str:
        return RANDOM_BODIES[self.body]

    def __repr__(self) -> str:
        return (
            f"RandomCase(body={self.body!r}, n={self.n}, dtype={self.dtype}, scale={self.scale}, "
            f"warmup={self.warmup}, replays={self.replays})\n{self.fn_src}"
        )


@st.composite
def random_cases(draw) -> RandomCase:
    return RandomCase(
        body=draw(st.sampled_from(sorted(RANDOM_BODIES))),
        n=draw(st.sampled_from([4096, 8192])),
        dtype=draw(st.sampled_from(["float32", "float64"])),
        scale=draw(st.sampled_from([1.0, 2.0])),
        warmup=draw(st.integers(1, 2)),
        replays=draw(st.integers(2, 3)),
    )
