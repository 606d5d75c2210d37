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
    header = "CudaGraphModule(TensorDictModule) was captured with other inputs than this call's"
    batch_advice = (
        "To fix: CUDA graphs replay fixed shapes: pass max_graphs=N to keep a graph per batch size (up to N "
        "batch sizes), or pass a TensorDict of the captured batch size (pad it, or bucket varying batch sizes "
        "into a few padded ones)."
    )
    keys_advice = (
        "To fix: pass the same containers, keys and number of arguments as at capture "
        "(keyword arguments are matched by name)."
    )
    # tensordict's wrapper's phrases, kept for code that matches on them
    batch_compat = (
        "(tensordict.nn.CudaGraphModule's words: CudaGraphModule was captured with "
        "batch_size=torch.Size([4]) but got batch_size=torch.Size([5]). CUDA graphs replay fixed shapes.)"
    )
    missing_compat = (
        "(tensordict.nn.CudaGraphModule's words: CudaGraphModule input is missing the in_keys "
        "['obs'] that the captured graph reads.)"
    )
    with torch.no_grad():
        for _ in range(3):
            g(TensorDict(obs=torch.randn(4, 3, device=cuda), batch_size=[4]))
        assert g.state == "captured"
        with pytest.raises(InputMismatchError) as batch:
            g(TensorDict(obs=torch.randn(5, 3, device=cuda), batch_size=[5]))
        with pytest.raises(InputMismatchError) as missing:
            g(TensorDict(observation=torch.randn(4, 3, device=cuda), batch_size=[4]))
        with pytest.raises(InputMismatchError) as both:
            g(TensorDict(observation=torch.randn(5, 3, device=cuda), batch_size=[5]))
        out = g(TensorDict(obs=torch.randn(4, 3, device=cuda), batch_size=[4]))  # still usable
    assert out["act"].shape == (4, 2)
    assert [m.describe() for m in batch.value.mismatches] == [
        "tensordict: expected batch_size (4,), got (5,)",
        "tensordict['obs']: expected shape (4, 3), got (5, 3)",
    ]
    assert str(batch.value) == "\n".join([
        f"{header} (2 mismatches):",
        "  tensordict: expected batch_size (4,), got (5,)",
        "  tensordict['obs']: expected shape (4, 3), got (5, 3)",
        batch_advice,
        "To fix: CUDA graphs replay fixed shapes: pass max_graphs=N to keep a graph per shape (up to N shapes), "
        "or pad the input to the captured shape (bucket inputs of varying sizes into a few padded shapes).",
        batch_compat,
        "(tensordict.nn.CudaGraphModule's words: CudaGraphModule was captured with the entry 'obs' "
        "of shape torch.Size([4, 3]) but got shape torch.Size([5, 3]). CUDA graphs replay fixed shapes.)",
    ])
    # the missing in-key is named with the tensor the graph was captured with, on its GPU
    expected = f"a tensor of shape (4, 3), torch.float32 on {cuda}"  # e.g. cuda:0
    assert [(m.path, m.kind, m.expected) for m in missing.value.mismatches] == [
        ("tensordict['obs']", "missing", expected),
    ]
    assert str(missing.value) == "\n".join([
        f"{header} (1 mismatch):",
        f"  tensordict['obs']: missing (expected {expected})",
        keys_advice,
        missing_compat,
    ])
    # both at once: every mismatch of the call is listed, each advice once
    assert str(both.value) == "\n".join([
        f"{header} (2 mismatches):",
        "  tensordict: expected batch_size (4,), got (5,)",
        f"  tensordict['obs']: missing (expected {expected})",
        batch_advice,
        keys_advice,
        batch_compat,
        missing_compat,
    ])
    assert g.stats.input_mismatches == 3
