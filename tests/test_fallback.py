"""Without CUDA the wrapper gives a GPU's answers: it serves and refuses the same calls, with the
same messages (``_eager``).

``backend="simulate"`` is our model of a GPU (a replay runs the recorded tensor operations and
no Python); ``backend="eager"`` is the fallback without CUDA. ``test_fallback_parity[focus]``
runs the programs of every scenario focus (``tests/differential/scenario_*.py``) on both, each
beside the plain function: the eager run must give the plain results at every step it serves,
and both runs must serve the same steps and refuse the same one, with the same error class and
message (bar the words that say no graph was captured), and the same counters. Not compared:
programs the simulated capture refuses only because a CPU cannot hold a capturable optimizer (a
GPU serves them, and so does the fallback), and programs whose simulated run differs from the
plain one (there is no GPU's answer to compare with; ``tests/test_scenarios.py`` reports them).

``test_fallback_parity_of_calls[focus]`` does the same with the call sequences of
``tests/test_differential.py`` (each call refused or served alike). On a GPU both run beside real
CUDA graphs too, the fallback on the GPU's tensors (failed captures compared by cause and place,
the original error's text being the runner's).

``TestNamed`` holds one program per difference the comparison has found, each run on both
backends and plainly.
"""

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from graphmodule import CaptureError, CudaGraphModule, InputMismatchError, StaleGraphError, UnsupportedError
from tests.differential.fuzz import EXAMPLES, run_fuzz
from tests.differential.oracle import failure_type, run_case
from tests.differential.scenarios import REGISTRY, refusal, run_scenario
from tests.differential.strategies import cases
from tests.test_differential import SHARES
from tests.test_scenarios import FOCI  # (every focus registered)

SHARE = 0.1  # of GM_FUZZ_EXAMPLES, per focus: each program runs three times
BACKENDS = ("simulate", "eager")
CASE_FOCI = sorted(focus for focus in SHARES if focus != "random")  # (tests/test_differential.py's call sequences)


def _parity(sc, backend, device):
    outcome = run_scenario(dataclasses.replace(sc, also="eager"), backend, device)
    if outcome.backend == backend and not any(d.kind.startswith("parity:") for d in outcome.diffs):
        return  # (the simulated run differs from the plain one: no GPU's answer to compare with, see above)
    if outcome.diffs:
        raise failure_type(outcome.diffs[0].kind)(outcome.report())


@pytest.mark.parametrize("focus", FOCI)
def test_fallback_parity(focus, capsys):
    run_fuzz(f"fallback {focus}", REGISTRY[focus](), _parity, EXAMPLES * SHARE, "simulate", "cpu", capsys)


def _case_parity(case, backend, device):
    """A call sequence of ``tests/test_differential.py``: the eager run as the plain one, and
    refused at the same calls as the graphs, with the same errors."""
    graphs = run_case(case, backend, device)
    if graphs.diffs:
        return  # (the graphs' own difference: no GPU's answer to compare with)
    eager = run_case(case, "eager", device)
    if eager.diffs:
        raise failure_type(eager.diffs[0].kind)(eager.report())
    ours, theirs = _refusals(graphs), _refusals(eager)
    if ours != theirs:
        raise failure_type("parity:refusal")(
            f"{backend} and eager refuse other calls:\n{ours}\n{theirs}\n\n{case.repro(backend)}")


def _refusals(outcome):
    return [(c.label, None if c.refused is None else refusal(c.refused)) for c in outcome.calls]


@pytest.mark.parametrize("focus", CASE_FOCI)
def test_fallback_parity_of_calls(focus, capsys):
    run_fuzz(f"fallback calls {focus}", cases(focus), _case_parity, EXAMPLES * SHARE, "simulate", "cpu", capsys)


@pytest.mark.cuda
@pytest.mark.parametrize("focus", FOCI)
def test_fallback_parity_on_cuda_graphs(focus, capsys):
    """The same beside real CUDA graphs, the fallback (``backend="eager"``) on the GPU's tensors."""
    run_fuzz(f"cuda fallback {focus}", REGISTRY[focus](), _parity, EXAMPLES * SHARE, "cuda", "cuda", capsys)


@pytest.mark.cuda
@pytest.mark.parametrize("focus", CASE_FOCI)
def test_fallback_parity_of_calls_on_cuda_graphs(focus, capsys):
    run_fuzz(f"cuda fallback calls {focus}", cases(focus), _case_parity, EXAMPLES * SHARE, "cuda", "cuda", capsys)


# -- the differences found, one program each ----------------------------------------------------
def _outcomes(graphs, make, calls=4, warmup=1):
    """The outcomes of ``calls`` calls of a fresh program from ``make()`` (a function and how a
    step calls it) on backend ``graphs``, on ``"eager"`` and plainly: ``("served", results)`` or
    ``(step, error class, the error as compared)``."""
    found = {}
    for backend in (graphs, "eager", None):
        fn, step = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = fn if backend is None else CudaGraphModule(fn, warmup=warmup, backend=backend)
            results = []
            try:
                for i in range(calls):
                    results.append(step(g, i))
            except Exception as err:  # noqa: BLE001 - the outcome compared
                found[backend] = (i, type(err), refusal(err))
                continue
        found[backend] = ("served", results)
    return found.pop(graphs), found["eager"], found[None]


def _same(found):
    """The graphs' and the eager outcomes are one; the one outcome."""
    graphs, eager, plain = found
    assert graphs[0] == eager[0], (graphs, eager)
    if graphs[0] == "served":
        torch.testing.assert_close(eager[1], plain[1])
        torch.testing.assert_close(graphs[1], plain[1])
    else:
        assert graphs[1:] == eager[1:]
    return eager


@pytest.fixture(params=["simulate", pytest.param("cuda", marks=pytest.mark.cuda)])
def graphs(request):
    """The backend of graphs the fallback is compared with (on CUDA, beside it on the GPU)."""
    if request.param == "simulate":
        yield request.param
        return
    torch.set_default_device("cuda")
    try:
        yield request.param
    finally:
        torch.set_default_device(None)


def _train_step(*, attribute=False, step_first=False, spectral=False):
    def make():
        torch.manual_seed(0)
        layer = nn.Linear(3, 3)
        if spectral:
            layer = torch.nn.utils.spectral_norm(layer)
        net = nn.Sequential(layer)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def fn(x):
            if step_first:  # reads the gradient the last call left
                opt.step()
            opt.zero_grad()
            loss = net(x).pow(2).sum()
            loss.backward()
            if not step_first:
                opt.step()
            if attribute:
                net.last_loss = loss.detach()
            return loss.detach()

        return fn, lambda g, i: g(torch.ones(2, 3) * i)

    return make


def _plain(fn, x=lambda i: torch.ones(3)):
    return lambda: (fn, lambda g, i: g(x(i)))


def _restoring(fn, restore):
    def step(g, i):
        try:
            return g(torch.ones(3))
        finally:
            restore()

    return lambda: (fn, step)


class TestNamed:
    """Each program served by one backend and refused by the other (or refused with another
    message) before the fallback was checked by a simulated capture."""

    def test_a_train_step_storing_its_loss_on_a_module_is_served(self, graphs):
        assert _same(_outcomes(graphs, _train_step(attribute=True)))[0] == "served"

    def test_old_style_spectral_norm_in_a_train_step_is_served(self, graphs):
        assert _same(_outcomes(graphs, _train_step(spectral=True)))[0] == "served"

    @pytest.mark.parametrize("norm", ["weight_norm", "spectral_norm"])
    def test_old_style_norms_are_served(self, graphs, norm):
        def make():
            torch.manual_seed(0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                layer = getattr(torch.nn.utils, norm)(nn.Linear(3, 3))

            def step(g, i):
                with torch.no_grad():
                    return g(torch.ones(2, 3) * i)

            return layer, step

        assert _same(_outcomes(graphs, make))[0] == "served"

    def test_an_optimizer_step_before_zero_grad_is_refused(self, graphs):
        found = _same(_outcomes(graphs, _train_step(step_first=True)))
        assert found[:2] == (1, UnsupportedError)
        assert "an optimizer step before zero_grad()" in found[2]

    def test_an_aliased_write_is_refused(self, graphs):
        def fn(a, b):
            return a.add_(b)

        def step(g, i):
            x, y = torch.ones(3), torch.ones(3)
            return g(x, x) if i >= 2 else g(x, y)

        found = _same(_outcomes(graphs, lambda: (fn, step)))
        assert found[:2] == (2, InputMismatchError)
        assert "args[1]: expected its own memory (as at capture), got the memory of args[0]" in found[2]

    def test_a_shape_changed_in_place_is_refused_naming_it(self, graphs):
        found = _same(_outcomes(graphs, _plain(lambda x: x.unsqueeze_(0) * 2)))
        assert found[:2] == (1, UnsupportedError)
        assert "args[0] changed its shape or strides in place" in found[2]

    def test_a_host_sync_is_refused(self, graphs):
        found = _same(_outcomes(graphs, _plain(lambda x: x * x.sum().item())))
        assert found[:2] == (1, CaptureError)
        assert "host-sync" in found[2]

    def test_python_state_changed_is_refused_at_the_capture(self, graphs):
        log = []

        def fn(x):
            log.append(1)
            return x * 2

        found = _same(_outcomes(graphs, _plain(fn)))
        assert found[:2] == (1, UnsupportedError)
        assert "closure variable 'log' of" in found[2] and "was modified in place" in found[2]

    @pytest.mark.parametrize("setting,restore", [
        (lambda: torch.set_grad_enabled(False), lambda: torch.set_grad_enabled(True)),
        (lambda: torch.set_default_dtype(torch.float64), lambda: torch.set_default_dtype(torch.float32)),
    ], ids=["set_grad_enabled", "set_default_dtype"])
    def test_torch_global_state_left_set_is_refused(self, graphs, setting, restore):
        def fn(x):
            setting()
            return x * 2

        found = _same(_outcomes(graphs, _restoring(fn, restore)))
        assert found[:2] == (1, UnsupportedError)
        assert "expected torch's global state as before the call after it" in found[2]

    def test_grad_enabled_inside_a_call_under_no_grad_is_refused(self, graphs):
        w = torch.ones(3, requires_grad=True)

        def fn(x):
            with torch.enable_grad():
                return x * w

        def step(g, i):
            with torch.no_grad():
                return g(torch.ones(3))

        found = _same(_outcomes(graphs, lambda: (fn, step)))
        assert found[:2] == (1, UnsupportedError)
        assert "(the function enables grad inside, torch.enable_grad())" in found[2]

    def test_inference_mode_entered_inside_is_refused(self, graphs):
        def fn(x):
            with torch.inference_mode():
                return x * 2

        found = _same(_outcomes(graphs, _plain(fn)))
        assert found[:2] == (1, UnsupportedError)
        assert "(the function enters torch.inference_mode() inside)" in found[2]

    def test_a_wrapper_called_inside_is_not_called_at_later_calls(self, graphs):
        """A graph's replay runs the work of the wrappers its function calls without calling
        them; so does an eager call in a graph's place: they run inline."""
        results = {}
        for backend in (graphs, "eager", None):
            torch.manual_seed(0)
            net = nn.Linear(2, 2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                inner = net if backend is None else CudaGraphModule(net, warmup=1, max_graphs=1, backend=backend)
                g = (lambda x: inner(x) * 2) if backend is None else CudaGraphModule(
                    lambda x: inner(x) * 2, warmup=1, backend=backend)
                with torch.no_grad():  # inner: its own graph of batch 1 (the outer's capture ran it inline)
                    results[backend] = [(g(torch.ones(3, 2) * i), inner(torch.ones(1, 2) * i) if i >= 2 else None)
                                        for i in range(5)]
        for i in range(5):
            for backend in (graphs, "eager"):
                torch.testing.assert_close(results[backend][i][0], results[None][i][0])
                if i >= 2:
                    torch.testing.assert_close(results[backend][i][1], results[None][i][1])

    def test_a_plain_adam_step_is_served(self, graphs):
        """On a GPU the wrapper makes it capturable: the host syncs of its CPU step are not refused."""
        def make():
            torch.manual_seed(0)
            net = nn.Linear(3, 3)
            opt = torch.optim.Adam(net.parameters(), lr=0.1)

            def fn(x):
                opt.zero_grad()
                net(x).sum().backward()
                opt.step()
                return net.weight.detach().clone()

            return fn, lambda g, i: g(torch.ones(2, 3))

        found = _outcomes(graphs, make)
        _, eager, plain = found
        assert eager[0] == "served"
        torch.testing.assert_close(eager[1], plain[1])


def test_the_stale_advice_names_no_call_that_makes_a_graph_stale():
    """``opt.load_state_dict(...)`` replaces the optimizer's state tensors: the advice does not
    name it as an update in place."""
    torch.manual_seed(0)
    net = nn.Linear(3, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    def fn(x):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

    g = CudaGraphModule(fn, warmup=1, backend="simulate")
    for _ in range(3):
        g(torch.ones(2, 3))
    opt.load_state_dict(opt.state_dict())
    with pytest.raises(StaleGraphError) as info:
        g(torch.ones(2, 3))
    advice = str(info.value).split("To fix: ")[1]
    assert advice.startswith("update tensors in place (p.copy_(new), module.load_state_dict(sd) without assign=True, "
                             "an optimizer's state tensors with copy_: opt.load_state_dict replaces them)")
