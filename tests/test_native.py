"""The compiled hot path (``_native``) against the Python path and the eager function.

Every test runs the same program twice, the Python path then the compiled one, and
compares everything a caller sees: values, dtypes, shapes, which object is returned, the
errors (type and message) and the counters. The compiled path must also have served calls
(or the comparison proves nothing).
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphmodule
from graphmodule import CudaGraphModule, _native


@pytest.fixture(scope="module")
def built():
    """The compiled path, built (30-60 s the first time on a machine) but not installed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = graphmodule.enable_native()
    if not ok:
        reason = "; ".join(str(w.message) for w in caught) or "no reason given"
        pytest.skip(f"the compiled hot path could not be built here: {reason}")
    _native.disable_native()
    yield
    _native.disable_native()


@pytest.fixture
def native(built):
    """The compiled path installed for one test, and taken off after it, pass or fail."""
    assert graphmodule.enable_native()
    yield
    _native.disable_native()


def policy(device="cpu", seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(device)


OPS = ["call", "call", "call", "drop", "hold_view", "release", "eval", "train", "inplace", "rebind",
       "data", "shape", "kw", "thread", "inference", "reset", "grad", "closure"]
# results held, dropped, viewed and released, in every outputs mode
HOLDING = ["call", "drop", "call", "release", "call", "call", "call", "hold_view", "call", "release", "drop", "drop"]
# mode, parameters rebound or their memory replaced, a closure rebound, another thread,
# another shape, keywords, inference tensors, grad mode, resets: each between calls
CHANGES = ["call", "eval", "call", "train", "call", "inplace", "call", "thread", "call", "inference", "call",
           "shape", "call", "kw", "call", "grad", "call", "closure", "call", "closure", "call", "data", "call",
           "reset", "call", "call", "call", "rebind", "call", "reset", "call", "call", "call"]


def run(ops, native, backend="simulate", device="cpu", outputs="safe", style="pos"):
    """Run ``ops`` on a fresh policy and wrapper; what a caller observes, call by call.
    Each result is also checked against the plain function on the same inputs, and the
    inputs against what they were before the call.

    ``style``: how the program calls the wrapper: ``g(x)`` ("pos"), ``g(x=x)`` ("kw") or
    ``g(x, h)`` ("two"); the "kw" op calls it the other way."""
    if native:
        assert graphmodule.enable_native()
    else:
        _native.disable_native()
    try:
        module = policy(device)
        scale = 1.0

        def fn(x, h=None):  # a closure: its cells are watched ("closure" rebinds `scale`)
            if h is not None:
                x = x + h
            return module(x) * scale if scale != 1.0 else module(x)

        g = CudaGraphModule(fn, backend=backend, outputs=outputs)
        gen = torch.Generator().manual_seed(1)
        held, seen, last, kept = [], [], [None], []
        served = 0

        def observe(made):
            before = [t.clone() for t in (*made[0], *made[1].values())]
            try:
                out = call(made)
            except Exception as err:  # the error a caller gets
                seen.append(("error", type(err).__name__, str(err).splitlines()[0]))
                return
            torch.testing.assert_close(out, fn(*made[0], **made[1]), rtol=1e-5, atol=1e-6)  # the eager answer
            for t, was in zip((*made[0], *made[1].values()), before):
                assert torch.equal(t, was)  # the call left its arguments as they were
            same = out is last[0]
            last[0] = out
            held.append((out, out.detach().cpu().tolist()))
            seen.append(("ok", out.detach().cpu().tolist(), out.dtype, tuple(out.shape), out.requires_grad, same))

        def tensor(rows=1):
            return torch.randn(rows, 4, generator=gen).to(device)

        def x(rows=1):  # the call's arguments
            if style == "two":
                return (tensor(rows), tensor(rows)), {}
            return ((tensor(rows),), {}) if style == "pos" else ((), {"x": tensor(rows)})

        def other(rows=1):  # the same call, the other way
            (a, *b), _ = ((tensor(rows), tensor(rows)), {}) if style == "two" else ((tensor(rows),), {})
            if style == "kw":
                return (a,), {}
            return ((), {"x": a, "h": b[0]}) if style == "two" else ((), {"x": a})

        def call(made):
            return g(*made[0], **made[1])

        with torch.no_grad():
            for _ in range(3):
                observe(x())
            for op in ops:
                if op == "call":
                    observe(x())
                elif op == "drop":
                    try:
                        call(x())
                    except Exception as err:
                        seen.append(("error", type(err).__name__, str(err).splitlines()[0]))
                    last[0] = None
                elif op == "hold_view" and held:
                    view = held[-1][0][:, :1]
                    held.append((view, view.detach().cpu().tolist()))
                elif op == "release":
                    held.clear()
                    last[0] = None
                elif op == "eval":
                    module.eval()
                elif op == "train":
                    module.train()
                elif op == "inplace":
                    module[0].weight.mul_(0.5)
                elif op == "rebind":
                    module[2].weight = torch.nn.Parameter(module[2].weight * 2)
                elif op == "data":  # (the old memory kept: a new tensor at its address is no change)
                    kept.append(module[0].bias.data)
                    module[0].bias.data = module[0].bias.data + 1
                elif op == "shape":
                    observe(x(3))
                elif op == "kw":
                    observe(other())
                elif op == "thread":
                    box = []
                    xt = x()

                    def worker():
                        try:
                            with torch.no_grad():
                                box.append(call(xt))
                        except Exception as err:
                            box.append((type(err).__name__, str(err).splitlines()[0]))

                    t = threading.Thread(target=worker)
                    t.start()
                    t.join()
                    if isinstance(box[0], torch.Tensor):
                        torch.testing.assert_close(box[0], fn(*xt[0], **xt[1]), rtol=1e-5, atol=1e-6)
                        box[0] = box[0].cpu().tolist()
                    seen.append(("thread", box))
                elif op == "inference":
                    with torch.inference_mode():
                        xi = x()
                    observe(xi)
                elif op == "reset":
                    g.reset()
                elif op == "grad":
                    with torch.enable_grad():
                        observe(x())
                elif op == "closure":
                    scale = 0.5 if scale == 1.0 else 1.0
                if native and g._hot:
                    served = max(served, _native.served(g._hot))
            # what the caller still holds (results, views) is what it was when returned
            for out, value in held:
                assert out.detach().cpu().tolist() == value
        stats = g.stats
        counters = (stats.replays, stats.captures, stats.warmup_calls, stats.input_mismatches, stats.twin_captures,
                    stats.copy_recaptures, stats.recaptures)
        return seen, counters, len(held), served
    finally:
        _native.disable_native()


def compare(ops, **kwargs):
    python = run(ops, native=False, **kwargs)
    native = run(ops, native=True, **kwargs)
    assert native[0] == python[0]  # every result and error
    assert native[1] == python[1]  # the counters
    assert native[2] == python[2]
    return native[3]


# -- the compiled path serves calls, and answers as the Python path ----------------------


def armed(**kwargs):
    """A policy and its wrapper, captured, with the compiled path serving its calls."""
    module = policy()
    g = CudaGraphModule(module, backend="simulate", **kwargs)
    with torch.no_grad():
        for _ in range(5):
            g(torch.randn(1, 4))
    assert _native.served(g._hot) > 0
    return module, g


def test_a_loop_is_served_natively_with_eager_results(native):
    module = policy()
    g = CudaGraphModule(module, backend="simulate")
    with torch.no_grad():
        outs = []
        for step in range(50):
            x = torch.randn(1, 4)
            out = g(x)
            assert torch.equal(out, module(x))
            outs.append((out, module(x)))
            outs = outs[-2:]  # the loop holds the last two results
        served = _native.served(g._hot)
    assert served >= 40
    assert g.stats.replays == 48
    for out, expect in outs:
        assert torch.equal(out, expect)


@pytest.mark.parametrize("outputs", ["safe", "static", "clone"])
def test_outputs_modes_as_the_python_path(built, outputs):
    assert compare(HOLDING, outputs=outputs) > 0


@pytest.mark.parametrize("style", ["pos", "kw", "two"])
def test_each_change_is_handed_to_the_python_path(built, style):
    assert compare(CHANGES, style=style) > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(OPS), max_size=25), st.sampled_from(["pos", "kw", "two"]))
def test_generated_programs_as_the_python_path(built, ops, style):
    compare(ops, style=style)


def test_a_state_armed_before_disable_native_is_never_used_after(native):
    # the Python path changes the wrapper while the compiled path is off (a recapture
    # after a parameter is rebound); once back on, the old mirror must not serve a call
    module, g = armed(on_stale="recapture")
    with torch.no_grad():
        old = g._hot
        served = _native.served(old)
        _native.disable_native()
        module[2].weight = torch.nn.Parameter(module[2].weight * 2)
        g(torch.randn(1, 4))  # the Python path: a new graph
        assert g.stats.recaptures == 1
        graphmodule.enable_native()
        x = torch.randn(1, 4)
        assert torch.equal(g(x), module(x))
        assert _native.served(old) == served and g._hot is not old
        for _ in range(3):
            assert torch.equal(g(x), module(x))
        assert _native.served(g._hot) > 0


def test_calls_it_keeps_declining_end_on_the_python_path(native):
    # keywords in either order, alternating: each call re-arms the compiled path for the
    # order just used, then the other order hands it back; after MISSES_LIMIT such arms it
    # stops trying, and every call is still the eager answer
    module = policy()

    def fn(x, h):
        return module(x + h)

    g = CudaGraphModule(fn, backend="simulate")
    with torch.no_grad():
        for step in range(2 * _native.MISSES_LIMIT + 10):
            x, h = torch.randn(1, 4), torch.randn(1, 4)
            out = g(x=x, h=h) if step % 2 else g(h=h, x=x)
            assert torch.equal(out, fn(x, h))
    assert g._hot is False
    assert g.stats.replays == 2 * _native.MISSES_LIMIT + 8


def test_a_python_call_drops_the_state_armed_before_it(native):
    # Another thread read "not armed", then this thread armed the wrapper, then the other
    # thread's Python path ran (switching the wrapper to its thread): the state armed
    # before must not serve this thread's next call, which must switch back through the
    # Python path (on CUDA: order its stream after the other thread's replay).
    module, g = armed()
    with torch.no_grad():
        hot = g._hot
        served = _native.served(hot)
        other = threading.Thread(target=lambda: torch.no_grad()(g._python_call)(torch.randn(1, 4)))
        other.start()
        other.join()
        assert g._thread == other.ident and g._hot is not hot
        x = torch.randn(1, 4)
        assert torch.equal(g(x), module(x))
        assert g._thread == threading.get_ident()
        assert _native.served(hot) == served


def test_a_failed_build_warns_and_keeps_the_python_path(built, monkeypatch):
    import torch.utils.cpp_extension as cpp

    def broken(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    _native.disable_native()
    monkeypatch.setattr(cpp, "load", broken)
    with pytest.warns(RuntimeWarning, match="could not be built .*Ninja is required.*Python path"):
        assert graphmodule.enable_native() is False
    assert not graphmodule.native_enabled()
    module = policy()
    g = CudaGraphModule(module, backend="simulate")
    with torch.no_grad():
        x = torch.randn(1, 4)
        for _ in range(4):
            assert torch.equal(g(x), module(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert graphmodule.enable_native() is False  # once: no second warning
    _native.disable_native()


def test_tensordict_modules_and_many_graphs_stay_on_the_python_path(native):
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    td_module = TensorDictModule(policy(), in_keys=["obs"], out_keys=["action"])
    g = CudaGraphModule(td_module, backend="simulate")
    many = CudaGraphModule(policy(), backend="simulate", max_graphs=2)
    with torch.no_grad():
        for _ in range(5):
            td = TensorDict({"obs": torch.randn(1, 4)}, [1])
            assert torch.equal(g(td)["action"], td_module(td.clone())["action"])
            many(torch.randn(1, 4))
    assert g._hot is False and many._hot is False
    assert g.stats.replays == 3 and many.stats.replays == 3


# -- on a GPU: real graphs --------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("outputs", ["safe", "static", "clone"])
def test_cuda_outputs_modes_as_the_python_path(built, outputs):
    assert compare(HOLDING, backend="cuda", device="cuda", outputs=outputs) > 0


@pytest.mark.cuda
@pytest.mark.parametrize("style", ["pos", "kw", "two"])
def test_cuda_each_change_is_handed_to_the_python_path(built, thread_warm, style):
    assert compare(CHANGES, backend="cuda", device="cuda", style=style) > 0


@pytest.fixture(scope="module")
def thread_warm(built):
    """A first capture from a new thread in a process can fail where later ones do not
    (CUDA's per-thread state, on either path): run one before comparing the paths."""
    run(["thread", "call"], native=False, backend="cuda", device="cuda")


@pytest.mark.cuda
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(OPS), max_size=25), st.sampled_from(["pos", "kw", "two"]))
def test_cuda_generated_programs_as_the_python_path(built, thread_warm, ops, style):
    compare(ops, backend="cuda", device="cuda", style=style)
