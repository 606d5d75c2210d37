"""The benchmark workloads and the ways of running each (variants), side by side.

Each workload builds a callable and a fixed call (args, kwargs) on a device. Each
variant wraps the callable: eager, the hand-written ``torch.cuda.graph`` copy+replay
loop (the *floor*: no wrapper that copies its inputs can beat it), the same with its
outputs cloned, tensordict's ``CudaGraphModule``, ``torch.compile(mode="reduce-overhead")``,
and graphmodule with its default ``outputs="safe"`` (the benchmark holds each result until
the next call returns, as a loop does), ``outputs="clone"`` and zero-copy ``outputs="static"``.
With ``GRAPHMODULE_BASELINE=DIR`` (a folder ``scripts/baseline.sh`` made), the same default
call of graphmodule as it was at another revision too (``baseline``, ``baseline_dropped``),
so that a change is timed against its base in one run.
Used by ``test_benchmarks.py`` (pytest-benchmark) and ``side_by_side.py`` (the table).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

OBS, ACT, HIDDEN = 17, 6, 256


@dataclass
class Case:
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    grad: bool = False  # runs with autograd on (a train step)
    floor_of: str | None = None  # a TensorDict case is compared with this plain case's floor
    warmup: int = 2


def mlp(device, batch):
    return nn.Sequential(
        nn.Linear(OBS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, ACT), nn.Tanh()
    ).to(device)


def tiny(device):
    return Case(lambda x: x * 2 + 1, (torch.randn(16, device=device),), {})


def policy(device, batch=1):
    return Case(mlp(device, batch), (torch.randn(batch, OBS, device=device),), {})


def policy_td(device):
    module = TensorDictModule(mlp(device, 1), in_keys=["observation"], out_keys=["action"])
    td = TensorDict(observation=torch.randn(1, OBS, device=device), batch_size=[1], device=device)
    return Case(module, (td,), {}, floor_of="policy_b1")


def nested_td(device, batch=64, read=6, total=12):
    keys = [("agent", f"obs{i}") if i % 2 else ("sensors", "deep", f"s{i}") for i in range(total)]
    read_keys = keys[:read]
    net = nn.Linear(read * 4, ACT).to(device)

    def fn(*xs):
        return net(torch.cat(xs, -1))

    module = TensorDictModule(fn, in_keys=read_keys, out_keys=[("agent", "action")])
    td = TensorDict(batch_size=[batch], device=device)
    for key in keys:
        td.set(key, torch.randn(batch, 4, device=device))
    return Case(module, (td,), {})


def many_leaves_td(device, leaves=64, batch=32):
    keys = [(f"group{i // 8}", f"x{i}") for i in range(leaves)]

    def fn(*xs):
        return torch.stack(xs, 0).sum(0)

    module = TensorDictModule(fn, in_keys=keys, out_keys=["total"])
    td = TensorDict(batch_size=[batch], device=device)
    for key in keys:
        td.set(key, torch.randn(batch, 8, device=device))
    return Case(module, (td,), {})


def sac_update(device, batch=256):
    torch.manual_seed(0)

    def q_net():
        return nn.Sequential(nn.Linear(OBS + ACT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)).to(device)

    q1, q2 = q_net(), q_net()
    q1_t, q2_t = q_net(), q_net()
    q1_t.load_state_dict(q1.state_dict())
    q2_t.load_state_dict(q2.state_dict())
    actor = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2 * ACT)).to(device)
    q_params = list(q1.parameters()) + list(q2.parameters())
    q_opt = torch.optim.Adam(q_params, lr=3e-4, capturable=torch.device(device).type == "cuda")
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4, capturable=torch.device(device).type == "cuda")
    target_params = list(q1_t.parameters()) + list(q2_t.parameters())
    gamma, tau, alpha = 0.99, 0.005, 0.2

    def sample(obs):
        mu, log_std = actor(obs).chunk(2, -1)
        log_std = log_std.clamp(-5, 2)
        std = log_std.exp()
        u = mu + std * torch.randn_like(mu)
        a = torch.tanh(u)
        logp = (-0.5 * ((u - mu) / std).pow(2) - log_std).sum(-1, keepdim=True) - torch.log1p(-a.pow(2) + 1e-6).sum(-1, keepdim=True)
        return a, logp

    def update(obs, act, rew, next_obs, done):
        with torch.no_grad():
            next_a, next_logp = sample(next_obs)
            sa = torch.cat([next_obs, next_a], -1)
            q_next = torch.min(q1_t(sa), q2_t(sa)) - alpha * next_logp
            target = rew + gamma * (1 - done) * q_next
        sa = torch.cat([obs, act], -1)
        q_loss = (q1(sa) - target).pow(2).mean() + (q2(sa) - target).pow(2).mean()
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()
        a, logp = sample(obs)
        sa = torch.cat([obs, a], -1)
        a_loss = (alpha * logp - torch.min(q1(sa), q2(sa))).mean()
        a_opt.zero_grad()
        a_loss.backward()
        a_opt.step()
        with torch.no_grad():
            torch._foreach_lerp_(target_params, q_params, tau)
        return q_loss.detach(), a_loss.detach()

    update.replaceable = q1_t  # a module whose parameter a benchmark may replace (no optimizer holds it)
    args = (
        torch.randn(batch, OBS, device=device),
        torch.rand(batch, ACT, device=device) * 2 - 1,
        torch.randn(batch, 1, device=device),
        torch.randn(batch, OBS, device=device),
        torch.zeros(batch, 1, device=device),
    )
    return Case(update, args, {}, grad=True, warmup=3)


def ppo_update(device, batch=64):
    """One PPO minibatch update: Gaussian actor and critic, clipped surrogate, value loss,
    entropy bonus, gradient clipping and an Adam step."""
    torch.manual_seed(0)
    actor = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, ACT)).to(device)
    critic = nn.Sequential(nn.Linear(OBS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1)).to(device)
    log_std = nn.Parameter(torch.zeros(ACT, device=device))
    params = [*actor.parameters(), *critic.parameters(), log_std]
    opt = torch.optim.Adam(params, lr=3e-4, eps=1e-5, capturable=torch.device(device).type == "cuda")
    clip, vf_coef, ent_coef = 0.2, 0.5, 0.01

    def update(obs, act, old_logp, adv, ret):
        dist = torch.distributions.Normal(actor(obs), log_std.exp(), validate_args=False)
        logp = dist.log_prob(act).sum(-1)
        ratio = (logp - old_logp).exp()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
        v_loss = 0.5 * (critic(obs).squeeze(-1) - ret).pow(2).mean()
        loss = pg_loss + vf_coef * v_loss - ent_coef * dist.entropy().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        return loss.detach()

    update.replaceable = critic
    args = (
        torch.randn(batch, OBS, device=device),
        torch.rand(batch, ACT, device=device) * 2 - 1,
        torch.randn(batch, device=device),
        torch.randn(batch, device=device),
        torch.randn(batch, device=device),
    )
    return Case(update, args, {}, grad=True, warmup=3)


# What each workload is, in the tables' words.
LABELS = {
    "tiny_fn": "`x*2+1`, 16 floats",
    "policy_b1": "MLP policy, batch 1",
    "policy_td_b1": "same, TensorDict in/out",
    "nested_td_12leaves_b64": "TensorDict module, 6 of 12 nested leaves, batch 64",
    "many_leaves_td_64": "TensorDict module, 64 leaves",
    "sac_update_b256": "SAC critic+actor update with Adam, batch 256",
    "policy_b16384": "MLP policy, batch 16384",
}

WORKLOADS: dict[str, Callable[[torch.device], Case]] = {
    "tiny_fn": tiny,
    "policy_b1": policy,
    "policy_td_b1": policy_td,
    "nested_td_12leaves_b64": nested_td,
    "many_leaves_td_64": many_leaves_td,
    "sac_update_b256": sac_update,
    "policy_b16384": lambda d: policy(d, 16384),
}


# -- variants ------------------------------------------------------------------------------
def capture_by_hand(fn: Callable[..., Any], args: tuple, kwargs: dict | None = None,
                    warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``fn``'s CUDA graph over ``args`` (the static buffers), captured as the hand-written
    floor is: ``warmup`` calls on a side stream, then ``torch.cuda.graph``; (graph, outputs)."""
    kwargs = kwargs or {}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args, **kwargs)
    return graph, out


def hand_floor(case: Case, clone: bool = False) -> Callable[[], Any] | None:
    """The hand-written copy+replay loop: static buffers, one graph, no checks.

    ``clone=True`` also clones the outputs: the floor for any wrapper whose outputs
    survive the next call.
    """
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((case.args, case.kwargs))
    if not all(isinstance(x, torch.Tensor) for x in leaves):
        return None
    static = [x.clone() for x in leaves]
    s_args, s_kwargs = tree_unflatten(static, spec)
    graph, out = capture_by_hand(case.fn, s_args, s_kwargs, warmup=case.warmup)
    srcs = leaves
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]

    def call():
        torch._foreach_copy_(static, srcs)
        graph.replay()
        return out

    def call_clone():
        torch._foreach_copy_(static, srcs)
        graph.replay()
        return [o.clone() for o in outs]

    return call_clone if clone else call


def variant(name: str, case: Case) -> Callable[[], Any] | None:
    args, kwargs = case.args, case.kwargs
    if name == "eager":
        return lambda: case.fn(*args, **kwargs)
    if name == "floor":
        return hand_floor(case)
    if name == "floor_clone":
        return hand_floor(case, clone=True)
    if name == "tensordict":
        from tensordict.nn import CudaGraphModule as TDCudaGraphModule

        g = TDCudaGraphModule(case.fn, warmup=case.warmup)
        return lambda: g(*args, **kwargs)
    if name == "compile":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c = torch.compile(case.fn, mode="reduce-overhead")

        def call():
            torch.compiler.cudagraph_mark_step_begin()
            return c(*args, **kwargs)

        return call
    if name.startswith("baseline"):  # the default call of graphmodule at the baseline revision
        CudaGraphModule, outputs = baseline().CudaGraphModule, "safe"
    else:
        from graphmodule import CudaGraphModule

        # graphmodule: the default outputs ("safe": lent, never overwritten while held)
        outputs = {"graphmodule": "safe", "graphmodule_dropped": "safe", "graphmodule_clone": "clone",
                   "graphmodule_static": "static"}[name]
    g = CudaGraphModule(case.fn, warmup=case.warmup, outputs=outputs)
    if name in ("graphmodule_dropped", "baseline_dropped"):
        def dropped() -> None:  # the result gone before the next call, as in a loop that drops it
            g(*args, **kwargs)

        return dropped
    return lambda: g(*args, **kwargs)


BASELINE = os.environ.get("GRAPHMODULE_BASELINE")  # a folder holding graphmodule_base (scripts/baseline.sh)
VARIANTS = ("eager", "floor", "floor_clone", "tensordict", "compile", "graphmodule", "graphmodule_dropped",
            "graphmodule_clone", "graphmodule_static") + (("baseline", "baseline_dropped") if BASELINE else ())


def baseline() -> Any:
    """``graphmodule_base``, the package at the baseline revision, from ``GRAPHMODULE_BASELINE``."""
    if not BASELINE or not os.path.isdir(os.path.join(BASELINE, "graphmodule_base")):
        raise RuntimeError(f"GRAPHMODULE_BASELINE={BASELINE!r} holds no graphmodule_base: make it with "
                           "`bash scripts/baseline.sh REV DIR`")
    if BASELINE not in sys.path:
        sys.path.insert(0, BASELINE)
    return importlib.import_module("graphmodule_base")


def run_context(case: Case):
    return torch.enable_grad() if case.grad else torch.no_grad()
