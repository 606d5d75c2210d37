"""tensordict's own tests of its ``CudaGraphModule``, restated against graphmodule's.

Ported from pytorch/tensordict, ``test/compile/test_compile.py`` at commit
03e84fcba6b0f87163b3271ad47700d41cb35a9f: ``test_cudagraph_module_is_released_without_gc``
and every test of ``class TestCudaGraphs`` (the file's only tests of the wrapper), with
the file's autouse ``_reset_dynamo_code_caches`` fixture and the class's
``_set_cuda_device`` fixture and helpers. Same inputs, calls, assertions and
parametrisation; only the import of ``CudaGraphModule`` changed.

Two groups:

- ``test_cudagraph_module_is_released_without_gc`` and ``TestCudaGraphs``: the tests as
  tensordict runs them. Without CUDA both wrappers warn in the constructor and run the
  calls eagerly, so these run on CPU too (``backend="auto"``). Where tensordict skips a
  test without CUDA (``pytest.skip("CudaGraphModule only replays graphs on CUDA")``),
  the test carries the ``cuda`` marker instead.
- ``*_simulated`` and ``TestCudaGraphsSimulated``: CPU variants of the same tests, built
  with ``backend="simulate"``, so that the warmup/capture/replay machinery (checks,
  static buffers, outputs) runs on CPU. Where tensordict guards an assertion with
  ``torch.cuda.is_available()`` because it only holds once a graph replays, the test
  reads ``self.REPLAYS`` (``torch.cuda.is_available()`` in ``TestCudaGraphs``, ``True``
  in ``TestCudaGraphsSimulated``).

A test marked ``xfail(strict=True)`` checks a behaviour graphmodule changes on purpose,
as its README says; every other failure is an incompatibility.
"""

import contextlib
import inspect
import weakref
from typing import Callable

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from tensordict.nn import TensorDictModule
from tensordict.nn.functional_modules import (
    _exclude_td_from_pytree,
    PYTREE_REGISTERED_LAZY_TDS,
    PYTREE_REGISTERED_TDS,
)
from torch.utils._pytree import SUPPORTED_NODES

from graphmodule import CudaGraphModule, InputMismatchError


# original: test_compile.py::_reset_dynamo_code_caches (module-level autouse fixture)
@pytest.fixture(autouse=True)
def _reset_dynamo_code_caches():
    # Tests in this file all exercise torch.compile; a fresh Dynamo code cache
    # between tests keeps recompile/guard-count assertions reliable and prevents
    # one test's frame from leaking into the next.
    torch._dynamo.reset_code_caches()


# original: test_compile.py::test_cudagraph_module_is_released_without_gc
@pytest.mark.parametrize("is_tensordict_module", [False, True])
def test_cudagraph_module_is_released_without_gc(is_tensordict_module):
    if is_tensordict_module:
        module = TensorDictModule(lambda x: x, in_keys=["x"], out_keys=["y"])
    else:

        def module(x):
            return x

    with _exclude_td_from_pytree():
        with (
            pytest.warns(UserWarning)
            if not torch.cuda.is_available()
            else contextlib.nullcontext()
        ):
            wrapper = CudaGraphModule(module)

        wrapper_ref = weakref.ref(wrapper)
        del wrapper
        assert wrapper_ref() is None


# CPU variant of test_compile.py::test_cudagraph_module_is_released_without_gc (backend="simulate")
@pytest.mark.parametrize("is_tensordict_module", [False, True])
def test_cudagraph_module_is_released_without_gc_simulated(is_tensordict_module):
    if is_tensordict_module:
        module = TensorDictModule(lambda x: x, in_keys=["x"], out_keys=["y"])
    else:

        def module(x):
            return x

    with _exclude_td_from_pytree():
        wrapper = CudaGraphModule(module, backend="simulate")

        wrapper_ref = weakref.ref(wrapper)
        del wrapper
        assert wrapper_ref() is None


# original: TestCudaGraphs._set_cuda_device (a class-scoped fixture written as a method
# there; newer pytest deprecates that form, so it lives here and the class uses it)
@pytest.fixture(scope="class")
def _set_cuda_device():
    device = torch.get_default_device()
    do_unset = False
    for tdtype in PYTREE_REGISTERED_TDS + PYTREE_REGISTERED_LAZY_TDS:
        if tdtype in SUPPORTED_NODES:
            do_unset = True
            excluder = _exclude_td_from_pytree()
            excluder.set()
            break
    if torch.cuda.is_available():
        torch.set_default_device("cuda:0")
    yield
    if do_unset:
        excluder.unset()
    torch.set_default_device(device)


SERVED_VALUE = (
    "graphmodule serves it instead (README, 'Against the alternatives'): by default a call that differs "
    "from the graphs held only in a non-tensor value gets a graph of its own (max_graphs=None, up to 8), "
    "so func(torch.zeros(()), 2.0) returns 2.0 as eagerly, where tensordict raises 'Varying inputs must "
    "be torch.Tensor subclasses.' (graphmodule raises it too with max_graphs=1)"
)


@pytest.mark.usefixtures("_set_cuda_device")
@pytest.mark.parametrize("compiled", [False, True])
class TestCudaGraphs:
    # original: the guards tensordict writes as ``torch.cuda.is_available()``
    REPLAYS = torch.cuda.is_available()

    # original: TestCudaGraphs.test_cudagraphs_random
    def test_cudagraphs_random(self, compiled):
        def func(x):
            return x + torch.randn_like(x)

        if compiled:
            func = torch.compile(func)

        with (
            pytest.warns(UserWarning)
            if not torch.cuda.is_available()
            else contextlib.nullcontext()
        ):
            func = CudaGraphModule(func)

        x = torch.randn(10)
        for _ in range(10):
            func(x)
        assert isinstance(func(torch.zeros(10)), torch.Tensor)
        assert (func(torch.zeros(10)) != 0).any()
        y0 = func(x)
        y1 = func(x + 1)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(y0, y1 + 1)

    # original: TestCudaGraphs.test_cudagraphs_module_rewriting_its_input_key
    def test_cudagraphs_module_rewriting_its_input_key(self, compiled):
        """A module that writes an output under one of its input keys.

        The set() rebinds that entry of the captured input during capture, so
        the replay must copy new inputs into the leaves the graph reads, not
        into the rebound entry.
        """

        class Recurrent(torch.nn.Module):
            def forward(self, x, h):
                h = torch.tanh(h + x)
                return h.sum(-1, keepdim=True), h

        module = TensorDictModule(Recurrent(), in_keys=["x", "h"], out_keys=["y", "h"])
        graphed = self._make_cudagraph(module, compiled, warmup=2)

        def make(h):
            return TensorDict({"x": torch.ones(4, 3), "h": torch.full((4, 3), h)}, [4])

        for _ in range(3):
            graphed(make(0.0))
        for h in (1.0, -1.0):
            expected = module(make(h))
            result = graphed(make(h))
            torch.testing.assert_close(result["y"], expected["y"])
            torch.testing.assert_close(result["h"], expected["h"])

    # original: TestCudaGraphs._make_cudagraph
    @staticmethod
    def _make_cudagraph(
        func: Callable, compiled: bool, *args, **kwargs
    ) -> CudaGraphModule:
        if compiled:
            func = torch.compile(func)
        with (
            pytest.warns(UserWarning)
            if not torch.cuda.is_available()
            else contextlib.nullcontext()
        ):
            func = CudaGraphModule(func, *args, **kwargs)
        return func

    # original: TestCudaGraphs.check_types
    @staticmethod
    def check_types(func, *args, **kwargs):
        signature = inspect.signature(func)
        bound_args = signature.bind(*args, **kwargs)
        bound_args.apply_defaults()
        for param_name, param in signature.parameters.items():
            arg_value = bound_args.arguments[param_name]
            if param.annotation != param.empty:
                if not isinstance(arg_value, param.annotation):
                    raise TypeError(
                        f"Argument '{param_name}' should be of type {param.annotation}, but is of type {type(arg_value)}"
                    )

    # original: TestCudaGraphs.test_signature
    def test_signature(self, compiled):
        if compiled:
            pytest.skip()

        def func(x: torch.Tensor):
            return x + torch.randn_like(x)

        with pytest.raises(TypeError):
            self.check_types(func, "a string")
        self.check_types(func, torch.ones(()))

    # original: TestCudaGraphs.test_backprop
    def test_backprop(self, compiled):
        x = torch.nn.Parameter(torch.ones(3))
        y = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([x, y], lr=1)

        def func():
            optimizer.zero_grad()
            z = x + y
            z = z.sum()
            z.backward()
            optimizer.step()

        func = self._make_cudagraph(func, compiled, warmup=4)

        for i in range(1, 11):
            torch.compiler.cudagraph_mark_step_begin()
            func()

            assert (x == 1 - i).all(), i
            assert (y == 1 - i).all(), i
            # assert (x.grad == 1).all()
            # assert (y.grad == 1).all()

    # original: TestCudaGraphs.test_tdmodule
    def test_tdmodule(self, compiled):
        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        assert tdmodule._is_tensordict_module
        for i in range(10):
            td = TensorDict(x=torch.randn(()))
            tdmodule(td)
            assert td["y"] == td["x"] + 1, i

        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        assert tdmodule._is_tensordict_module
        for _ in range(10):
            x = torch.randn(())
            y = tdmodule(x=x)
            assert y == x + 1

        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        assert tdmodule._is_tensordict_module
        for _ in range(10):
            td = TensorDict(x=torch.randn(()))
            tdout = TensorDict()
            tdmodule(td, tensordict_out=tdout)
            assert tdout is not td
            assert "x" not in tdout
            assert tdout["y"] == td["x"] + 1

        tdmodule = lambda td: td.set("y", td.get("x") + 1)  # noqa: E731
        tdmodule = self._make_cudagraph(tdmodule, compiled, in_keys=[], out_keys=[])
        assert tdmodule._is_tensordict_module
        for i in range(10):
            td = TensorDict(x=torch.randn(()))
            tdmodule(td)
            assert tdmodule._out_matches_in
            if i >= tdmodule._warmup and self.REPLAYS:  # original: torch.cuda.is_available()
                assert tdmodule._selected_keys == ["y"]
            assert td["y"] == td["x"] + 1

        tdmodule = lambda td: td.set("y", td.get("x") + 1)  # noqa: E731
        tdmodule = self._make_cudagraph(
            tdmodule, compiled, in_keys=["x"], out_keys=["y"]
        )
        assert tdmodule._is_tensordict_module
        for _ in range(10):
            td = TensorDict(x=torch.randn(()))
            tdmodule(td)
            assert td["y"] == td["x"] + 1

        tdmodule = lambda td: td.copy().set("y", td.get("x") + 1)  # noqa: E731
        tdmodule = self._make_cudagraph(tdmodule, compiled, in_keys=[], out_keys=[])
        assert tdmodule._is_tensordict_module
        for _ in range(10):
            td = TensorDict(x=torch.randn(()))
            tdout = tdmodule(td)
            assert tdout is not td
            assert "y" not in td
            assert tdout["y"] == td["x"] + 1

    # original: TestCudaGraphs.test_tdmodule_outputs_do_not_alias
    def test_tdmodule_outputs_do_not_alias(self, compiled):
        # Every replay writes into the same input and output buffers: the
        # tensordicts returned by earlier calls, the capture call included,
        # must keep their own values.
        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        tds = [
            tdmodule(TensorDict(x=torch.full((3,), float(i)), batch_size=[3]))
            for i in range(6)
        ]
        for i, td in enumerate(tds):
            torch.testing.assert_close(td["x"], torch.full((3,), float(i)))
            torch.testing.assert_close(td["y"], torch.full((3,), float(i + 1)))

    # original: TestCudaGraphs.test_tdmodule_structure_change_raises (skipped there without CUDA)
    @pytest.mark.cuda
    def test_tdmodule_structure_change_raises(self, compiled):
        tdmodule = TensorDictModule(
            lambda x, z: x + z, in_keys=["x", "z"], out_keys=["y"]
        )
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        for _ in range(4):
            tdmodule(
                TensorDict(
                    x=torch.randn(3), z=torch.randn(3), w=torch.randn(3), batch_size=[3]
                )
            )
        # A key that is not an in_key may be missing.
        td = tdmodule(TensorDict(x=torch.ones(3), z=torch.ones(3), batch_size=[3]))
        torch.testing.assert_close(td["y"], torch.full((3,), 2.0))
        with pytest.raises(KeyError, match="missing the in_keys \\['z'\\]"):
            tdmodule(TensorDict(x=torch.randn(3), batch_size=[3]))
        with pytest.raises(ValueError, match="captured with batch_size"):
            tdmodule(TensorDict(x=torch.randn(1), z=torch.randn(1), batch_size=[1]))

    # original: TestCudaGraphs.test_tdmodule_cpu_input_copied_before_return (skipped there without CUDA)
    @pytest.mark.cuda
    @pytest.mark.xfail(
        strict=True,
        raises=InputMismatchError,
        reason="graphmodule raises instead: every leaf's device is checked before the copy "
        "(README, 'What you get over the prior art'), so a pinned CPU entry replayed into a "
        "graph captured on CUDA is an InputMismatchError ('expected device cuda:0, got cpu'), "
        "where tensordict copies it into the CUDA buffer",
    )
    def test_tdmodule_cpu_input_copied_before_return(self, compiled):
        # The caller may overwrite a pinned CPU input as soon as the call returns:
        # the copy to the graph's buffers must be done by then.
        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        for _ in range(4):
            tdmodule(TensorDict(x=torch.zeros(3), batch_size=[3]))
        x = torch.ones(3, device="cpu").pin_memory()
        # Keep the stream busy so that a pending copy would run after the write.
        torch.cuda._sleep(100_000_000)
        td = tdmodule(TensorDict(x=x, batch_size=[3]))
        x.fill_(100.0)
        torch.testing.assert_close(td["y"], torch.full((3,), 2.0))

    # original: TestCudaGraphs.test_tdmodule_entry_shape_change_raises (skipped there without CUDA)
    @pytest.mark.cuda
    def test_tdmodule_entry_shape_change_raises(self, compiled):
        # Same batch size, entry of another shape: it must not be broadcast into
        # the captured buffer, or fail in the copy.
        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        for _ in range(4):
            tdmodule(TensorDict(x=torch.zeros(3, 4), w=torch.zeros(3), batch_size=[3]))
        match = r"entry 'x' of shape torch.Size\(\[3, 4\]\) but got shape"
        for shape in ((3, 1), (3, 5)):
            # Every captured entry is present.
            with pytest.raises(ValueError, match=match):
                tdmodule(
                    TensorDict(x=torch.zeros(shape), w=torch.zeros(3), batch_size=[3])
                )
            # A captured entry that is not an in_key is missing.
            with pytest.raises(ValueError, match=match):
                tdmodule(TensorDict(x=torch.zeros(shape), batch_size=[3]))
        # Captured on a lazy stack, replayed on a dense tensordict.
        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        for _ in range(4):
            tdmodule(
                LazyStackedTensorDict(
                    *TensorDict(x=torch.zeros(3, 4), batch_size=[3]).unbind(0)
                )
            )
        with pytest.raises(ValueError, match=match):
            tdmodule(TensorDict(x=torch.zeros(3, 1), batch_size=[3]))

    # original: TestCudaGraphs.test_tdmodule_uncaptured_in_key_missing (skipped there without CUDA)
    @pytest.mark.cuda
    def test_tdmodule_uncaptured_in_key_missing(self, compiled):
        # An in_key that the captured input did not hold is not reported missing.
        func = self._make_cudagraph(
            lambda td: td.set("y", td["x"] + 1),
            compiled,
            in_keys=["x", "unused"],
            out_keys=["y"],
        )
        for _ in range(4):
            func(TensorDict(x=torch.zeros(3), w=torch.zeros(3), batch_size=[3]))
        td = func(TensorDict(x=torch.ones(3), batch_size=[3]))
        torch.testing.assert_close(td["y"], torch.full((3,), 2.0))

    # original: TestCudaGraphs.test_tdmodule_lazy_and_dense_inputs (skipped there without CUDA)
    @pytest.mark.cuda
    @pytest.mark.parametrize("capture_lazy", [True, False])
    def test_tdmodule_lazy_and_dense_inputs(self, compiled, capture_lazy):
        # Captured on a lazy stack and replayed on a dense tensordict, or the
        # reverse: the leaves have other keys, and must still be copied.

        def make(value, lazy):
            td = TensorDict(x=torch.full((2, 3), value), batch_size=[2])
            return LazyStackedTensorDict(*td.unbind(0), stack_dim=0) if lazy else td

        tdmodule = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
        tdmodule = self._make_cudagraph(tdmodule, compiled)
        for _ in range(4):
            tdmodule(make(0.0, capture_lazy))
        td = tdmodule(make(5.0, not capture_lazy))
        torch.testing.assert_close(td["y"], torch.full((2, 3), 6.0))

    # original: TestCudaGraphs.test_non_tdmodule_shape_change_raises (skipped there without CUDA)
    @pytest.mark.cuda
    def test_non_tdmodule_shape_change_raises(self, compiled):
        func = self._make_cudagraph(lambda x: x + 1, compiled)
        for _ in range(4):
            func(torch.randn(3))
        with pytest.raises(ValueError, match="captured with an input of shape"):
            func(torch.randn(1))
        func = self._make_cudagraph(lambda td: td["x"] + 1, compiled)
        for _ in range(4):
            func(TensorDict(x=torch.randn(3), batch_size=[3]))
        with pytest.raises(ValueError, match="captured with batch_size"):
            func(TensorDict(x=torch.randn(1), batch_size=[1]))

    # original: TestCudaGraphs.test_td_input_non_tdmodule_writes_input
    def test_td_input_non_tdmodule_writes_input(self, compiled):
        # The function adds a key to its input: the capture must run on a
        # tensordict with the warmup structure, or a compiled function
        # recompiles during capture.
        def func(td):
            return td.set("y", td.get("x") + 1)

        func = self._make_cudagraph(func, compiled)
        for _ in range(4):
            td = TensorDict(x=torch.randn(3), batch_size=[3])
            out = func(td)
            torch.testing.assert_close(out["y"], td["x"] + 1)

    # original: TestCudaGraphs.test_repr
    def test_repr(self, compiled):
        func = self._make_cudagraph(lambda x: x + 1, compiled, warmup=3)
        assert "warmup=3" in repr(func)

    # original: TestCudaGraphs.test_td_input_non_tdmodule
    def test_td_input_non_tdmodule(self, compiled):
        func = lambda x: x + 1  # noqa: E731
        func = self._make_cudagraph(func, compiled)
        for i in range(10):
            td = TensorDict(a=1)
            func(td)
            if i == 5:
                assert not func._is_tensordict_module

    # original: TestCudaGraphs.test_td_input_non_tdmodule_nontensor
    @pytest.mark.xfail(torch.cuda.is_available(), strict=True, raises=pytest.fail.Exception,
                       reason=SERVED_VALUE)
    def test_td_input_non_tdmodule_nontensor(self, compiled):
        func = lambda x, y: x + y  # noqa: E731
        func = self._make_cudagraph(func, compiled)
        for i in range(10):
            assert func(torch.zeros(()), 1.0) == 1.0
            if i == 5:
                assert not func._is_tensordict_module
        if self.REPLAYS:  # original: torch.cuda.is_available()
            with pytest.raises(
                ValueError, match="Varying inputs must be torch.Tensor subclasses."
            ):
                func(torch.zeros(()), 2.0)

    # original: TestCudaGraphs.test_state_dict
    def test_state_dict(self, compiled):
        # Create a linear layer and wrap it in CudaGraphModule
        linear = torch.nn.Linear(3, 4)
        linear = self._make_cudagraph(linear, compiled)

        # Run some warmup iterations
        x = torch.randn(10, 3)
        for _ in range(10):
            linear(x)

        # Get state dict
        state_dict = linear.state_dict()
        if compiled:
            state_dict_get = TensorDict(state_dict)
            state_dict_get = state_dict_get.unflatten_keys(".")["_orig_mod"]
        else:
            state_dict_get = state_dict

        assert "weight" in state_dict_get
        assert "bias" in state_dict_get
        assert state_dict_get["weight"].shape == (4, 3)
        assert state_dict_get["bias"].shape == (4,)

        # Create a new instance and load state
        linear2 = torch.nn.Linear(3, 4)
        linear2 = self._make_cudagraph(linear2, compiled)
        linear2.load_state_dict(state_dict)

        # Test that both modules produce the same output
        y1 = linear(x)
        y2 = linear2(x)
        torch.testing.assert_close(y1, y2)


# CPU variants of TestCudaGraphs: the same tests on backend="simulate", which captures
# and replays (each replay re-runs the function on the static buffers) without CUDA.
# The class parametrisation (compiled) and the fixtures are inherited. The tests that
# tensordict runs only with CUDA are re-declared here without the cuda marker.
class TestCudaGraphsSimulated(TestCudaGraphs):
    REPLAYS = True

    # CPU variant of TestCudaGraphs.test_td_input_non_tdmodule_nontensor (changed on purpose)
    @pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=SERVED_VALUE)
    def test_td_input_non_tdmodule_nontensor(self, compiled):
        TestCudaGraphs.test_td_input_non_tdmodule_nontensor(self, compiled)

    @staticmethod
    def _make_cudagraph(
        func: Callable, compiled: bool, *args, **kwargs
    ) -> CudaGraphModule:
        if compiled:
            func = torch.compile(func)
        return CudaGraphModule(func, *args, backend="simulate", **kwargs)

    # CPU variant of TestCudaGraphs.test_cudagraphs_random (it builds its wrapper itself)
    def test_cudagraphs_random(self, compiled):
        def func(x):
            return x + torch.randn_like(x)

        if compiled:
            func = torch.compile(func)

        func = CudaGraphModule(func, backend="simulate")

        x = torch.randn(10)
        for _ in range(10):
            func(x)
        assert isinstance(func(torch.zeros(10)), torch.Tensor)
        assert (func(torch.zeros(10)) != 0).any()
        y0 = func(x)
        y1 = func(x + 1)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(y0, y1 + 1)

    # CPU variant of TestCudaGraphs.test_tdmodule_structure_change_raises
    def test_tdmodule_structure_change_raises(self, compiled):
        TestCudaGraphs.test_tdmodule_structure_change_raises(self, compiled)

    # TestCudaGraphs.test_tdmodule_cpu_input_copied_before_return: no CPU variant (it
    # needs pinned memory and a CUDA stream to race the copy against).
    test_tdmodule_cpu_input_copied_before_return = None

    # CPU variant of TestCudaGraphs.test_tdmodule_entry_shape_change_raises
    def test_tdmodule_entry_shape_change_raises(self, compiled):
        TestCudaGraphs.test_tdmodule_entry_shape_change_raises(self, compiled)

    # CPU variant of TestCudaGraphs.test_tdmodule_uncaptured_in_key_missing
    def test_tdmodule_uncaptured_in_key_missing(self, compiled):
        TestCudaGraphs.test_tdmodule_uncaptured_in_key_missing(self, compiled)

    # CPU variant of TestCudaGraphs.test_tdmodule_lazy_and_dense_inputs
    @pytest.mark.parametrize("capture_lazy", [True, False])
    def test_tdmodule_lazy_and_dense_inputs(self, compiled, capture_lazy):
        TestCudaGraphs.test_tdmodule_lazy_and_dense_inputs(self, compiled, capture_lazy)

    # CPU variant of TestCudaGraphs.test_non_tdmodule_shape_change_raises
    def test_non_tdmodule_shape_change_raises(self, compiled):
        TestCudaGraphs.test_non_tdmodule_shape_change_raises(self, compiled)
