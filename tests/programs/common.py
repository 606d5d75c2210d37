"""What the programs share: the wrapper factories, a replay buffer, timing and metrics."""

from __future__ import annotations

import os

import math
import time
import warnings
from typing import Any, Callable

import torch
from tensordict import TensorDict
from torch import nn

WRAPPERS = ("eager", "tensordict", "graphmodule")


def make_wrap(name: str, *, backend: str = "auto") -> Callable[..., Any]:
    """The factory ``wrap(fn, **kwargs)`` that a program applies to each function it graphs.

    ``"eager"`` returns ``fn`` itself (the keyword arguments are the wrapper's options and
    are dropped), ``"tensordict"`` builds ``tensordict.nn.CudaGraphModule(fn, **kwargs)``,
    ``"graphmodule"`` builds ``graphmodule.CudaGraphModule(fn, backend=backend, **kwargs)``.
    The wrappers built are kept in ``wrap.built`` (in order), so callers can inspect them.
    Without CUDA, both wrappers warn that they run eagerly; the factory silences that one warning.
    """
    if name not in WRAPPERS:
        raise ValueError(f"wrapper must be one of {WRAPPERS} (got {name!r})")

    def wrap(fn: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        if name == "eager":
            return fn
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*without CUDA device available", UserWarning)
            warnings.filterwarnings("ignore", ".*CUDA is not available", UserWarning)
            if name == "tensordict":
                from tensordict.nn import CudaGraphModule
                wrapped = CudaGraphModule(fn, **kwargs)
            else:
                from graphmodule import CudaGraphModule
                if os.environ.get("GM_PROGRAMS_OUTPUTS"):  # benchmarks: another outputs option
                    kwargs = {"outputs": os.environ["GM_PROGRAMS_OUTPUTS"], **kwargs}
                wrapped = CudaGraphModule(fn, backend=backend, **kwargs)
        wrap.built.append(wrapped)
        return wrapped

    wrap.name = name
    wrap.built = []
    return wrap


class ReplayBuffer:
    """A circular buffer of transitions (a TensorDict) on the device, sampled uniformly, the
    way the published scripts keep theirs: Python-int cursor and size, written and sampled
    outside the wrapped functions. (``examples.common.training.ReplayBuffer`` keeps its cursor on the
    device instead, so that a graph can write and sample it.)

    ``extend`` writes at device-side indices and ``sample`` draws them with
    ``torch.randint``: neither waits for the device.
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity, self.device = capacity, torch.device(device)
        self.storage: TensorDict | None = None
        self.cursor = self.size = 0

    def extend(self, td: TensorDict) -> None:
        n = td.shape[0]
        if self.storage is None:
            self.storage = td[0].expand(self.capacity).clone().zero_()
        index = (torch.arange(n, device=self.device) + self.cursor) % self.capacity
        self.storage[index] = td
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> TensorDict:
        index = torch.randint(self.size, (batch_size,), device=self.device)
        return self.storage[index]


def mlp(n_in: int, hidden: int, n_out: int, act: type[nn.Module], device: Any) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_in, hidden, device=device), act(),
        nn.Linear(hidden, hidden, device=device), act(),
        nn.Linear(hidden, n_out, device=device),
    )


def step_flags(device: torch.device) -> dict:
    """The flags of an optimizer a graph steps: ``capturable=True`` on CUDA (a CUDA graph steps
    only those); on the CPU ``fused=True``, the simulated backend's stand-in (torch refuses
    capturable for CPU tensors; a plain step's host step counts are a sync a capture refuses),
    given to the eager run too so that both runs step with the same math."""
    return {"capturable": True} if torch.device(device).type == "cuda" else {"fused": True}


def episode_return(episode_reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """Mean return of the episodes that ended (NaN if none), without a host sync."""
    done = done.float()
    return (episode_reward * done).sum() / done.sum()


class Clock:
    """Wall time of the measured part of a run, with the device drained at both ends."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.start = self.end = None
        self.steps = 0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def begin(self) -> None:
        self.start = self._now()

    def tick(self, n: int) -> None:
        """Count ``n`` steps, if the measured part has begun."""
        if self.start is not None:
            self.steps += n

    def stop(self, unit: str) -> dict:
        self.end = self._now()
        seconds = self.end - self.start if self.start is not None else math.nan
        return {
            "unit": unit,
            "steps": self.steps,
            "seconds": seconds,
            "steps_per_s": self.steps / seconds if self.steps else math.nan,
            "t_start": self.start,
            "t_end": self.end,
        }


def store_transition(rb: "ReplayBuffer", td: TensorDict, metrics: dict[str, list[torch.Tensor]]) -> None:
    """The off-policy scripts' step bookkeeping: the transition into the buffer (LeanRL's
    field names), the step's mean reward and the returns of the episodes that ended."""
    rb.extend(TensorDict(
        observations=td["observation"], actions=td["action"], rewards=td["next", "reward"],
        next_observations=td["next", "observation"], dones=td["next", "terminated"],
        batch_size=td.batch_size))
    metrics["reward"].append(td["next", "reward"].mean())
    metrics["episode_return"].append(episode_return(td["next", "episode_reward"], td["next", "done"]))


def finish(metrics: dict[str, list[torch.Tensor]], timing: dict) -> dict:
    """Turn the per-iteration metric tensors into lists of floats (one sync, at the end)."""
    out = {k: torch.stack([v.reshape(()).float() for v in vals]).tolist() if vals else []
           for k, vals in metrics.items()}
    return {"metrics": out, "timing": timing}


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)  # CPU and every CUDA device
