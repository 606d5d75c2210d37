"""TensorDict modules and TensorDict inputs on a real GPU."""

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn

from graphmodule import CudaGraphModule, InputMismatchError

pytestmark = pytest.mark.cuda


def _policy(cuda):
    return TensorDictSequential(
        TensorDictModule(nn.Linear(6, 8), in_keys=[("agent", "obs")], out_keys=["hidden"]),
        TensorDictModule(nn.Tanh(), in_keys=["hidden"], out_keys=[("agent", "action")]),
    ).to(cuda)


def test_tensordict_call_writes_out_keys_into_the_callers_tensordict(cuda):
    policy = _policy(cuda)
    g = CudaGraphModule(policy)
    assert g.in_keys == policy.in_keys and g.out_keys == policy.out_keys
    with torch.no_grad():
        for _ in range(5):
            td = TensorDict({"agent": {"obs": torch.randn(4, 6, device=cuda)}, "reward": torch.zeros(4, 1, device=cuda)}, [4])
            out = g(td)
            assert out is td
            want = policy(td.exclude("hidden", ("agent", "action")).clone())
            torch.testing.assert_close(td["agent", "action"], want["agent", "action"])
            torch.testing.assert_close(td["hidden"], want["hidden"])


def test_keyword_call_returns_the_outputs(cuda):
    module = TensorDictModule(lambda obs, h: (obs * 2 + h, h + 1), in_keys=["obs", "h"], out_keys=["act", "h"])
    g = CudaGraphModule(module, warmup=1)
    for _ in range(4):
        obs, h = torch.randn(3, device=cuda), torch.randn(3, device=cuda)
        act, h_next = g(obs=obs, h=h)
        torch.testing.assert_close(act, obs * 2 + h)
        torch.testing.assert_close(h_next, h + 1)


def test_recurrent_module_sees_its_new_input_each_call(cuda):
    # tensordict PR#1788: a module that rewrites its own input key
    module = TensorDictModule(lambda h: h * 0.5 + 1, in_keys=["h"], out_keys=["h"])
    g = CudaGraphModule(module, warmup=1)
    td = TensorDict(h=torch.zeros(2, device=cuda))
    ref = td.clone()
    for _ in range(6):
        g(td)
        module(ref)
        torch.testing.assert_close(td["h"], ref["h"])


def test_tensordict_out(cuda):
    module = TensorDictModule(lambda x: x + 1, in_keys=["x"], out_keys=["y"])
    g = CudaGraphModule(module, warmup=1)
    for _ in range(4):
        td = TensorDict(x=torch.randn(2, device=cuda))
        out = TensorDict()
        result = g(td, tensordict_out=out)
        assert result is out and "y" not in td.keys()
        torch.testing.assert_close(out["y"], td["x"] + 1)


def test_in_keys_empty_function_returning_its_input(cuda):
    def fn(td):
        td["y"] = td["x"].exp()
        return td

    g = CudaGraphModule(fn, in_keys=[], out_keys=[])
    for _ in range(5):
        td = TensorDict(x=torch.randn(3, device=cuda))
        assert g(td) is td
        torch.testing.assert_close(td["y"], td["x"].exp())


def test_in_keys_empty_function_returning_a_new_tensordict(cuda):
    g = CudaGraphModule(lambda td: TensorDict(z=td["x"] * 3), in_keys=[], warmup=1)
    results = []
    for i in range(4):
        td = TensorDict(x=torch.full((2,), float(i), device=cuda))
        results.append(g(td))
    for i, out in enumerate(results):
        torch.testing.assert_close(out["z"], torch.full((2,), 3.0 * i, device=cuda))


def test_tensordict_argument_of_a_plain_function(cuda):
    g = CudaGraphModule(lambda td, k: td["a"] * k + td["b", "c"], warmup=1)
    def make():
        return TensorDict({"a": torch.randn(2, device=cuda), "b": {"c": torch.randn(2, device=cuda)}}, [2])
    for _ in range(4):
        td = make()
        torch.testing.assert_close(g(td, 2), td["a"] * 2 + td["b", "c"])
    with pytest.raises(InputMismatchError, match=r"args\[0\]\['extra'\]: not in the captured inputs"):
        g(make().set("extra", torch.zeros(2, device=cuda)), 2)


def test_missing_in_key_and_batch_size_are_reported(cuda):
    module = TensorDictModule(nn.Linear(3, 2), in_keys=["obs"], out_keys=["act"]).to(cuda)
    g = CudaGraphModule(module, warmup=1)
    with torch.no_grad():
        for _ in range(3):
            g(TensorDict(obs=torch.randn(4, 3, device=cuda), batch_size=[4]))
        with pytest.raises(InputMismatchError) as info:
            g(TensorDict(obs=torch.randn(5, 3, device=cuda), batch_size=[5]))
    kinds = sorted(m.kind for m in info.value.mismatches)
    assert kinds == ["batch_size", "shape"]
