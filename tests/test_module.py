"""CudaGraphModule: construction, the state machine, the CPU fallback, introspection."""

import array
import itertools

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from graphmodule import CudaGraphModule, GraphStateError, InputMismatchError, StaleGraphError, UnsupportedError

NO_CUDA = not torch.cuda.is_available()


class TestConstruction:
    @pytest.mark.parametrize("warmup", [0, -1, 1.5, "2", True])
    def test_bad_warmup(self, warmup):
        with pytest.raises(ValueError) as info:
            CudaGraphModule(lambda x: x, warmup=warmup, backend="eager")
        assert str(info.value) == f"warmup must be an int >= 1 (got {warmup!r})."

    @pytest.mark.parametrize(
        "option, value, allowed",
        [
            ("outputs", "copy", "'clone', 'safe', 'static'"),
            ("capture_error_mode", "local", "'thread_local', 'global', 'relaxed'"),
            ("on_capture_failure", "ignore", "'raise', 'eager'"),
            ("backend", "gpu", "'auto', 'cuda', 'simulate', 'eager'"),
        ],
    )
    def test_bad_option(self, option, value, allowed):
        options = {"backend": "eager", option: value}
        with pytest.raises(ValueError) as info:
            CudaGraphModule(lambda x: x, **options)
        assert str(info.value) == f"{option} must be one of {allowed} (got {value!r})."

    def test_module_must_be_callable(self):
        with pytest.raises(TypeError, match=r"module must be callable \(got int\)\."):
            CudaGraphModule(3)

    @pytest.mark.skipif(not NO_CUDA, reason="checks the no-CUDA path")
    def test_cuda_backend_without_cuda_is_refused(self):
        with pytest.raises(RuntimeError, match="needs CUDA"):
            CudaGraphModule(lambda x: x, backend="cuda")

    def test_positional_signature_matches_tensordicts(self):
        g = CudaGraphModule(lambda td: td, 3, ["x"], ["y"], None, backend="eager")
        assert (g.warmup, g.in_keys, g.out_keys) == (3, ["x"], ["y"])

    def test_bad_option_is_refused_before_anything_else(self):
        with pytest.raises(ValueError, match="outputs must be one of"):
            CudaGraphModule(lambda x: x, outputs="copy")  # no no-CUDA warning first

    def test_repr_rebuilds_the_call(self):
        def policy(x):
            return x

        g = CudaGraphModule(policy, warmup=3, backend="simulate", outputs="static")
        assert repr(g) == (
            f"CudaGraphModule({policy!r}, warmup=3, in_keys=None, out_keys=None, device=None, "
            "outputs='static', backend='simulate')"
        )


@pytest.mark.skipif(not NO_CUDA, reason="checks the no-CUDA fallback")
class TestWithoutCuda:
    def test_warns_once_at_construction_and_runs_eagerly(self):
        with pytest.warns(UserWarning, match="CUDA is not available, so calls run eagerly") as record:
            g = CudaGraphModule(lambda x: x.sin() * 2)
        assert len(record) == 1
        x = torch.randn(5)
        for _ in range(5):
            torch.testing.assert_close(g(x), x.sin() * 2)  # no further warning (warnings are errors)
        assert g.state == "eager" and g.stats.eager_calls == 3

    def test_checks_inputs_as_a_gpu_would(self):
        with pytest.warns(UserWarning):
            g = CudaGraphModule(lambda x: x + 1)
        for _ in range(3):
            g(torch.zeros(2))
        with pytest.raises(InputMismatchError, match="expected dtype torch.float32, got torch.float64"):
            g(torch.zeros(2, dtype=torch.float64))


class TestStateMachine:
    def test_warmup_then_capture_then_replay(self, make):
        g = make(lambda x: x + 1, warmup=2)
        states = []
        for _ in range(4):
            g(torch.zeros(1))
            states.append(g.state)
        assert states == ["warmup", "warmup", "captured", "captured"]
        s = g.stats
        assert (s.warmup_calls, s.captures, s.replays, s.eager_calls) == (2, 1, 2, 0)

    def test_function_runs_once_per_call(self, make):
        calls = itertools.count()

        def fn(x):
            next(calls)
            return x

        g = make(fn, warmup=2)
        for _ in range(5):
            g(torch.zeros(1))
        assert next(calls) == 3  # warmup twice, capture once; a replay runs no Python

    def test_python_state_changed_by_the_function_is_refused_at_capture(self, make):
        # a replay runs no Python: the counter would stop counting after the capture
        step = 0

        def fn(x):
            nonlocal step
            step += 1
            return x * step

        g = make(fn, warmup=1)
        g(torch.ones(1))
        with pytest.raises(UnsupportedError) as info:
            g(torch.ones(1))
        assert str(info.value).splitlines()[0] == (
            "CudaGraphModule(fn) cannot replay this call as a CUDA graph: the function changes "
            "Python state, which a replay (GPU work only) would not: closure variable 'step' of "
            "TestStateMachine.test_python_state_changed_by_the_function_is_refused_at_capture.<locals>.fn "
            "was rebound (1 → 2)."
        )

    def test_reset_goes_back_to_warmup(self, make):
        g = make(lambda x: x * 2, warmup=1)
        for _ in range(3):
            g(torch.zeros(2))
        g.reset()
        assert g.state == "warmup"
        for _ in range(3):
            out = g(torch.ones(5))
        torch.testing.assert_close(out, torch.full((5,), 2.0))
        assert g.stats.captures == 2

    def test_train_eval_switch_after_capture_is_refused(self, make):
        net = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
        g = make(net, warmup=1, max_graphs=1)  # (by default, eval mode gets a graph of its own)
        with torch.no_grad():
            g(torch.zeros(1, 2))
            g(torch.zeros(1, 2))
            net.eval()
            with pytest.raises(InputMismatchError) as info:
                g(torch.zeros(1, 2))
        assert info.value.mismatches[0].describe() == "module.training: expected mode train mode, got eval mode"


class _RaiseOnce:
    """Makes the function's next run raise once armed (a count in an array written in place:
    no Python state a capture would refuse)."""

    def __init__(self):
        self._left = array.array("q", [0])

    def arm(self):
        self._left[0] = 1

    def __call__(self):
        if self._left[0] > 0:
            self._left[0] -= 1
            raise KeyError("missing entry")


class TestWarmupCount:
    """Warmup calls are counted once they ran, per signature (the calls before the first graph
    of ``max_graphs=N`` together): a warmup call that raises is not one."""

    @pytest.mark.parametrize("max_graphs, second", [(2, (3, 1.0)), (None, (1, 2.0)), (2, None)],
                             ids=["max_graphs=2", "max_graphs=None", "first signature"])
    def test_a_warmup_call_that_raises_is_not_counted(self, make, max_graphs, second):
        raise_once = _RaiseOnce()

        def fn(x, k):
            raise_once()
            return x * k

        g = make(fn, warmup=1, max_graphs=max_graphs)
        if second is not None:  # a graph first, then a second signature's warmup call raises
            for _ in range(2):
                g(torch.ones(1), 1.0)
        rows, k = second or (1, 1.0)
        before = g.stats
        raise_once.arm()
        with pytest.raises(KeyError, match="missing entry"):
            g(torch.ones(rows), k)
        assert g.stats.warmup_calls == before.warmup_calls
        torch.testing.assert_close(g(torch.ones(rows), k), torch.full((rows,), k))  # its warmup call
        assert (g.stats.warmup_calls, g.stats.captures) == (before.warmup_calls + 1, before.captures)
        torch.testing.assert_close(g(torch.ones(rows), k), torch.full((rows,), k))  # its capture
        assert g.stats.captures == before.captures + 1


class TestIntrospection:
    def test_explain_lists_the_captured_signature(self, make):
        g = make(lambda x, scale: x * scale, warmup=1)
        g(torch.zeros(2, 3), scale=2.0)
        g(torch.zeros(2, 3), scale=2.0)
        text = g.explain()
        assert text.splitlines()[0].startswith("CudaGraphModule(<lambda>): state captured, GraphStats(")
        assert "  args[0]: a tensor of shape (2, 3), torch.float32 on cpu" in text
        assert "  kwargs['scale']: constant 2.0" in text

    def test_stats_are_a_snapshot(self, make):
        g = make(lambda x: x, warmup=1)
        before = g.stats
        g(torch.zeros(1))
        assert before.warmup_calls == 0 and g.stats.warmup_calls == 1

    def test_state_dict_passes_through(self, make):
        net = nn.Linear(2, 3)
        g = make(net)
        assert g.state_dict().keys() == net.state_dict().keys()
        other = nn.Linear(2, 3)
        g.load_state_dict(other.state_dict())
        torch.testing.assert_close(net.weight, other.weight)

    def test_state_dict_of_a_function_is_empty(self, make):
        assert make(lambda x: x).state_dict() == {}

    def test_tensordict_module_state_dict(self, make):
        module = TensorDictModule(nn.Linear(2, 2), in_keys=["x"], out_keys=["y"])
        assert set(make(module).state_dict()) == {"module.weight", "module.bias"}


class TestDebugDump:
    """``debug_dump`` says why it cannot dump instead of failing inside torch."""

    @pytest.mark.cuda
    def test_before_capture(self):
        g = CudaGraphModule(lambda x: x + 1, backend="cuda", debug=True)
        with pytest.raises(GraphStateError) as info:
            g.debug_dump("graph.dot")
        assert str(info.value) == ("CudaGraphModule(<lambda>) holds no graph yet (state warmup): call it until "
                                   "it has captured, then dump.")

    @pytest.mark.parametrize("calls", [0, 3])
    def test_simulated_graphs_have_no_structure_before_or_after_capture(self, calls):
        # the runner answers first: waiting for a capture would not help
        g = CudaGraphModule(lambda x: x + 1, backend="simulate", warmup=1, debug=True)
        for _ in range(calls):
            g(torch.zeros(2))
        with pytest.raises(GraphStateError) as info:
            g.debug_dump("graph.dot")
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) records no CUDA graph (backend='simulate': a replay runs the recorded tensor "
            "operations): "
            "there is no graph structure to dump; use backend='cuda' on a GPU.")

    @pytest.mark.cuda
    def test_without_debug(self):
        g = CudaGraphModule(lambda x: x + 1, backend="cuda", warmup=1)
        for _ in range(2):
            g(torch.zeros(2, device="cuda"))
        with pytest.raises(GraphStateError, match=r"built without debug=True.*CudaGraphModule\(\.\.\., debug=True\)"):
            g.debug_dump("graph.dot")

    def test_simulated_graph_has_no_structure(self, tmp_path):
        g = CudaGraphModule(lambda x: x + 1, backend="simulate", warmup=1, debug=True)
        for _ in range(2):
            g(torch.zeros(2))
        with pytest.raises(GraphStateError, match="records no CUDA graph .*use backend='cuda' on a GPU"):
            g.debug_dump(tmp_path / "graph.dot")
        assert not (tmp_path / "graph.dot").exists()
        assert g(torch.ones(2)).tolist() == [2.0, 2.0]  # still usable

    @pytest.mark.parametrize("value", [1, "yes", None])
    def test_debug_must_be_bool(self, value):
        with pytest.raises(ValueError, match=rf"debug must be True or False \(got {value!r}\)"):
            CudaGraphModule(lambda x: x, backend="eager", debug=value)


def _double(x):
    return x * 2


# call sequences: (shape, grad enabled) per call, and the wrapper's options
SEQUENCES = {
    "second_batch_size": ([(3, True)] * 3 + [(4, True)] * 3 + [(3, True), (4, True)], {"max_graphs": 2}),
    "grad_mode_switch": ([(3, True)] * 3 + [(3, False)] * 3 + [(3, True)], {"max_graphs": 2}),
    "third_signature_refused": ([(3, True)] * 3 + [(4, True)] * 3 + [(5, True)], {"max_graphs": 2}),
    "evict": ([(3, True)] * 3 + [(4, True)] * 3 + [(3, True)] * 3, {"on_graph_limit": "evict"}),
    "one_graph": ([(3, True)] * 3 + [(4, True)], {}),
}


def _outcomes(backend, calls, options):
    """What each call did (served, and whether its result tracks gradients; or refused, and
    why), and the counters a graph and an eager signature share."""
    g = CudaGraphModule(_double, warmup=1, backend=backend, **options)
    out = []
    for n, grad in calls:
        x = torch.arange(float(n), requires_grad=True)
        with torch.set_grad_enabled(grad):
            try:
                got = g(x)
            except InputMismatchError as err:
                out.append(("refused", err.mismatches[0].kind))
                break
            torch.testing.assert_close(got, _double(x))
            out.append(("served", got.requires_grad))
    s = g.stats
    served = s.replays if backend == "simulate" else s.eager_calls
    return out, (s.warmup_calls, served, s.evictions, s.input_mismatches, s.graphs)


class TestEagerAcceptsWhatGraphsAccept:
    """The CPU fallback (backend="eager", or "auto" without CUDA) serves and refuses the calls
    the graph path does (simulated here), ``max_graphs`` included."""

    @pytest.mark.parametrize("name", sorted(SEQUENCES))
    def test_the_same_calls_are_served(self, name):
        calls, options = SEQUENCES[name]
        assert _outcomes("eager", calls, options) == _outcomes("simulate", calls, options)

    def test_a_second_signature_is_warmed_up_and_counted(self):
        g = CudaGraphModule(_double, warmup=2, backend="eager", max_graphs=2)
        for n in (3, 3, 3, 4, 4, 4, 4, 3):
            g(torch.zeros(n))
        s = g.stats
        assert (g.state, s.warmup_calls, s.eager_calls, s.captures, s.replays, s.graphs) == ("eager", 4, 4, 0, 0, 2)

    @pytest.mark.parametrize("on_stale", ["raise", "recapture"])
    def test_a_replaced_parameter_is_stale_as_on_a_gpu(self, on_stale):
        lin = nn.Linear(2, 2)
        g = CudaGraphModule(lin, warmup=1, backend="eager", on_stale=on_stale)
        x = torch.ones(1, 2)
        with torch.no_grad():
            for _ in range(2):
                g(x)
            lin.weight = nn.Parameter(torch.zeros(2, 2))
            if on_stale == "raise":
                with pytest.raises(StaleGraphError) as info:
                    g(x)
                assert str(info.value).splitlines()[0] == (
                    "CudaGraphModule(Linear) was first called after warmup (eagerly: no CUDA graph) reading state "
                    "that has changed since (a CUDA graph would replay what it read then):")
                assert "or pass on_stale='recapture' to warm up again whenever" in str(info.value)
                return
            for _ in range(2):
                torch.testing.assert_close(g(x), lin(x))
        s = g.stats
        assert (g.state, s.recaptures, s.warmup_calls, s.eager_calls) == ("eager", 1, 2, 2)

    def test_a_hook_that_computes_tensors_is_served_as_on_a_gpu(self):
        lin = nn.Linear(2, 2)
        lin.register_forward_hook(lambda module, args, out: out * 2)
        g = CudaGraphModule(lin, warmup=1, backend="eager")
        for i in range(3):
            x = torch.full((1, 2), float(i))
            torch.testing.assert_close(g(x), lin(x))
        assert g.stats.eager_calls == 2

    def test_after_a_failed_capture_every_signature_runs_eagerly_within_max_graphs(self):
        # on_capture_failure="eager": no capture is tried again, and signatures are kept as graphs
        runs = itertools.count(1)

        def fn(x):
            if next(runs) == 2:  # the capture (warmup=1 makes it the second run)
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
            return x * 2

        g = CudaGraphModule(fn, warmup=1, backend="simulate", on_capture_failure="eager", max_graphs=2)
        g(torch.ones(3))
        with pytest.warns(UserWarning, match="runs eagerly from now on"):
            g(torch.ones(3))
        for n in (4, 4, 4, 3):
            torch.testing.assert_close(g(torch.ones(n)), torch.full((n,), 2.0))
        s = g.stats
        assert (g.state, s.capture_failures, s.captures, s.warmup_calls, s.eager_calls, s.graphs) == (
            "eager", 1, 0, 2, 4, 2)
        with pytest.raises(InputMismatchError) as info:
            g(torch.ones(5))
        assert str(info.value).splitlines()[0] == (
            "CudaGraphModule(fn) was first called after warmup (eagerly: no CUDA graph) with other inputs than "
            "this call's (1 mismatch):")

    def test_explain_names_no_graph(self):
        g = CudaGraphModule(_double, warmup=1, backend="eager", max_graphs=2)
        for n in (3, 3, 4, 4):
            g(torch.zeros(n))
        assert g.explain().splitlines()[1:] == [
            "signature (no CUDA graph: calls run eagerly) 0 inputs:",
            "  args[0]: a tensor of shape (4,), torch.float32 on cpu",
            "  outputs: the function's own results (run eagerly)",
            "signature (no CUDA graph: calls run eagerly) 1 inputs:",
            "  args[0]: a tensor of shape (3,), torch.float32 on cpu",
            "  outputs: the function's own results (run eagerly)",
        ]



@pytest.mark.skipif(not NO_CUDA, reason="checks the no-CUDA fallback")
class TestMessagesWithoutCuda:
    @staticmethod
    def _eager(**options):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            return CudaGraphModule(lambda x: x + 1, warmup=1, **options)

    def test_a_mismatch_does_not_speak_of_a_capture(self):
        g = self._eager()
        for _ in range(2):
            g(torch.zeros(3))
        with pytest.raises(InputMismatchError) as info:
            g(torch.zeros(4))
        assert str(info.value).splitlines()[:2] == [
            "CudaGraphModule(<lambda>) was first called after warmup (eagerly: no CUDA graph) with other inputs "
            "than this call's (1 mismatch):",
            "  args[0]: expected shape (3,), got (4,)",
        ]

    @pytest.mark.parametrize("calls", [0, 3])
    def test_debug_dump_does_not_advise_waiting_for_a_capture(self, calls):
        g = self._eager(debug=True)
        for _ in range(calls):
            g(torch.zeros(3))
        with pytest.raises(GraphStateError) as info:
            g.debug_dump("graph.dot")
        assert str(info.value) == ("CudaGraphModule(<lambda>) records no CUDA graph (no CUDA: it runs eagerly): "
                                   "there is no graph structure to dump; use backend='cuda' on a GPU.")


class TestUnderTorchCompile:
    """``torch.compile`` around a wrapper, or around code that calls one: dynamo does not trace
    the wrapper (a graph break at its call), which then warms up, captures and replays as
    without compile. ``backend="eager"``: only dynamo's frame handling is under test."""

    @staticmethod
    def _counting():
        """A dynamo backend that runs the traced graph as it is, counting compilations."""
        compiled = []

        def backend(gm, example_inputs):
            compiled.append(gm)
            return gm.forward

        return backend, compiled

    def test_compile_around_a_wrapper_equals_the_compiled_function(self, graph_backend):
        import torch._dynamo

        torch._dynamo.reset()
        w = torch.randn(3, 3)

        def f(x):
            return (x @ w).relu() + 1

        g = CudaGraphModule(f, warmup=2, backend=graph_backend)
        compiled_g, compiled_f = torch.compile(g, backend="eager"), torch.compile(f, backend="eager")
        for i in range(6):
            x = torch.randn(2, 3)
            out = compiled_g(x)
            torch.testing.assert_close(out, compiled_f(x))
            torch.testing.assert_close(out, f(x))
            assert out.shape == (2, 3) and out.dtype == torch.float32 and out.device == x.device
        assert g.state == "captured"
        assert (g.stats.warmup_calls, g.stats.captures, g.stats.replays) == (2, 1, 4)  # (the capturing call replays)

    def test_compiled_function_calling_a_wrapper(self, graph_backend):
        import torch._dynamo

        torch._dynamo.reset()
        backend, compiled = self._counting()
        w = torch.randn(3, 3)

        def f(x):
            return (x @ w).tanh()

        g = CudaGraphModule(f, warmup=2, backend=graph_backend)

        def step(x, y):
            return g(x * 2) - y

        compiled_step = torch.compile(step, backend=backend)
        plain = lambda x, y: f(x * 2) - y  # noqa: E731
        for i in range(6):
            x, y = torch.randn(2, 3), torch.randn(2, 3)
            torch.testing.assert_close(compiled_step(x, y), plain(x, y))
        assert g.state == "captured"
        assert (g.stats.warmup_calls, g.stats.captures, g.stats.replays) == (2, 1, 4)  # (the capturing call replays)
        # the code around the wrapper is compiled (before and after its call), the wrapper's is not
        assert len(compiled) == 2
        traced = "".join(gm.code for gm in compiled)
        assert "matmul" not in traced and "tanh" not in traced

    def test_compiled_function_inside_a_wrapper_under_compile(self, graph_backend):
        # the documented pattern (a compiled function wrapped) keeps compiling its function,
        # also when code around the wrapper is compiled
        import torch._dynamo

        torch._dynamo.reset()
        backend, compiled = self._counting()

        def f(x):
            return torch.nn.functional.gelu(x) * 3

        g = CudaGraphModule(torch.compile(f, backend=backend), warmup=2, backend=graph_backend)
        outer = torch.compile(lambda x: g(x) + 1, backend="eager")
        for _ in range(6):
            x = torch.randn(4)
            torch.testing.assert_close(outer(x), f(x) + 1)
        assert g.state == "captured" and g.stats.captures == 1
        assert len(compiled) == 1 and "gelu" in compiled[0].code
