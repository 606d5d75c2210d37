"""Scenarios: programs that keep state across calls, run through the wrapper and plainly.

A :class:`~tests.differential.strategies.Case` calls one function with fresh inputs. Many
silent differences need more: state that lives across calls (a module with hooks, an
optimizer and its ``.grad``\\ s, a dict of Python floats), calls made under modes (autocast,
``inference_mode``, ``no_grad``), results held across calls, state changed between calls.

A :class:`Scenario` is source code that defines

- ``build()``: a dict, the *world*: ``world["fn"]`` is the callable to wrap, the rest is
  whatever the steps use (modules, optimizers, containers, a list of held results);
- optionally ``LAYOUTS``: per step, the memory layout of the tensors it passes; a step whose
  layout is not that of every step before it may round otherwise than eager in the last bits
  (a graph computes in its capture's layout) and its floating values are compared so;
- ``step(world, f, i)``: step ``i`` of the program; it calls ``f`` (the wrapper in one world,
  ``world["fn"]`` in the other) under whatever modes it likes, may change the world between
  calls, and returns what the user would look at;
- optionally ``observe(world)``: what else a user can read after a step (``p.grad``, a
  hook's log, a module attribute); by default nothing.

:func:`run_scenario` builds two worlds from one seed and runs the steps in both. After each
step it compares, as :mod:`tests.differential.oracle` does for calls: the step's result and
the observed state (types, structure, values bit for bit, dtypes, shapes, devices,
requires_grad), which objects are the same objects (across every result so far and the
observed state: a result that is the same object at every step where the plain function
gives a new one differs), which tensors alias which (by writing into each), the wrapper's
extra warnings, and errors. At the end every held result is compared again (a later replay
must not overwrite it).

Accepted: equal, or the wrapper raised a :class:`graphmodule.GraphModuleError` before any
effect (the observed state still equals the plain world's before that step); the scenario
ends there. A scenario with ``refusable=False`` must be served: a refusal is a failure.

A scenario with ``also="eager"`` runs a third time, through a wrapper on that backend: it must
serve the same steps as the graphs did, with the plain function's results, and refuse the same
step with the same error class and message (bar the words saying that no graph was captured,
:data:`WITHOUT_GRAPH_WORDS`), with the same counters (its eager calls counting as the graphs'
replays). ``tests/test_fallback.py`` runs every focus so.

Generators live in ``tests/differential/scenario_*.py`` and register a hypothesis strategy
with :func:`register`; ``tests/test_scenarios.py`` fuzzes every registered focus.
"""

from __future__ import annotations

import dataclasses
import os
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from tensordict import TensorDict

from graphmodule import CaptureError, CudaGraphModule, GraphModuleError

from .oracle import (Diff, _call, _short, _Text, compare, failure_type, identity_map, last_bits, probe,
                     refused_by_cuda, show, walk)

__all__ = ["REGISTRY", "WITHOUT_GRAPH_WORDS", "Scenario", "ScenarioOutcome", "check_scenario", "in_graph_words",
           "refusal", "register", "run_scenario"]

# focus name -> a hypothesis strategy drawing Scenarios (filled by the scenario_* modules)
REGISTRY: dict[str, Any] = {}


def register(name: str) -> Callable[[Any], Any]:
    """Register a hypothesis strategy (a function of no argument returning one) as a focus."""

    def deco(strategy: Any) -> Any:
        if name in REGISTRY:
            raise ValueError(f"scenario focus {name!r} is registered twice")
        REGISTRY[name] = strategy
        return strategy

    return deco


HEADER = """\
import torch
from torch import nn
from tensordict import TensorDict
from graphmodule import CudaGraphModule
device = "cpu"  # or "cuda" with backend="cuda"
"""


@dataclass(frozen=True)
class Scenario:
    """One program; ``options`` are keyword options of the wrapper, as ``(name, value)`` pairs."""

    src: str
    steps: int = 6
    warmup: int = 2
    options: tuple = ()
    refusable: bool = True
    tags: frozenset = field(default_factory=frozenset)
    also: str | None = None  # a backend that must accept and refuse what the graphs do

    def compile(self, device: str) -> dict:
        ns = {"torch": torch, "nn": nn, "TensorDict": TensorDict, "device": device, "CudaGraphModule": CudaGraphModule}
        exec(compile(self.src, "<scenario>", "exec"), ns)
        return ns

    def repro(self, backend: str = "simulate") -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.options)
        return (
            HEADER + "\n" + self.src.rstrip() + "\n\n"
            + "torch.manual_seed(0); plain = build()\n"
            + "torch.manual_seed(0); wrapped = build()\n"
            + f"g = CudaGraphModule(wrapped['fn'], warmup={self.warmup}, backend={backend!r}{opts})\n"
            + f"for i in range({self.steps}):\n"
            + "    print(i, step(plain, plain['fn'], i), step(wrapped, g, i))\n"
        )

    def __repr__(self) -> str:  # hypothesis prints the falsifying example with this
        also = f", also={self.also!r}" if self.also else ""
        return (f"Scenario(steps={self.steps}, warmup={self.warmup}, options={dict(self.options)}, "
                f"refusable={self.refusable}, tags={sorted(self.tags)}{also})\n{self.src}")


# the words of a message that differ where no graph was captured (backend="eager", no CUDA):
# (without a graph, with one)
WITHOUT_GRAPH_WORDS = (
    ("was first called after warmup (eagerly: no CUDA graph)", "was captured"),
    (" (a CUDA graph would replay what it read then)", ""),
    ("to warm up again", "to warm up and capture again"),
    ("(as then)", "(as at capture)"),
    ("not in those inputs", "not in the captured inputs"),
)


def in_graph_words(message: str) -> str:
    """``message`` in the words of a wrapper that captured graphs."""
    for eager, graph in WITHOUT_GRAPH_WORDS:
        message = message.replace(eager, graph)
    return message


@dataclass
class ScenarioOutcome:
    scenario: Scenario
    backend: str
    steps: list[str]
    diffs: list[Diff]
    ended: str = "served every step"  # or the step that was refused, the error and its mismatch kinds
    counts: tuple = ()  # the wrapper's counters at the end (see _counts)
    cpu_only: bool = False  # refused where a GPU would serve (a plain optimizer on a CPU, see _run)

    @property
    def ok(self) -> bool:
        return not self.diffs

    def report(self) -> str:
        lines = [f"differential failure ({self.diffs[0].kind}) on backend={self.backend!r}", "",
                 "--- repro " + "-" * 60, self.scenario.repro(self.backend), "--- steps " + "-" * 60,
                 *self.steps, "--- differences " + "-" * 54, *map(str, self.diffs[:12])]
        if len(self.diffs) > 12:
            lines.append(f"... and {len(self.diffs) - 12} more")
        return "\n".join(lines)


def _observe(ns: dict, world: dict) -> Any:
    return ns["observe"](world) if "observe" in ns else None


def _objects(results: list, state: Any) -> list[tuple[str, Any]]:
    objs: list[tuple[str, Any]] = []
    walk(state, "state", objs)
    for i, out in enumerate(results):
        walk(out, f"step{i}", objs)
    return objs


def _counts(g: CudaGraphModule) -> tuple:
    """Counters a graph and an eager signature share: calls served after warmup are replays of
    graphs, eager calls without them."""
    s = g.stats
    served = s.replays if s.captures else s.eager_calls
    return (("warmup_calls", s.warmup_calls), ("served", served), ("evictions", s.evictions),
            ("recaptures", s.recaptures), ("input_mismatches", s.input_mismatches), ("graphs", s.graphs))


def refusal(err: BaseException) -> str:
    """An error as the parity of backends compares it: its class and message, in graphs' words
    (a failed capture: its cause and place; the original error's text is the runner's)."""
    if isinstance(err, CaptureError):
        return f"CaptureError ({err.cause}) at {err.where}"
    # (an error that repeats an earlier failed capture's: that capture's original error text cut)
    text = re.sub(r"(failed to capture its CUDA graph at [^:]+:\d+ in \S+): [^\n]*", r"\1", str(err))
    return f"{type(err).__name__}: {in_graph_words(text)}"


def _ended(label: str, err: BaseException) -> str:
    """The step that ended the program, and the error (:func:`refusal`)."""
    return f"{label}: {refusal(err)}"


def _rounding(ns: dict, i: int) -> Any:
    """Where step ``i`` may round otherwise than eager: its layout (``LAYOUTS[i]``, the memory
    layout of the tensors it passes, where the scenario names them) is not that of every step
    before it, so the graph serving it may have been captured from another layout (its buffers
    have the capture's layout, see docs/checks.md); elsewhere values are compared bit for bit."""
    layouts = ns.get("LAYOUTS")
    return last_bits() if layouts is not None and len(set(layouts[: i + 1])) > 1 else nullcontext()


def run_scenario(sc: Scenario, backend: str = "simulate", device: str = "cpu") -> ScenarioOutcome:
    """Run ``sc`` in both worlds; the differences of the first step that has any (and, for a
    scenario with ``also``, those of the run on that backend)."""
    outcome = _run(sc, backend, device)
    if sc.also is None or outcome.diffs or outcome.cpu_only:
        return outcome
    other = _run(sc, sc.also, device)
    if other.diffs:
        return other
    for what, ours, theirs in (("refusal", outcome.ended, other.ended), ("counters", outcome.counts, other.counts)):
        if ours != theirs:
            outcome.diffs.append(Diff("end", f"parity:{what}", f"backend={sc.also!r}", f"{backend}: {ours}",
                                      f"{sc.also}: {theirs}"))
    return outcome


def _run(sc: Scenario, backend: str, device: str) -> ScenarioOutcome:
    ns = sc.compile(device)
    torch.manual_seed(0)
    plain = ns["build"]()
    torch.manual_seed(0)
    wrapped = ns["build"]()
    g = CudaGraphModule(wrapped["fn"], warmup=sc.warmup, backend=backend, **dict(sc.options))
    steps: list[str] = []
    e_results: list = []
    w_results: list = []
    ended = "served every step"
    for i in range(sc.steps):
        label = f"step{i}"
        before = _observe(ns, plain)
        torch.manual_seed(1000 + i)
        w_out, w_err, w_warn = _call(ns["step"], (wrapped, g, i), {})
        diffs: list[Diff] = []
        if isinstance(w_err, GraphModuleError):
            steps.append(f"{label}: wrapper {_short(None, w_err)} (plain not called; the scenario ends)")
            if device == "cpu" and refused_by_cuda(w_err, os.path.join("torch", "optim")):
                # on a CPU, Adam, AdamW and RMSprop are not capturable: they read their step count
                # on the host, which a capture refuses as on CUDA; a GPU runs the scenario
                return ScenarioOutcome(sc, backend, steps, diffs, _ended(label, w_err), _counts(g), cpu_only=True)
            compare(before, _observe(ns, wrapped), "state", "error-with-side-effects", label, diffs)
            if not sc.refusable:
                diffs.append(Diff(label, "error:refused-a-servable-program", "call", "served", show(w_err, 400)))
            return ScenarioOutcome(sc, backend, steps, diffs, _ended(label, w_err), _counts(g))
        torch.manual_seed(1000 + i)
        e_out, e_err, e_warn = _call(ns["step"], (plain, plain["fn"], i), {})
        steps.append(f"{label}: eager {_Text(e_out, e_err)}; wrapper {_Text(w_out, w_err)}")
        extra = [w for w in w_warn if w not in e_warn]
        if extra:
            diffs.append(Diff(label, "warning", "call", "no warning", " || ".join(extra)[:600]))
        if (e_err is None) != (w_err is None) or (e_err is not None and type(e_err) is not type(w_err)):
            diffs.append(Diff(label, "error:different-outcome", "call", _short(e_out, e_err), _short(w_out, w_err)))
        e_state, w_state = _observe(ns, plain), _observe(ns, wrapped)
        with _rounding(ns, i):
            compare(e_out, w_out, "out", "output", label, diffs)
            compare(e_state, w_state, "state", "state", label, diffs)
        e_results.append(e_out)
        w_results.append(w_out)
        if not diffs:
            e_objs, w_objs = _objects(e_results, e_state), _objects(w_results, w_state)
            e_ids, w_ids = identity_map(e_objs), identity_map(w_objs)
            for path, canon in e_ids.items():
                if path in w_ids and w_ids[path] != canon:
                    diffs.append(Diff(label, "identity", path, f"the same object as {canon}",
                                      f"the same object as {w_ids[path]}"))
            e_probe, w_probe = probe(e_objs), probe(w_objs)
            for path, changed in e_probe.items():
                if path in w_probe and w_probe[path] != changed:
                    diffs.append(Diff(label, "aliasing", path, f"writing into it changes {changed}",
                                      f"writing into it changes {w_probe[path]}"))
        if diffs:
            return ScenarioOutcome(sc, backend, steps, diffs)
        if e_err is not None:  # the same error in both worlds: the program ends there
            ended = _ended(label, e_err)
            break
    diffs = []
    for i, (e_out, w_out) in enumerate(zip(e_results, w_results)):
        found: list[Diff] = []
        with _rounding(ns, i):
            compare(e_out, w_out, "out", "output", f"step{i}, after the last step", found)
        diffs += [dataclasses.replace(d, kind="stale-" + d.kind) for d in found]
    return ScenarioOutcome(sc, backend, steps, diffs, ended, _counts(g))


def check_scenario(sc: Scenario, backend: str = "simulate", device: str = "cpu") -> ScenarioOutcome:
    """Run ``sc``; raise a :class:`DifferentialFailure` subclass with a printed report if it fails."""
    outcome = run_scenario(sc, backend, device)
    if not outcome.ok:
        raise failure_type(outcome.diffs[0].kind)(outcome.report())
    return outcome
