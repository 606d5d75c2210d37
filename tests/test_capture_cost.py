"""What a capture costs on the host besides CUDA's own work: the walks from the function it
takes (``_discover``), and the bytecode they read. A walk of a train step with two optimizers
costs milliseconds; a capture takes only those it needs (benchmarks/capture.py times them)."""

import pytest
import torch
from torch import nn

from graphmodule._discover import Discovery, _global_names


@pytest.fixture
def walks(monkeypatch):
    """The walks from the function taken so far (``Discovery``, ``Watch`` included)."""
    taken = []
    init = Discovery.__init__

    def counted(self, fn, *args, **kwargs):
        taken.append(fn)
        init(self, fn, *args, **kwargs)

    monkeypatch.setattr(Discovery, "__init__", counted)
    return taken


def _step():
    net = nn.Linear(3, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x):
        loss = net(x).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def test_a_policy_capture_walks_the_function_twice(make, walks):
    # the wrapper's walk (its modes) serves as the capture's, grad off; then the graph's Watch
    g = make(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), warmup=2)
    x = torch.ones(2, 3)
    with torch.no_grad():
        g(x), g(x)
        walks.clear()
        g(x)
    assert g.stats.captures == 1
    assert len(walks) == 2


def test_a_train_step_capture_walks_the_function_three_times(make, walks):
    # the wrapper's walk; the capture's, with the backward hooks its backward runs (which also
    # finds the weights of weight_norm-like hooks to detach); then the graph's Watch
    g = make(_step(), warmup=2)
    x = torch.ones(2, 3)
    g(x), g(x)
    walks.clear()
    g(x)
    assert g.stats.captures == 1
    assert len(walks) == 3


def test_another_output_set_walks_the_function_twice(make, walks):
    # a train step captured again to lend its result while the first call's is held: its
    # capture's walk (which finds the weights to detach too), then its Watch
    g = make(_step(), warmup=1)
    x = torch.ones(2, 3)
    g(x)
    held = g(x)
    walks.clear()
    also = g(x)
    assert g.stats.twin_captures == 1 and also is not held
    assert len(walks) == 2


def test_each_code_object_is_read_once(make):
    # (the cache is per code object: another wrapper of the same function reads none)
    _global_names.cache_clear()
    scale = [2.0]

    def fn(x):
        return (lambda y: y * scale[0])(x) + 1

    for _ in range(2):
        g = make(fn, warmup=2)
        for _ in range(4):
            g(torch.ones(3))
    assert g.stats.captures == 1
    info = _global_names.cache_info()
    assert info.misses == 2 and info.hits > 0  # fn's code and its lambda's
