"""How close to the floor could a compiled hot path get? (#8; an experiment, not shipped)

The shipped hot path is Python: lock, thread check, input check (dynamo's C++
``TensorGuards``), modes, staleness watch, the lent set's use count, ``copy_``, replay,
``detach``. This script compiles the same steps for one captured policy call (one
positional tensor, one output, ``outputs="safe"``, its twins) into a C++ function with
``torch.utils.cpp_extension.load_inline`` and times, in alternating rounds in one process:

- ``floor``: ``buf.copy_(x); graph.replay()``, the result the static output;
- ``python``: the wrapper's call as shipped;
- ``native``: the compiled steps (every check the Python path makes for this call; any
  doubt hands the call back to the wrapper), called as the wrapper's ``__call__`` would.

Each result is held until the next call (``out = g(x)``), as loops do. Usage::

    python scripts/native_probe.py [--calls N] [--rounds R] [--check]

``--check`` compares the compiled path with the wrapper on changing inputs, the modes,
a parameter rebound, and held results (the answers must be the eager function's). Without
CUDA the graph is simulated (its replay a no-op): the times say only what the steps cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from graphmodule import CudaGraphModule  # noqa: E402
from graphmodule._lend import Lender  # noqa: E402

CPP = r"""
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pythread.h>

namespace py = pybind11;

struct Set {
  at::Tensor buf;     // the static input buffer
  at::Tensor first;   // the lent output template (over the lent storage)
  long base;          // use count of the lent storage with nobody else holding it
  py::object replay;  // the graph's bound replay
};

struct Place { py::object container, key; PyObject* obj; };

struct Hot {
  py::object acquire, release, fallback, guard_check, interaction_fn, interaction, mode_flag,
      mode_read, mode, watch_flag;
  unsigned long thread;
  bool grad;
  std::vector<Place> places;   // read by identity at every call
  std::vector<std::pair<at::Tensor, void*>> ptrs;  // parameters' addresses
  std::vector<Set> sets;
  long replays = 0;

  py::object call(py::args args, py::kwargs kwargs) {
    if (kwargs.size() != 0 || args.size() != 1) return fallback(*args, **kwargs);
    PyObject* x = args[0].ptr();
    acquire();
    int found = -1;
    if (PyThread_get_thread_ident() == thread && THPVariable_Check(x) &&
        PyObject_IsTrue(guard_check(args[0]).ptr()) == 1 && at::GradMode::is_enabled() == grad &&
        interaction_fn().ptr() == interaction.ptr() && modes_ok() && watch_ok()) {
      for (size_t i = 0; i < sets.size(); ++i) {
        if ((long)sets[i].first.storage().use_count() == sets[i].base) { found = (int)i; break; }
      }
    }
    if (found < 0) {
      release();
      return fallback(*args);
    }
    Set& s = sets[found];
    s.buf.copy_(THPVariable_Unpack(x));
    s.replay();
    ++replays;
    PyObject* out = THPVariable_Wrap(s.first.detach());
    release();
    return py::reinterpret_steal<py::object>(out);
  }

  bool modes_ok() {
    if (!mode_flag.is_none()) return !PyObject_IsTrue(mode_flag.attr("raised").ptr());
    return mode_read().equal(mode);  // no dict watchers: the reader itself
  }

  bool watch_ok() {
    if (!watch_flag.is_none() && PyObject_IsTrue(watch_flag.attr("raised").ptr())) return false;
    for (auto& p : places) {
      PyObject* now = PyObject_GetItem(p.container.ptr(), p.key.ptr());
      if (now == nullptr) { PyErr_Clear(); return false; }
      Py_DECREF(now);
      if (now != p.obj) return false;
    }
    for (auto& t : ptrs) if (t.first.data_ptr() != t.second) return false;
    return true;
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Hot>(m, "Hot")
      .def(py::init<>())
      .def("__call__", &Hot::call)
      .def_readwrite("acquire", &Hot::acquire).def_readwrite("release", &Hot::release)
      .def_readwrite("fallback", &Hot::fallback).def_readwrite("guard_check", &Hot::guard_check)
      .def_readwrite("interaction_fn", &Hot::interaction_fn).def_readwrite("interaction", &Hot::interaction)
      .def_readwrite("mode_flag", &Hot::mode_flag).def_readwrite("mode_read", &Hot::mode_read)
      .def_readwrite("mode", &Hot::mode).def_readwrite("watch_flag", &Hot::watch_flag)
      .def_readwrite("thread", &Hot::thread).def_readwrite("grad", &Hot::grad)
      .def_readonly("replays", &Hot::replays)
      .def("add_place", [](Hot& h, py::object c, py::object k, py::object o) {
        h.places.push_back({c, k, o.ptr()});  // the watch holds the object
      })
      .def("add_ptr", [](Hot& h, at::Tensor t) { h.ptrs.push_back({t, t.data_ptr()}); })
      .def("add_set", [](Hot& h, at::Tensor buf, at::Tensor first, py::object replay) {
        Set s{buf, first, 0, replay};
        h.sets.push_back(s);
        h.sets.back().base = (long)h.sets.back().first.storage().use_count();
      });
}
"""


def build():
    from torch.utils.cpp_extension import load_inline

    t0 = time.perf_counter()
    ext = load_inline("gm_native_probe", cpp_sources=CPP, extra_cflags=["-O2"])
    print(f"compiled in {time.perf_counter() - t0:.1f} s")
    return ext


def make_native(ext, g):
    """The compiled hot path of ``g``'s only graph (its twins included)."""
    e = g._entries[0]
    assert e.single and e.plain and isinstance(e.plan.lender, Lender) and e.spec.n_positional == 1
    h = ext.Hot()
    h.acquire, h.release = g._lock.acquire, g._lock.release
    h.fallback, h.thread = g, g._thread
    h.guard_check = e.spec._guard.check
    grad, interaction, _ = e.mode
    h.grad, h.interaction = grad, interaction
    from graphmodule._mode import _interaction_type
    h.interaction_fn = _interaction_type
    h.mode_flag, h.mode_read, h.mode = g._mode._flag, g._mode.read, e.mode
    w = e.watch
    w.check()  # registers its dict watchers where it has them
    h.watch_flag = w._flag
    containers, keys, objects = ((w._u_containers, w._u_keys, w._u_objects) if w._flag is not None
                                 else (w._containers, w._keys, w._place_objects))
    assert not w._cells
    for c, k, o in zip(containers, keys, objects):
        h.add_place(c, k, o)
    for t in w._tobjs:
        h.add_ptr(t)
    for entry in [e, *e.others]:
        lender = entry.plan.lender
        assert lender._one is not None
        h.add_set(entry.inputs.leaves[0], lender._first, _replay_of(entry))
    return h


def _replay_of(entry):
    handle = entry.handle
    if isinstance(handle, torch.cuda.CUDAGraph):
        return handle.replay
    runner = entry.runner
    return lambda: runner.replay(handle)  # simulated: the function re-run (or nothing, timing)


def policy(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                               torch.nn.Tanh(), torch.nn.Linear(64, 2)).to(device)


def setup(device, noop=False):
    module = policy(device)
    g = CudaGraphModule(module, backend="cuda" if device.type == "cuda" else "simulate")
    x = torch.randn(1, 8, device=device)
    out = None
    for _ in range(8):  # warm up, capture, and the twins a held result needs
        out = g(x)  # noqa: F841
    out = None
    if noop and device.type != "cuda":  # time the steps alone, not the simulation
        for entry in [g._entries[0], *g._entries[0].others]:
            entry.runner.replay = lambda handle: None
    return module, g, x


def floor_of(g):
    e = g._entries[0]
    buf, static, replay = e.inputs.leaves[0], e.plan.graph[0], _replay_of(e)

    def floor(x):
        buf.copy_(x)
        replay()
        return static

    return floor


def per_call(fn, x, calls):
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = None
    for _ in range(calls):
        out = fn(x)  # held until the next call, as loops hold it
    sync()
    del out
    return (time.perf_counter() - t0) / calls * 1e6


def check(ext, device):
    """The compiled path answers as the eager function does, or hands the call back."""
    module, g, x = setup(device)
    h = make_native(ext, g)
    results = []
    for step in range(40):
        xi = torch.randn(1, 8, device=device)
        if step == 10:
            with torch.no_grad():
                module[0].weight.mul_(0.5)  # in place: the graph reads it
        if step == 20:
            module[2].weight = torch.nn.Parameter(module[2].weight.detach() * 2)  # rebound: stale
            try:
                h(xi)
            except Exception as err:  # the wrapper's answer (on_stale="raise")
                print("rebound parameter refused:", type(err).__name__)
            module, g, x = setup(device)
            h = make_native(ext, g)
            continue
        out = h(xi)
        results.append((out, module(xi)))  # held: the next calls must not overwrite it
        results = results[-2:] if step % 7 else results[-1:]
        for held, expect in results:
            assert torch.equal(held, expect), step
    for change, undo in ((lambda: torch.set_grad_enabled(True), lambda: torch.set_grad_enabled(False)),
                         (module.eval, module.train)):
        change()
        before = h.replays
        try:
            h(x)
            raise AssertionError("a call in another mode answered")
        except Exception as err:  # the wrapper's refusal (max_graphs=1)
            assert h.replays == before and "mode" in str(err).lower(), err
        undo()
    assert torch.equal(h(x), module(x))
    print("check: the compiled path answered as eagerly;", h.replays, "compiled replays")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--check", action="store_true")
    a = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ext = build()
    torch.set_grad_enabled(False)  # a policy acting: the graph of a forward alone
    if a.check:
        check(ext, device)
    _, g, x = setup(device, noop=True)
    h = make_native(ext, g)
    kinds = {"floor": floor_of(g), "python": g, "native": h}
    times = {k: [] for k in kinds}
    for fn in kinds.values():
        per_call(fn, x, 200)
    for _ in range(a.rounds):
        for k, fn in kinds.items():
            times[k].append(per_call(fn, x, a.calls))
    floor = statistics.median(times["floor"])
    print(f"{device}: µs per call, median of {a.rounds} rounds of {a.calls} calls, each result held")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"  {k:8s} {m:7.2f}  {m / floor:.2f}x the floor")
    print("native replays:", h.replays, "python replays:", g._stats.replays)


if __name__ == "__main__":
    main()
