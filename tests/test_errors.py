"""Error messages: expected, got, where, what to do; structured fields; picklable."""

import contextlib
import pickle
from typing import Any, Callable, NamedTuple

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule, TensorDictSequential, set_interaction_type
from torch import nn

from graphmodule import CaptureError, CudaGraphModule, InputMismatchError, Mismatch, MismatchKind, RequiresGradError
from tests.test_mode_globals import default_dtype, deterministic


def test_mismatch_describe_forms():
    assert Mismatch("args[0]", "shape", "(2,)", "(3,)").describe() == "args[0]: expected shape (2,), got (3,)"
    assert Mismatch("kwargs['x']", "missing", "a tensor", "nothing").describe() == "kwargs['x']: missing (expected a tensor)"
    assert Mismatch("args[1]", "extra", "", "3").describe() == "args[1]: not in the captured inputs (got 3)"


def test_advice_is_given_once_per_kind():
    err = InputMismatchError("G", [Mismatch("a", "shape", "(1,)", "(2,)"), Mismatch("b", "shape", "(1,)", "(3,)")])
    assert str(err).count("To fix:") == 1


def test_errors_pickle_with_their_fields():
    err = InputMismatchError("G", [Mismatch("a", "dtype", "torch.float32", "torch.int64")])
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.mismatches == err.mismatches
    grad = RequiresGradError("G", [Mismatch("a", "requires_grad", "False", "True")])
    assert str(pickle.loads(pickle.dumps(grad))) == str(grad)
    cap = CaptureError("G", "host-sync", "do less", RuntimeError("x"), "f.py:1 in f")
    again = pickle.loads(pickle.dumps(cap))
    assert (again.cause, again.where) == ("host-sync", "f.py:1 in f")


def test_capture_error_message_shape():
    err = CaptureError("CudaGraphModule(step)", "host-sync", "move the sync out.", RuntimeError("bad\nmore"), "train.py:3 in step")
    assert str(err) == (
        "CudaGraphModule(step) failed to capture its CUDA graph at train.py:3 in step: RuntimeError: bad\n"
        "Likely cause (host-sync): move the sync out."
    )


def test_describe_never_prints_tensor_data():
    # Real mismatches of a wrapper on large tensors of distinctive values: every message
    # names the input (path, shape, dtype, device) and prints none of its data.
    captured = torch.full((1000, 1000), 1234.5678)
    g = CudaGraphModule(lambda x, scale, **kw: x * scale, warmup=1, backend="simulate")
    g(captured, 3)
    g(captured, 3)
    big = torch.full((1000, 1000), 98765.4321, dtype=torch.float64)
    expected = {
        "wrong dtype, a tensor for a constant": (
            lambda: g(big, big),
            [
                "args[0]: expected dtype torch.float32, got torch.float64",
                "args[1]: expected type 3, got a tensor of shape (1000, 1000), torch.float64 on cpu",
            ],
        ),
        "an extra tensor": (
            lambda: g(captured, 3, extra=big),
            ["kwargs['extra']: not in the captured inputs (got a tensor of shape (1000, 1000), torch.float64 on cpu)"],
        ),
        "a missing tensor": (
            lambda: g(),
            [
                "args[0]: missing (expected a tensor of shape (1000, 1000), torch.float32 on cpu)",
                "args[1]: missing (expected 3)",
            ],
        ),
    }
    for what, (call, lines) in expected.items():
        with pytest.raises(InputMismatchError) as info:
            call()
        text = str(info.value)
        assert [m.describe() for m in info.value.mismatches] == lines, what
        assert text.startswith("CudaGraphModule(<lambda>) was captured with other inputs than this call's ("), what
        assert text.splitlines()[1 : 1 + len(lines)] == [f"  {line}" for line in lines], what
        # no value of either tensor, in any format torch prints it ("98765.4321", "9.8765e+04")
        for data in ("tensor(", "8765", "1234", "1.2346e"):
            assert data not in text, (what, data)
        # and nothing else: the header, one line per mismatch, the advice
        rest = text.splitlines()[1 + len(lines) :]
        assert rest and all(line.startswith("To fix: ") for line in rest), (what, rest)


# -- every kind of mismatch, through the public API ------------------------------------------


def _add_(a, b):
    a.add_(b)
    return a


def _sequential():
    first = TensorDictModule(lambda a: a * 0.5, in_keys=["a"], out_keys=["hidden"])
    second = TensorDictModule(lambda h: (h * 2, h * 3), in_keys=["hidden"], out_keys=["out", ("nested", "out2")])
    return TensorDictSequential(first, second)


def _td(**entries):
    return TensorDict(entries, batch_size=[2])


def _layer():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Sigmoid())


def _hooked(g):
    g.module[0].register_full_backward_hook(lambda m, gi, go: None)
    return g(torch.ones(2, 3, requires_grad=True))


def _square():
    return torch.arange(9.0).reshape(3, 3)


class Case(NamedTuple):
    """A wrapper of ``fn`` called (warmup, capture) with ``calls()``'s arguments (and keyword
    arguments ``kwargs()``), then once with
    ``refused(g)``, under ``under``; ``line``: the mismatch's line, in a capture's words."""

    fn: Callable[[], Any]
    calls: Callable[[], tuple]
    refused: Callable[[Any], Any]
    line: str
    under: Callable[[], Any] = contextlib.nullcontext
    backward: bool = False  # each capturing call's result is backpropagated (a layer)
    kwargs: Callable[[], dict] = dict


_ONES = lambda: (torch.ones(3),)  # noqa: E731
CASES = {
    MismatchKind.STRUCTURE: Case(lambda: lambda p: p[0] + p[1], lambda: ((torch.ones(3), torch.ones(3)),),
                                 lambda g: g([torch.ones(3), torch.ones(3)]),
                                 "inputs: expected structure (((*, *),), {}), got (([*, *],), {})"),
    MismatchKind.ORDER: Case(lambda: lambda d: d["a"] - d["b"], lambda: ({"a": torch.ones(3), "b": torch.ones(3)},),
                             lambda g: g({"b": torch.ones(3), "a": torch.ones(3)}),
                             "args[0]: expected key order ['a', 'b'], got ['b', 'a']"),
    MismatchKind.MISSING: Case(lambda: lambda a, b=None: a * 2, lambda: (torch.ones(3), torch.ones(3)),
                               lambda g: g(torch.ones(3)),
                               "args[1]: missing (expected a tensor of shape (3,), torch.float32 on cpu)"),
    MismatchKind.EXTRA: Case(lambda: lambda a, **kw: a * 2, _ONES, lambda g: g(torch.ones(3), b=torch.ones(2)),
                             "kwargs['b']: not in the captured inputs (got a tensor of shape (2,), torch.float32 on cpu)"),
    MismatchKind.TYPE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(2.0), "args[0]: expected type a tensor, got 2.0"),
    MismatchKind.SHAPE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(4)),
                             "args[0]: expected shape (3,), got (4,)"),
    MismatchKind.DTYPE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3, dtype=torch.float64)),
                             "args[0]: expected dtype torch.float32, got torch.float64"),
    MismatchKind.DEVICE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3, device="meta")),
                              "args[0]: expected device cpu, got meta"),
    MismatchKind.LAYOUT: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3).to_sparse()),
                              "args[0]: expected layout torch.strided, got torch.sparse_coo"),
    MismatchKind.REQUIRES_GRAD: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3, requires_grad=True)),
                                     "args[0]: expected requires_grad False, got True"),
    MismatchKind.VALUE: Case(lambda: lambda a, s: a * s, lambda: (torch.ones(3), 0.5),
                             lambda g: g(torch.ones(3), 0.25), "args[1]: expected value 0.5, got 0.25"),
    MismatchKind.BATCH_SIZE: Case(lambda: lambda td: td["a"] * 2, lambda: (_td(a=torch.ones(2)),),
                                  lambda g: g(TensorDict(a=torch.ones(2), batch_size=[])),
                                  "args[0]: expected batch_size (2,), got ()"),
    MismatchKind.ALIAS: Case(lambda: _add_, lambda: (torch.ones(3), torch.ones(3)),
                             lambda g: g(*[torch.ones(3)] * 2),
                             "args[1]: expected its own memory (as at capture), got the memory of args[0]"),
    MismatchKind.STRIDE: Case(lambda: lambda a: a[0], lambda: (_square(),), lambda g: g(_square().t()),
                              "args[0]: expected stride (3, 1) exactly (the function returns a view of it), "
                              "got (1, 3)"),
    MismatchKind.OVERLAP: Case(lambda: _add_, lambda: (torch.ones(3), torch.ones(3)),
                               lambda g: g(torch.ones(1).expand(3), torch.ones(3)),
                               "args[0]: expected a tensor whose elements each have their own memory (the function "
                               "writes into it), got an expanded tensor (stride (0,))"),
    MismatchKind.INFERENCE: Case(lambda: _add_, lambda: (torch.ones(3), torch.ones(3)),
                                 lambda g: g(_inference(), torch.ones(3)),
                                 "args[0]: expected a normal tensor (the function writes into it), got an inference "
                                 "tensor (made under torch.inference_mode())"),
    MismatchKind.UNREAD: Case(_sequential, lambda: (_td(a=torch.ones(2, 1)),),
                              lambda g: g(_td(a=torch.ones(2, 1), nested=_td(c=torch.zeros(2, 1))),
                                          tensordict_out=TensorDict(batch_size=[2])),
                              "the nested TensorDicts of TensorDict argument 0: expected [] (as at capture: the "
                              "function writes nested TensorDicts), got [('nested',)]",
                              kwargs=lambda: {"tensordict_out": TensorDict(batch_size=[2])}),
    MismatchKind.MODE: Case(lambda: nn.Sequential(nn.Dropout(0.5)), _ONES,
                            lambda g: g.module.eval() and g(torch.ones(3)),
                            "module.0.training: expected mode train mode, got eval mode"),
    MismatchKind.GRAD_MODE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3)),
                                 "torch.is_grad_enabled(): expected grad_mode enabled, got disabled (torch.no_grad())",
                                 torch.no_grad),
    MismatchKind.INTERACTION_TYPE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3)),
                                        "interaction_type(): expected interaction_type None, got random",
                                        lambda: set_interaction_type(InteractionType.RANDOM)),
    MismatchKind.AUTOCAST: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3)),
                                "torch.autocast: expected autocast off, got torch.autocast('cpu', dtype=torch.bfloat16, "
                                "cache_enabled=False)",
                                lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)),
    MismatchKind.DEFAULT_DTYPE: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3, dtype=torch.float32)),
                                     "torch.get_default_dtype(): expected default_dtype torch.float32, got "
                                     "torch.float64", lambda: default_dtype(torch.float64)),
    MismatchKind.DETERMINISTIC: Case(lambda: lambda a: a * 2, _ONES, lambda g: g(torch.ones(3)),
                                     "torch.are_deterministic_algorithms_enabled(): expected deterministic False, "
                                     "got True", lambda: deterministic(True)),
    MismatchKind.HOOK: Case(_layer, lambda: (torch.ones(2, 3, requires_grad=True),), _hooked,
                            "module.0: expected hook none, got 1 module backward hook", backward=True),
}


def _inference():
    with torch.inference_mode():
        return torch.ones(3)


def test_every_kind_has_a_case_and_advice():
    assert set(CASES) == set(MismatchKind)
    for kind in MismatchKind:
        assert kind == kind.value and str(kind) == kind.value and MismatchKind(kind.value) is kind
        assert kind.advice.endswith(".") and kind.advice not in ("", kind.value), kind


def test_shape_advice_names_max_graphs():
    for kind in (MismatchKind.SHAPE, MismatchKind.BATCH_SIZE):
        assert "pass max_graphs=N to keep a graph per" in kind.advice and "pad" in kind.advice


def test_a_mismatch_made_from_a_name_has_its_kind():
    m = Mismatch("args[0]", "shape", "(3,)", "(4,)")
    assert m.kind is MismatchKind.SHAPE and m == Mismatch("args[0]", MismatchKind.SHAPE, "(3,)", "(4,)")
    with pytest.raises(ValueError):
        Mismatch("args[0]", "size", "(3,)", "(4,)")


@pytest.mark.parametrize("backend", ["simulate", "eager"])
@pytest.mark.parametrize("kind", list(MismatchKind), ids=str)
def test_every_kind_says_expected_got_where_and_what_to_do(kind, backend):
    # each kind, refused through the wrapper (graph path, and the eager path without CUDA):
    # its line in the house form, and its own advice after "To fix:"
    case = CASES[kind]
    g = CudaGraphModule(case.fn(), warmup=1, max_graphs=1, backend=backend)
    for _ in range(2):  # warmup, capture
        out = g(*case.calls(), **case.kwargs())
        if case.backward:
            out.sum().backward()
    with case.under(), pytest.raises(InputMismatchError) as info:
        case.refused(g)
    err = info.value
    assert kind in [m.kind for m in err.mismatches]
    line = case.line
    if backend == "eager":  # (no graph: the inputs compared with are those of the first call after warmup)
        line = line.replace("(as at capture)", "(as then)").replace("the captured inputs", "those inputs")
    lines = str(err).splitlines()
    when = "first called after warmup (eagerly: no CUDA graph)" if backend == "eager" else "captured"
    assert lines[0].startswith(f"{g._owner} was {when} with other inputs than this call's (")
    assert f"  {line}" in lines
    assert f"To fix: {kind.advice}" in lines
    assert line in [m.describe(backend != "eager") for m in err.mismatches if m.kind is kind]
