"""Error messages: expected, got, where, what to do; structured fields; picklable."""

import pickle

import pytest
import torch

from graphmodule import CaptureError, CudaGraphModule, InputMismatchError, Mismatch, RequiresGradError


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
