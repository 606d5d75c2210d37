"""One-off: would torch.compile's guards make a better staleness watch than graphmodule's walk?

For a function, dynamo's guards list what the trace read. This traces the wrapped callable with
``torch._dynamo.optimize`` and a backend that returns the FX graph uncompiled, takes the cache
entry's ``guard_manager``, and compares, with ``graphmodule._stale.Watch``:

- the per-call cost of ``guard_manager.check(f_locals)`` (all guards, and the Python ones only:
  without tensor, global-state and input guards, which the wrapper checks itself) and of
  ``Watch.check()``, on an MLP policy and an Adam train step;
- which changes of Python read by a module's ``forward`` each one sees.

    python benchmarks/dynamo_guards.py
"""

import dataclasses
import enum
import sys
import time
import timeit
import types
import warnings

import numpy as np
import torch
import torch._dynamo
from torch import nn

from graphmodule._stale import Watch

warnings.simplefilter("ignore")
torch._dynamo.config.cache_size_limit = 64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
_OURS = ("TENSOR_MATCH", "GLOBAL_STATE", "TORCH_FUNCTION_MODE_STACK", "DEFAULT_DEVICE",
         "DIMENSION_DYNAMIC_MARKING_GUARD")
SCALE = 2.0
LEVEL = np.array(2.0)


def runner(fn, args):
    return fn(*args)


def python_only(entries):
    """The guards the wrapper does not check itself (tensors, inputs, torch's modes)."""
    return [not (e.guard_type in _OURS or e.name.startswith("args")) for e in entries]


def dynamo_guards(fn, args, grad=False, keep=None):
    """Run ``fn(*args)`` once through dynamo: the outermost frame's guard manager, the number of
    graphs, and the seconds the trace took."""
    code = runner.__code__.replace()  # a code object of its own: a cache entry of its own
    traced = types.FunctionType(code, {"__builtins__": __builtins__}, "runner")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        torch._dynamo.optimize(backend, guard_filter_fn=keep)(traced)(fn, args)
    seconds = time.perf_counter() - start
    return torch._dynamo.eval_frame._debug_get_cache_entry_list(code)[0].guard_manager, len(graphs), seconds


def per_call_ns(f, n=20000):
    f()
    return min(timeit.repeat(f, number=n, repeat=5)) / n * 1e9


def mlp():
    return nn.Sequential(nn.Linear(17, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 6)).to(DEVICE)


def cost(name, fn, args, grad=False):
    watch = Watch(fn)
    ours = per_call_ns(watch.check)
    guards, graphs, seconds = dynamo_guards(fn, args, grad)
    python, _, _ = dynamo_guards(fn, args, grad, python_only)
    f_locals = {"fn": fn, "args": args}
    with torch.set_grad_enabled(grad):
        assert guards.check(f_locals), guards.check_verbose(f_locals)
        theirs, theirs_python = per_call_ns(lambda: guards.check(f_locals)), per_call_ns(lambda: python.check(f_locals))
    print(f"{name}: watch {ours:.0f} ns/call; dynamo's guards {theirs:.0f} ns/call ({theirs_python:.0f} Python "
          f"guards only), {graphs} graphs, trace {seconds * 1e3:.0f} ms")


def costs():
    with torch.no_grad():
        cost("MLP policy (no_grad)", mlp(), (torch.ones(8, 17, device=DEVICE),))
    net = mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=DEVICE == "cuda")

    def step(x, y):
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    x, y = torch.ones(8, 17, device=DEVICE), torch.zeros(8, 6, device=DEVICE)
    for _ in range(2):
        step(x, y)
    cost("Adam train step", step, (x, y), grad=True)


class Mode(enum.Enum):
    A = 1
    B = 2


@dataclasses.dataclass
class Config:
    k: float = 1.0


def seen(name, forward, setup, change, attrs=None):
    """Whether dynamo's guards, and the watch, see ``change`` after a capture of ``forward``."""
    cls = type("M", (nn.Module,), {"forward": forward, **(attrs or {})})
    m = cls()
    m.lin = nn.Linear(3, 3)
    setup(m)
    x = torch.ones(2, 3)
    watch = Watch(m)
    guards, _, _ = dynamo_guards(m, (x,))
    f_locals = {"fn": m, "args": (x,)}
    with torch.no_grad():
        assert guards.check(f_locals) and watch.check()
        change(m, cls)
        print(f"{name:34s} dynamo's guards: {not guards.check(f_locals)!s:5}  watch: {not watch.check()}")


def coverage():
    g = globals()
    seen("module global", lambda self, x: self.lin(x) * SCALE, lambda m: None, lambda m, c: g.update(SCALE=3.0))
    seen("tuple attribute", lambda self, x: self.lin(x).reshape(*self.shape), lambda m: setattr(m, "shape", (2, 3)),
         lambda m, c: setattr(m, "shape", (3, 2)))
    seen("Enum attribute", lambda self, x: self.lin(x) + (1 if self.mode is Mode.B else 0),
         lambda m: setattr(m, "mode", Mode.A), lambda m, c: setattr(m, "mode", Mode.B))
    seen("dtype attribute", lambda self, x: self.lin(x).to(self.dt), lambda m: setattr(m, "dt", torch.float32),
         lambda m, c: setattr(m, "dt", torch.float64))
    seen("numpy scalar attribute", lambda self, x: self.lin(x) * self.k, lambda m: setattr(m, "k", np.float64(2.0)),
         lambda m, c: setattr(m, "k", np.float64(3.0)))
    seen("dataclass rebound", lambda self, x: self.lin(x) * self.cfg.k, lambda m: setattr(m, "cfg", Config()),
         lambda m, c: setattr(m, "cfg", Config(3.0)))
    seen("dataclass field set", lambda self, x: self.lin(x) * self.cfg.k, lambda m: setattr(m, "cfg", Config()),
         lambda m, c: setattr(m.cfg, "k", 3.0))
    seen("list attribute, tensor replaced", lambda self, x: self.lin(x) + self.ws[0],
         lambda m: setattr(m, "ws", [torch.ones(3)]), lambda m, c: m.ws.__setitem__(0, torch.zeros(3)))
    seen("class attribute", lambda self, x: self.lin(x) * self.cut, lambda m: None,
         lambda m, c: setattr(c, "cut", 3.0), {"cut": 1.5})
    seen("global numpy array, in place", lambda self, x: self.lin(x) * LEVEL, lambda m: None,
         lambda m, c: LEVEL.__setitem__((), 3.0))
    seen("parameter replaced (same shape)", lambda self, x: self.lin(x), lambda m: None,
         lambda m, c: setattr(m.lin, "weight", nn.Parameter(torch.zeros(3, 3))))


if __name__ == "__main__":
    print(sys.version.split()[0], torch.__version__, DEVICE)
    costs()
    coverage()
