"""A no-argument train step: a closure over a model and an optimizer, on a batch held outside.

The shape of ``torch.cuda.graphs``-style training loops (and of LeanRL's ``update``
functions once their data lives in static tensors): the batch tensors ``x`` and ``y`` are
created once and refilled in place before each step, and the step takes no argument::

    def train_step():
        opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step()
        return loss.detach()

    step = wrap(torch.compile(train_step), warmup=5)   # compile inside the wrapper

With ``compile=True`` the step is ``torch.compile``-d and the wrapper's ``warmup`` calls
cover compilation (recompiles included) before the capture.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .common import Clock, step_flags, finish, mlp, seed_everything


@dataclass
class TrainConfig:
    batch_size: int = 256
    in_dim: int = 32
    hidden: int = 256
    lr: float = 1e-3
    noise: float = 0.01
    compile: bool = False
    compile_backend: str = "inductor"  # the CPU tests use "aot_eager" (no C++ build)
    warmup: int = 5
    burnin: int = 8  # steps before the clock starts (warmup, compilation, capture)


def run_train_step(wrap, *, steps: int, device, seed: int = 0, **config) -> dict:
    """``steps`` regression steps towards a fixed random teacher network."""
    cfg = replace(TrainConfig(), **config)
    device = torch.device(device)
    seed_everything(seed)
    teacher = mlp(cfg.in_dim, cfg.hidden, 1, nn.Tanh, device).requires_grad_(False)
    model = mlp(cfg.in_dim, cfg.hidden, 1, nn.ReLU, device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, **step_flags(device))
    x = torch.empty(cfg.batch_size, cfg.in_dim, device=device)  # the batch, held outside
    y = torch.empty(cfg.batch_size, 1, device=device)

    def train_step():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        out = loss.detach()  # (``loss`` is not live after backward: dynamo's resume frame
        loss.backward()      # would otherwise warn about reading .grad of a non-leaf)
        opt.step()
        return out

    if cfg.compile:
        torch._dynamo.reset()  # each run compiles afresh: no cache shared between runs
        train_step = torch.compile(train_step, backend=cfg.compile_backend)
    step = wrap(train_step, warmup=cfg.warmup)

    metrics = {"loss": [], "weight_norm": []}
    clock = Clock(device)
    for i in range(steps):
        if i == cfg.burnin:
            clock.begin()
        with torch.no_grad():  # a new batch, written into the same tensors
            x.normal_()
            y.copy_(teacher(x) + cfg.noise * torch.randn_like(y))
        metrics["loss"].append(step())
        clock.tick(1)
    with torch.no_grad():
        metrics["weight_norm"].append(sum(p.norm() ** 2 for p in model.parameters()).sqrt())
    return finish(metrics, clock.stop("train step"))
