"""State a replay would silently get wrong, beside the plain function (issue #31): a
TensorDict's lock, dicts and lists held as attributes, an optimizer's structure.

Each is served as eagerly, or refused with our error before any replay.
"""

import copy

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError, StaleGraphError, UnsupportedError


def _td(device, locked):
    td = TensorDict(a=torch.ones(2, device=device), batch_size=[2])
    return td.lock_() if locked else td


# -- S5: a TensorDict's lock ----------------------------------------------------------------
def test_a_function_branching_on_the_lock_sees_the_callers(graph_backend, ones):
    def fn(td):
        return td["a"] * (2.0 if td.is_locked else 3.0)

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for locked in (True, True, True, False, False, True, False):
        mine, theirs = _td(ones.device, locked), _td(ones.device, locked)
        torch.testing.assert_close(g(mine), fn(theirs))
        assert mine.is_locked == theirs.is_locked == locked


def test_a_write_into_a_locked_tensordict_raises_as_eagerly(graph_backend, ones):
    def fn(td):
        td["b"] = td["a"] * 2
        return td["a"] + 1

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for _ in range(3):
        mine, theirs = _td(ones.device, False), _td(ones.device, False)
        torch.testing.assert_close(g(mine), fn(theirs))
        assert list(mine.keys()) == list(theirs.keys()) == ["a", "b"]
    with pytest.raises(RuntimeError) as eager:
        fn(_td(ones.device, True))
    with pytest.raises(RuntimeError) as wrapped:
        g(_td(ones.device, True))
    assert str(wrapped.value) == str(eager.value)


def test_one_graph_refuses_the_other_lock_naming_it(graph_backend, ones):
    g = CudaGraphModule(lambda td: td["a"] * 2, warmup=1, backend=graph_backend, max_graphs=1)
    for _ in range(2):
        g(_td(ones.device, True))
    with pytest.raises(InputMismatchError, match=r"args\[0\]: expected value a locked TensorDict, got an unlocked one"):
        g(_td(ones.device, False))


# -- S6, C4: dicts and lists held as attributes ---------------------------------------------
class _Logged(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.metrics = {}

    def forward(self, x):
        y = self.lin(x).sum()
        self.metrics["loss"] = y.detach()
        return y


class _Holder:
    def __init__(self):
        self.metrics = {}


@pytest.mark.parametrize("where", ["module", "object"])
def test_an_entry_written_into_a_dict_attribute_holds_this_calls_tensor(where, graph_backend, ones):
    if where == "module":
        plain = _Logged().to(ones.device)
        mine = copy.deepcopy(plain)
        store, theirs = mine.metrics, plain.metrics
        g = CudaGraphModule(mine, warmup=1, backend=graph_backend)
    else:
        lin = nn.Linear(2, 2).to(ones.device)
        holder, other = _Holder(), _Holder()

        def make(h):
            def fn(x):
                y = lin(x).sum()
                h.metrics["loss"] = y.detach()
                return y
            return fn

        g, plain = CudaGraphModule(make(holder), warmup=1, backend=graph_backend), make(other)
        store, theirs = holder.metrics, other.metrics
    kept = []
    for k in range(5):
        x = torch.full((2,), float(k), device=ones.device)
        torch.testing.assert_close(g(x), plain(x))
        torch.testing.assert_close(store["loss"], theirs["loss"])
        kept.append((store["loss"], theirs["loss"]))
    for a, b in kept:  # each call's tensor, not one overwritten
        torch.testing.assert_close(a, b)


class _History(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.history = []

    def forward(self, x):
        y = self.lin(x).sum()
        self.history.append(y.detach())
        return y


def test_appending_to_a_list_attribute_is_refused_naming_it(graph_backend, ones):
    m = _History().to(ones.device)
    g = CudaGraphModule(m, warmup=1, backend=graph_backend)
    x = torch.ones(2, device=ones.device)
    g(x)
    with pytest.raises(UnsupportedError, match=r"module\.history \(list\) was modified in place"):
        g(x)


def test_appending_to_a_plain_objects_list_is_refused_naming_it(graph_backend, ones):
    class Log:
        def __init__(self):
            self.history = []

    log = Log()

    def fn(x):
        y = x * 2
        log.history.append(y)
        return y

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    g(ones)
    with pytest.raises(UnsupportedError, match=r"closure variable 'log' of .*\.history \(list\) was modified in place"):
        g(ones)


# -- C2: an optimizer's structure -----------------------------------------------------------
def _train(device, on_stale):
    torch.manual_seed(0)
    lin, extra = nn.Linear(2, 1).to(device), nn.Parameter(torch.ones(1, device=device))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        opt.zero_grad()
        loss = lin(x).sum() + (extra * x[:1]).sum()
        loss.backward()
        opt.step()
        return loss.detach()

    return lin, extra, opt, step


_CHANGES = {
    "add_param_group": lambda lin, extra, opt: opt.add_param_group({"params": [extra]}),
    "state.clear": lambda lin, extra, opt: opt.state.clear(),
    "freeze": lambda lin, extra, opt: lin.weight.requires_grad_(False),
}


@pytest.mark.parametrize("change", list(_CHANGES))
def test_an_optimizer_changed_in_structure_makes_the_graph_stale(change, graph_backend, ones):
    lin, extra, opt, step = _train(ones.device, "raise")
    g = CudaGraphModule(step, warmup=1, backend=graph_backend)
    x = torch.ones(2, device=ones.device)
    for _ in range(3):
        g(x)
    _CHANGES[change](lin, extra, opt)
    with pytest.raises(StaleGraphError, match=r"closure variable 'opt' of .* \(SGD\)'s structure: "):
        g(x)


@pytest.mark.parametrize("change", list(_CHANGES))
def test_an_optimizer_changed_in_structure_is_captured_again(change, graph_backend, ones):
    runs = []
    for wrapped in (True, False):
        lin, extra, opt, step = _train(ones.device, "recapture")
        call = CudaGraphModule(step, warmup=1, backend=graph_backend, on_stale="recapture") if wrapped else step
        x = torch.ones(2, device=ones.device)
        for _ in range(3):
            call(x)
        _CHANGES[change](lin, extra, opt)
        losses = [call(x) for _ in range(4)]
        runs.append((losses, lin.weight.detach().clone(), lin.bias.detach().clone(), extra.detach().clone()))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b)


# -- containers one level deeper: refused, naming them ---------------------------------------
_STATE = {"metrics": {}, "log": []}


def _writes_metrics(x):
    y = x * 2
    _STATE["metrics"]["loss"] = y
    return y


def _appends_log(x):
    y = x * 2
    _STATE["log"].append(y)
    return y


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.logs = {"train": []}

    def forward(self, x):
        self.logs["train"].append(x.sum())
        return x * 2


@pytest.mark.parametrize("fn, where", [
    (_writes_metrics, r"global '_STATE' of _writes_metrics, entry \['metrics'\] \(dict\)"),
    (_appends_log, r"global '_STATE' of _appends_log, entry \['log'\] \(list\)"),
    (_Nested(), r"module\.logs\['train'\] \(list\)"),
])
def test_a_container_inside_one_changed_in_place_is_refused_naming_it(fn, where, graph_backend, ones):
    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    g(ones)
    with pytest.raises(UnsupportedError, match=where + " was modified in place"):
        g(ones)


def test_a_python_value_written_into_a_dict_attribute_is_refused_naming_it(graph_backend, ones):
    holder = _Holder()

    def counted(x):
        holder.metrics["calls"] = holder.metrics.get("calls", 0) + 1
        return x * 2

    g = CudaGraphModule(counted, warmup=1, backend=graph_backend)
    g(ones)
    with pytest.raises(UnsupportedError, match=r"closure variable 'holder' of .*counted\.metrics\['calls'\] was rebound \(1 → 2\)"):
        g(ones)
