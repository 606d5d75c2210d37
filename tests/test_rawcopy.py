"""The input copy through the CUDA driver: taken only where it writes what ``copy_`` writes.

Each CUDA test calls the wrapper and the plain function on the same inputs and compares
results; the spy counts the driver copies that happened, so a test also fails where the
driver copy is never taken (the speed) or taken where it must not be (the values).
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule
from graphmodule import _inputs
from graphmodule._rawcopy import copier

fn = lambda x: x * 2 + 1  # noqa: E731


def test_no_driver_copy_for_a_cpu_buffer():
    assert copier(torch.zeros(4)) is None


def test_the_simulated_graph_copies_with_torch():
    g = CudaGraphModule(fn, warmup=1, backend="simulate")
    for _ in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(g(x), fn(x))
    assert g._entries[0].inputs._raw is None


# -- on the GPU ------------------------------------------------------------------------------


@pytest.fixture
def seen(monkeypatch):
    """The driver copies every wrapper built from here on makes (True) or refuses (False),
    twins' included."""
    seen: list[bool] = []
    real = _inputs.copier

    def spying(buffer):
        copy = real(buffer)
        if copy is None:
            return None

        def spy(source):
            done = copy(source)
            seen.append(done)
            return done

        return spy

    monkeypatch.setattr(_inputs, "copier", spying)
    return seen


def _captured(cuda, shape=(4, 4), **options):
    """Warmed up, captured, and its twin captured (a call made while the caller holds the
    last result), so that every later call replays and copies."""
    g = CudaGraphModule(fn, warmup=1, **options)
    for _ in range(3):
        out = g(torch.randn(shape, device=cuda))  # noqa: F841 (held across the next call)
    return g


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_a_contiguous_input_is_copied_by_the_driver(cuda, dtype, seen):
    g = CudaGraphModule(lambda x: x + x, warmup=1)
    make = lambda: (torch.randn(3, 5, device=cuda) * 10).to(dtype)  # noqa: E731
    for _ in range(3):  # warmup, capture, the twin's capture (``got`` is held below too)
        got = g(make())
    seen.clear()
    for _ in range(5):
        x = make()
        got = g(x)
        assert torch.equal(got, x + x) and got.dtype == dtype
    assert seen == [True] * 5


@pytest.mark.cuda
def test_a_non_contiguous_input_is_copied_by_torch(cuda, seen):
    g = _captured(cuda)
    seen.clear()
    x = torch.randn(4, 4, device=cuda).t()
    torch.testing.assert_close(g(x), fn(x))
    y = torch.randn(4, 8, device=cuda)[:, ::2]
    torch.testing.assert_close(g(y), fn(y))
    assert seen == [False, False]


@pytest.mark.cuda
def test_a_negative_view_is_resolved_as_copy_does(cuda, seen):
    # z.conj().imag is a float tensor with the negative bit: its bytes are not its values
    g = _captured(cuda, shape=(1,))
    seen.clear()
    x = torch.randn(1, dtype=torch.complex64, device=cuda).conj().imag
    assert x.is_neg() and x.is_contiguous()
    torch.testing.assert_close(g(x), fn(x))
    assert seen == [False]


@pytest.mark.cuda
def test_a_parameter_or_subclass_is_copied_by_torch(cuda, seen):
    g = _captured(cuda)
    seen.clear()
    p = nn.Parameter(torch.randn(4, 4, device=cuda), requires_grad=False)
    torch.testing.assert_close(g(p), fn(p))
    assert seen == [False]


@pytest.mark.cuda
def test_the_copy_is_ordered_on_the_callers_stream(cuda, seen):
    # the input is made on a side stream by slow work just before the call: a copy on any
    # other stream would read it before it is written
    g = _captured(cuda, shape=(1024,))
    seen.clear()
    side = torch.cuda.Stream()
    big = torch.randn(2048, 2048, device=cuda)
    for _ in range(3):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = big
            for _ in range(20):
                y = y @ big / 64
            x = y[0, :1024].contiguous()
            got = g(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.testing.assert_close(got, fn(x))
    assert seen == [True] * 3


@pytest.mark.cuda
def test_a_call_from_a_new_thread(cuda):
    g = _captured(cuda)
    out = {}

    def call():
        x = torch.randn(4, 4, device=cuda)
        out["got"], out["want"] = g(x).clone(), fn(x)

    t = threading.Thread(target=call)
    t.start()
    t.join()
    torch.testing.assert_close(out["got"], out["want"])


@pytest.mark.cuda
def test_a_result_fed_back_as_the_next_input(cuda, seen):
    # a recurrent state: the lent result of one call is the next call's input
    step = lambda h: torch.tanh(h * 1.5 + 0.1)  # noqa: E731
    g = CudaGraphModule(step, warmup=1)
    h = h_eager = torch.randn(8, device=cuda)
    for _ in range(3):  # warmup, capture, the twin's capture (``h`` is held by the call)
        h, h_eager = g(h), step(h_eager)
    seen.clear()
    for _ in range(6):
        h, h_eager = g(h), step(h_eager)
        torch.testing.assert_close(h, h_eager)
    assert seen == [True] * 6


@pytest.mark.cuda
def test_an_inference_tensor_input(cuda, seen):
    g = _captured(cuda)
    seen.clear()
    with torch.inference_mode():
        x = torch.randn(4, 4, device=cuda)
    torch.testing.assert_close(g(x), fn(x))
    assert seen == [True]


@pytest.mark.cuda
@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.randn(4, 4, device=d).t(),
        lambda d: torch.randn(4, dtype=torch.complex64, device=d),
        lambda d: torch.zeros(0, device=d),
        lambda d: nn.Parameter(torch.randn(4, device=d)),
    ],
    ids=["non-contiguous", "complex", "empty", "parameter"],
)
def test_buffers_the_driver_does_not_copy_into(cuda, make):
    assert copier(make(cuda)) is None


@pytest.mark.cuda
def test_a_source_overlapping_the_buffer_is_refused(cuda):
    buffer = torch.zeros(8, device=cuda)
    copy = copier(buffer)
    storage = torch.arange(16.0, device=cuda)
    assert copy(storage[:8]) and torch.equal(buffer, storage[:8])
    view = torch.empty(0, device=cuda).set_(buffer.untyped_storage(), 0, (8,), (1,))
    assert not copy(view)  # the same memory: copy_'s business


@pytest.mark.cuda
def test_turned_off_by_the_environment(cuda, monkeypatch):
    monkeypatch.setenv("GRAPHMODULE_TORCH_COPY", "1")
    assert copier(torch.zeros(4, device=cuda)) is None
    g = _captured(cuda)
    assert g._entries[0].inputs._raw is None
    x = torch.randn(4, 4, device=cuda)
    torch.testing.assert_close(g(x), fn(x))


@pytest.mark.cuda
def test_a_layer_copies_with_torch(cuda):
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(3, 3), nn.Sigmoid()).to(cuda)
    g = CudaGraphModule(block, warmup=1)
    for _ in range(3):
        x = torch.randn(5, 3, device=cuda, requires_grad=True)
        g(x).sum().backward()
    entry = g._entries[0]
    assert entry.layer is not None and entry.inputs._raw is None
