"""Static inputs: aliased as the caller's were, and only where memory really overlaps.

Regressions found by the long differential runs; each runs simulated on CPU and on a GPU.
"""

import pytest
import torch
from tensordict import tensorclass

from graphmodule import CudaGraphModule, InputMismatchError


def test_slices_of_one_batch_then_separate_tensors(graph_backend):
    # captured with two disjoint slices of one tensor (slices of a batch): they do not
    # alias, so later calls with separate tensors replay as usual
    g = CudaGraphModule(lambda a, *, k: a * 2 + k, warmup=1, backend=graph_backend)
    for _ in range(2):
        t = torch.arange(3.0)
        g(t[1:], k=t[0])
    for i in range(3):
        a, k = torch.full((2,), float(i)), torch.tensor(10.0)
        torch.testing.assert_close(g(a, k=k), a * 2 + k)


def test_overlapping_views_written_then_separate_tensors_are_refused(graph_backend):
    def f(a, b):
        a.add_(1)
        return b * 2

    g = CudaGraphModule(f, warmup=1, backend=graph_backend)
    for _ in range(2):
        t = torch.zeros(3)
        g(t[:2], t[1:])
    with pytest.raises(InputMismatchError) as info:
        g(torch.zeros(2), torch.zeros(2))
    assert info.value.mismatches[0].describe() == (
        "args[1]: expected the memory of args[0] (as at capture), got its own memory"
    )


@tensorclass
class Pair:
    obs: torch.Tensor
    reward: torch.Tensor


def test_one_object_where_two_views_of_the_same_memory_were_captured(graph_backend):
    # F rebinds obs to reward: eagerly the caller's obs becomes its reward object
    def f(p):
        p.obs = p.reward
        return p.reward * 2

    g = CudaGraphModule(f, warmup=1, backend=graph_backend)
    for _ in range(3):
        t = torch.arange(2.0)
        p = Pair(obs=t[1:], reward=t[1:], batch_size=[1])
        g(p)
        assert p.obs is p.reward
    same = torch.arange(2.0)[1:]
    p = Pair(obs=same, reward=same, batch_size=[1])
    try:
        out = g(p)
    except InputMismatchError as err:  # refused: the function would see one object, not two
        assert err.mismatches[0].kind == "alias"
    else:
        torch.testing.assert_close(out, same * 2)
        assert p.obs is p.reward


def test_inputs_of_several_dtypes_are_copied_one_list_per_dtype(graph_backend):
    # a replay-buffer sample: float observations, bool dones, int64 indices. torch's fused
    # foreach copy needs one dtype per list, so the buffers are copied in one list per dtype
    from tensordict import TensorDict

    def update(data):
        return (data["obs"].sum(-1) * (~data["done"]).float() + data["index"].float()).sum()

    g = CudaGraphModule(update, warmup=1, backend=graph_backend)

    def sample(k):
        return TensorDict(obs=torch.full((4, 3), float(k)), next_obs=torch.full((4, 3), k + 0.5),
                          done=torch.tensor([k % 2 == 0, False, True, False]),
                          index=torch.arange(4) + k, batch_size=[4])

    for k in range(2):
        g(sample(k))
    copies = []  # the copies of one call, in order: ("foreach" or "one", dtypes)
    foreach_copy_, copy_ = torch._foreach_copy_, torch.Tensor.copy_
    inside = [False]  # (a torch function override may call the patched copy again)

    def counted(kind, real):
        def copy(dests, srcs, *args, **kwargs):
            if not inside[0]:
                copies.append((kind, sorted(str(d.dtype) for d in ([dests] if kind == "one" else dests))))
            inside[0], was = True, inside[0]
            try:
                return real(dests, srcs, *args, **kwargs)
            finally:
                inside[0] = was

        return copy

    data = sample(2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "_foreach_copy_", counted("foreach", foreach_copy_))
        patch.setattr(torch.Tensor, "copy_", counted("one", copy_))
        out = g(data)
    torch.testing.assert_close(out, update(data))
    # the inputs first: the two float buffers in one foreach list, the bool and int64 ones alone
    assert sorted(copies[:3]) == [("foreach", ["torch.float32", "torch.float32"]), ("one", ["torch.bool"]),
                                  ("one", ["torch.int64"])]
    for k in range(2, 6):
        data = sample(k)
        torch.testing.assert_close(g(data), update(data))
