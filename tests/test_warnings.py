"""Warnings point at the user's line, however deep inside graphmodule or tensordict they start."""

import itertools
import warnings

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn

from graphmodule import CudaGraphModule


def _caught(action):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        action()
    return [w for w in seen if "graphmodule" in str(w.message) or "CudaGraphModule" in str(w.message)]


def test_ignored_keys_warning_points_here():
    module = TensorDictModule(nn.Identity(), in_keys=["x"], out_keys=["y"])
    seen = _caught(lambda: CudaGraphModule(module, in_keys=["z"], backend="simulate"))
    assert seen and all(w.filename == __file__ for w in seen)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA warning")
def test_no_cuda_warning_points_here():
    seen = _caught(lambda: CudaGraphModule(lambda x: x))
    assert len(seen) == 1 and seen[0].filename == __file__


def test_capture_failure_warning_points_at_the_call():
    calls = itertools.count()

    def f(x):
        if next(calls) == 1:  # the capture (warmup=1 makes it the second run)
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return x

    g = CudaGraphModule(f, warmup=1, backend="simulate", on_capture_failure="eager")
    g(torch.ones(1))
    seen = _caught(lambda: g(torch.ones(1)))
    assert seen and seen[0].filename == __file__
