"""graphmodule against tensordict's wrapper, with the eager call as the referee.

Generated call sequences in tensordict's calling conventions (a ``TensorDictModule`` called
with a TensorDict, with keyword tensors, with ``tensordict_out=``; a plain function with
``in_keys=[]``/``out_keys=[]`` taking a TensorDict and returning a new one, a tensor or
None), run three ways on the same inputs: eagerly, through ``tensordict.nn.CudaGraphModule``
and through graphmodule's. After each call, what a user sees (the result: its type, keys
and their order, batch size, values bit for bit, whether it is the input TensorDict; and the
caller's TensorDict afterwards) is compared:

- where tensordict's result is eager's, graphmodule's must be too;
- where tensordict's differs from eager's, graphmodule's must still be eager's, or raise
  one of its own errors (refusing where tensordict answers wrongly is the point);
- an exception raised eagerly must be raised by graphmodule too (same type).

On CPU tensordict's wrapper runs the function eagerly and graphmodule simulates its replays,
so the comparison there is with eager only (``GM_VS_TD_CPU_EXAMPLES`` sequences, default 40);
``test_against_tensordict_on_cuda`` runs both wrappers on real CUDA graphs
(``GM_VS_TD_EXAMPLES`` sequences, default 60).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import CudaGraphModule as TDCudaGraphModule
from tensordict.nn import TensorDictModule

from graphmodule import CudaGraphModule, GraphModuleError, InputMismatchError, UnsupportedError

# refusals the README states as deliberate: the unread layout of a TensorDict that the module
# writes into decides what eager code does; the extra key changes a plain function's signature;
# an UnsupportedError at capture (a result the graph's inputs cannot produce) is one too
DELIBERATE = {"unread", "extra", "missing", "structure"}

EXAMPLES = int(os.environ.get("GM_VS_TD_EXAMPLES", "60"))  # on CUDA
CPU_EXAMPLES = int(os.environ.get("GM_VS_TD_CPU_EXAMPLES", "40"))
KEYS = ["a", "b", ("nested", "c")]
OUT_KEYS = ["out", ("nested", "out2"), "a"]  # "a" overwrites an input
# the multi-agent layout: a nested TensorDict with more batch dimensions than its parent
AGENT_KEYS = [("agents", "obs"), ("agents", "state")]
AGENT_OUT_KEYS = [("agents", "action"), ("agents", "obs"), "joint"]
AGENTS = 2


@dataclass
class Plan:
    convention: str  # "td", "td_out", "kwargs", "plain_td", "plain_tensor", "plain_none"
    batch: int
    features: int
    in_keys: list
    out_keys: list
    reduce: list  # per output: keep [B, F], or sum to [B]
    warmup: int
    calls: int
    reuse_td: bool  # the same TensorDict object refreshed in place at every call (RL loops)
    # per call: does the TensorDict hold the "nested" sub-TensorDict (when the module does
    # not read it) and an unread extra key; is tensordict_out given with an entry already
    layouts: list = None
    prefilled_out: bool = False
    sequential: bool = False  # two TensorDictModules chained (TensorDictSequential)
    agents: bool = False  # read and write the multi-agent entries (batch [B, AGENTS])

    def module(self) -> Callable[..., Any]:
        n_in = len(self.in_keys)
        reduce = self.reduce

        def body(*xs):
            total = xs[0]
            for x in xs[1:n_in]:
                total = total + x
            outs = []
            for i, r in enumerate(reduce):
                y = total * (i + 2) + 0.5 * i
                outs.append(y.sum(-1) if r else y)
            return outs[0] if len(outs) == 1 else tuple(outs)

        if self.convention in ("td", "td_out", "kwargs"):
            if self.sequential and self.convention != "kwargs":
                from tensordict.nn import TensorDictSequential

                first = TensorDictModule(lambda *xs: sum(xs[1:], xs[0]) * 0.5, in_keys=list(self.in_keys),
                                         out_keys=["hidden"])
                return TensorDictSequential(first, TensorDictModule(body, in_keys=["hidden"] * n_in,
                                                                    out_keys=list(self.out_keys)))
            return TensorDictModule(body, in_keys=list(self.in_keys), out_keys=list(self.out_keys))
        in_keys, out_keys, convention = self.in_keys, self.out_keys, self.convention

        def plain(td):
            result = body(*(td.get(k) for k in in_keys))
            outs = result if isinstance(result, tuple) else (result,)
            if convention == "plain_tensor":
                return outs[0]
            if convention == "plain_none":
                td.set("seen", outs[0])  # an effect on the caller's TensorDict, nothing returned
                return None
            return TensorDict({k: v for k, v in zip(out_keys, outs)}, batch_size=td.batch_size[:1])

        return plain

    def inputs(self, k: int, device: str) -> TensorDict:
        gen = torch.Generator().manual_seed(1000 + k)
        td = TensorDict(batch_size=[self.batch], device=device)
        with_nested, with_extra = self.layouts[k] if self.layouts else (True, False)
        for key in KEYS:
            if key == ("nested", "c") and not with_nested and key not in self.in_keys:
                continue
            td.set(key, torch.randn(self.batch, self.features, generator=gen).to(device))
        if with_extra:
            td.set("extra", torch.randn(self.batch, 2, generator=gen).to(device))
        if self.agents:
            agents = TensorDict(batch_size=[self.batch, AGENTS], device=device)
            for _, name in AGENT_KEYS:
                agents.set(name, torch.randn(self.batch, AGENTS, self.features, generator=gen).to(device))
            td.set("agents", agents)
        return td

    def call(self, g: Any, td: TensorDict) -> Any:
        if self.convention == "td_out":
            out = TensorDict(batch_size=[self.batch], device=td.device)
            if self.prefilled_out:
                out.set("prev", torch.ones(self.batch, device=td.device))
            return g(td, tensordict_out=out)
        if self.convention == "kwargs":
            return g(**{k: td.get(k) for k in self.in_keys})
        return g(td)


@st.composite
def plans(draw) -> Plan:
    convention = draw(st.sampled_from(["td", "td_out", "kwargs", "plain_td", "plain_tensor", "plain_none"]))
    agents = convention in ("td", "td_out") and draw(st.booleans())
    keys = AGENT_KEYS if agents else KEYS if convention != "kwargs" else ["a", "b"]  # kwargs: plain names
    in_keys = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys), unique=True))
    out_keys = draw(st.lists(st.sampled_from(AGENT_OUT_KEYS if agents else OUT_KEYS), min_size=1, max_size=2,
                             unique=True))
    warmup = draw(st.integers(1, 3))
    return Plan(
        convention=convention,
        batch=draw(st.sampled_from([1, 4])),
        features=draw(st.sampled_from([1, 3])),
        in_keys=in_keys,
        out_keys=out_keys,
        reduce=[draw(st.booleans()) for _ in out_keys],
        warmup=warmup,
        calls=(calls := warmup + draw(st.integers(2, 4))),
        reuse_td=draw(st.booleans()),
        layouts=[(draw(st.booleans()), draw(st.booleans())) for _ in range(calls)] if draw(st.booleans()) else None,
        prefilled_out=draw(st.booleans()),
        sequential=draw(st.booleans()),
        agents=agents,
    )


# -- what a user observes -----------------------------------------------------------------------
def view(x: Any, td_in: Any) -> Any:
    """A comparable snapshot (on the CPU) of what a call returned or left in a TensorDict."""
    if x is None:
        return ("none",)
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape), x.detach().cpu().clone())
    if isinstance(x, TensorDictBase):
        items = tuple((k, view(x.get(k), None)) for k in x.keys(include_nested=True, leaves_only=True))
        return ("input td" if x is td_in else "td", tuple(x.batch_size), items)
    if isinstance(x, tuple):
        return ("tuple",) + tuple(view(v, td_in) for v in x)
    return ("other", type(x).__name__)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def outcome(g: Any, plan: Plan, td: TensorDict) -> tuple[str, Any]:
    try:
        out = plan.call(g, td)
    except Exception as exc:  # noqa: BLE001 - compared
        return "raised", exc
    return "returned", (view(out, td), view(td, None))


def run_sequence(plan: Plan, device: str, backend: str) -> dict[str, int]:
    """The sequence in the three worlds; returns how often tensordict's answer was not eager's."""
    eager = plan.module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both wrappers warn once without CUDA
        kw = {} if plan.convention in ("td", "td_out", "kwargs") else {"in_keys": [], "out_keys": []}
        td_g = TDCudaGraphModule(plan.module(), warmup=plan.warmup, **kw)
        gm_g = CudaGraphModule(plan.module(), warmup=plan.warmup, backend=backend, **kw)
    worlds = {"eager": eager, "tensordict": td_g, "graphmodule": gm_g}
    tds = {name: plan.inputs(0, device) for name in worlds}
    tally = {"calls": 0, "tensordict_differs": 0, "graphmodule_refused": 0}
    for k in range(plan.calls):
        fresh = plan.inputs(k, device)
        for name in worlds:
            if plan.reuse_td and k:
                tds[name].update(fresh.select(*KEYS, *AGENT_KEYS, strict=False))  # new values, same object
            else:
                tds[name] = fresh.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = {name: outcome(g, plan, tds[name]) for name, g in worlds.items()}
        tally["calls"] += 1
        e_kind, e_val = results["eager"]
        g_kind, g_val = results["graphmodule"]
        t_kind, t_val = results["tensordict"]
        td_right = t_kind == e_kind and (
            type(t_val) is type(e_val) if e_kind == "raised" else same(t_val, e_val))
        tally["tensordict_differs"] += not td_right
        where = f"call {k} of {plan}"
        if e_kind == "raised":
            assert g_kind == "raised" and type(g_val) is type(e_val), (
                f"{where}: eager raised {e_val!r}, graphmodule {g_kind} {g_val!r}")
            continue
        if g_kind == "raised" and (isinstance(g_val, UnsupportedError) or isinstance(g_val, InputMismatchError)
                                   and g_val.mismatches and all(m.kind in DELIBERATE for m in g_val.mismatches)):
            tally["graphmodule_refused"] += 1  # refused by design (README), whatever tensordict did
            break
        if g_kind == "raised":
            assert isinstance(g_val, GraphModuleError) and not td_right, (
                f"{where}: graphmodule raised {g_val!r} where eager returned"
                + (" and tensordict agreed with eager" if td_right else ""))
            tally["graphmodule_refused"] += 1
            # refused: the wrapper stays usable and the worlds may have diverged; stop here
            break
        assert same(g_val, e_val), (
            f"{where}: graphmodule's result differs from eager's"
            + (" (tensordict's agrees with eager)" if td_right else "")
            + f"\n eager:       {e_val}\n graphmodule: {g_val}")
    return tally


# GM_VS_TD_EXPLORE=1: fresh random sequences instead of the fixed, derandomized ones
SETTINGS = dict(deadline=None, derandomize=os.environ.get("GM_VS_TD_EXPLORE") != "1",
                suppress_health_check=list(HealthCheck), database=None)


@settings(max_examples=CPU_EXAMPLES, **SETTINGS)
@given(plan=plans())
def test_against_tensordict_simulated(plan):
    run_sequence(plan, "cpu", "simulate")


@pytest.mark.cuda
def test_against_tensordict_on_cuda():
    tallies = []

    @settings(max_examples=EXAMPLES, **SETTINGS)
    @given(plan=plans())
    def check(plan):
        tallies.append(run_sequence(plan, "cuda", "cuda"))

    check()
    total = {k: sum(t[k] for t in tallies) for k in tallies[0]}
    print(f"[vs tensordict] {len(tallies)} sequences, {total}")


def test_the_referee_catches_a_wrong_answer():
    """The comparison is not vacuous: a wrapper that replays a stale answer is caught."""
    plan = Plan("plain_tensor", 4, 3, ["a"], ["out"], [False], warmup=1, calls=3, reuse_td=False)
    stale = {}

    class Stale:
        def __init__(self, fn, **_):
            self.fn = fn

        def __call__(self, td):
            if "out" not in stale:
                stale["out"] = self.fn(td)
            return stale["out"]

    real = globals()["CudaGraphModule"]
    globals()["CudaGraphModule"] = lambda fn, **kw: Stale(fn)
    try:
        with pytest.raises(AssertionError, match="graphmodule's result differs from eager's"):
            run_sequence(plan, "cpu", "simulate")
    finally:
        globals()["CudaGraphModule"] = real
