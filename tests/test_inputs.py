"""Static inputs: aliased as the caller's were, and only where memory really overlaps.

Regressions found by the long differential runs; each runs simulated on CPU and on a GPU.
"""

import pytest
import torch
from tensordict import tensorclass

from graphmodule import CudaGraphModule, InputMismatchError, UnsupportedError


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


# -- layouts: any one copies into a buffer of its own; views of one tensor keep theirs ----------
def _scale_(x):
    x.mul_(2).add_(1)
    return x.sum()


@pytest.mark.parametrize("captured", ["contiguous", "transposed"])
@pytest.mark.parametrize("called", ["transposed", "sliced", "offset", "contiguous"])
def test_in_place_effects_reach_a_caller_tensor_of_another_layout(graph_backend, captured, called):
    def make(kind, i):
        if kind == "transposed":
            return (torch.arange(12.0).reshape(4, 3) + i).t()
        if kind == "sliced":
            return (torch.arange(24.0).reshape(3, 8) + i)[:, 1::2]
        if kind == "offset":
            return (torch.arange(16.0) + i)[3:15].view(3, 4)
        return torch.arange(12.0).reshape(3, 4) + i

    g = CudaGraphModule(_scale_, warmup=1, backend=graph_backend)
    for i in range(2):
        g(make(captured, i))
    for i in (2, 3):
        ours, theirs = make(called, i), make(called, i)
        base, stride = ours._base, ours.stride()
        torch.testing.assert_close(g(ours), _scale_(theirs))
        torch.testing.assert_close(ours, theirs)  # written through the caller's strides
        if base is not None:  # the rest of the caller's storage untouched, as eagerly
            torch.testing.assert_close(base, theirs._base)
        assert ours.stride() == stride


def test_an_expanded_input_the_function_writes_is_refused_as_eagerly(graph_backend):
    # eagerly the in-place write into a tensor whose elements share memory raises; a replay
    # would write its dense buffer, then fail to copy it back (after the replay)
    g = CudaGraphModule(_scale_, warmup=1, backend=graph_backend)
    for _ in range(2):
        g(torch.ones(3, 4))
    x = torch.arange(4.0).expand(3, 4)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        _scale_(torch.arange(4.0).expand(3, 4))  # eagerly
    replays = g.stats.replays
    with pytest.raises(InputMismatchError) as info:
        g(x)
    assert str(info.value) == (
        "CudaGraphModule(_scale_) was captured with other inputs than this call's (1 mismatch):\n"
        "  args[0]: expected a tensor whose elements each have their own memory (the function writes into "
        "it), got an expanded tensor (stride (0, 1))\n"
        "To fix: eagerly, torch refuses to write in place into a tensor whose elements share memory "
        "(x.expand(...)), and so does the graph: pass a tensor of its own (x.clone())."
    )
    torch.testing.assert_close(x, torch.arange(4.0).expand(3, 4))
    assert g.stats.replays == replays
    y = torch.ones(3, 4)
    torch.testing.assert_close(g(y), torch.full((3, 4), 3.0).sum())  # then served as before


def test_a_capture_from_an_expanded_input_serves_dense_calls(graph_backend):
    # the buffer of an expanded input is dense: a later input of other values copies in whole
    g = CudaGraphModule(lambda x: x.cumsum(0) * 2, warmup=1, backend=graph_backend)
    for _ in range(2):
        g(torch.arange(4.0).expand(3, 4))
    for x in (torch.randn(3, 4), torch.randn(4, 3).t()):
        torch.testing.assert_close(g(x), x.cumsum(0) * 2)


def test_a_capture_from_an_expanded_input_the_function_writes_raises_as_eagerly(graph_backend):
    g = CudaGraphModule(_scale_, warmup=1, backend=graph_backend)
    g(torch.ones(3, 4))  # warmup
    x = torch.arange(4.0).expand(3, 4)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        g(x)  # the capture: eager's error, the caller's tensor unchanged
    torch.testing.assert_close(x, torch.arange(4.0).expand(3, 4))
    for i in range(2):  # then dense calls are served
        ours = torch.randn(3, 4)
        theirs = ours.clone()
        torch.testing.assert_close(g(ours), _scale_(theirs))
        torch.testing.assert_close(ours, theirs)


def test_views_of_one_tensor_need_the_captured_strides(graph_backend):
    # the two are copied as one block of bytes laid out as b's: c[:, ::2] with the same
    # aliasing was served with c's first bytes read as b (wrong values, no error)
    g = CudaGraphModule(lambda a, b: a * 10 + b, warmup=1, backend=graph_backend)
    for _ in range(2):
        b = torch.arange(12.0).reshape(3, 4)
        g(b, b[0, 0])
    c = torch.arange(24.0).reshape(3, 8)
    with pytest.raises(InputMismatchError) as info:
        g(c[:, ::2], c[0, 0])
    assert [m.describe() for m in info.value.mismatches] == [
        "args[0]: expected stride (4, 1) exactly (it shares memory with other inputs, copied with them as at "
        "capture), got (8, 2)"]
    d = torch.arange(12.0).reshape(4, 3)
    with pytest.raises(InputMismatchError, match=r"expected stride \(4, 1\) exactly"):
        g(d.t(), d[0, 0])
    e = torch.randn(3, 4)  # laid out as at capture: served
    torch.testing.assert_close(g(e, e[0, 0]), e * 10 + e[0, 0])


def test_aliasing_stays_part_of_the_signature_whatever_the_layout(graph_backend):
    def add_(a, b):
        a.add_(b)
        return a.sum()

    g = CudaGraphModule(add_, warmup=1, backend=graph_backend)
    for _ in range(2):
        g(torch.ones(3, 4), torch.ones(3, 4))
    x = torch.randn(4, 3).t()
    with pytest.raises(InputMismatchError) as info:  # eagerly x += x: 2x, not x + y
        g(x, x)
    assert [m.kind for m in info.value.mismatches] == ["alias"]
    a, b = torch.randn(4, 3).t(), torch.randn(3, 4)[:, [0, 1, 2, 3]]
    a_eager = a.clone()
    torch.testing.assert_close(g(a, b), add_(a_eager, b))
    torch.testing.assert_close(a, a_eager)


def test_a_tensor_passed_twice_is_served_in_any_layout(graph_backend):
    g = CudaGraphModule(lambda a, b: a @ b.t() + b, warmup=1, backend=graph_backend)
    for _ in range(2):
        x = torch.randn(3, 3)
        g(x, x)
    for x in (torch.randn(3, 3).t(), torch.randn(3).expand(3, 3), torch.randn(3, 6)[:, ::2]):
        torch.testing.assert_close(g(x, x), x @ x.t() + x)
    with pytest.raises(InputMismatchError, match="expected the memory of args"):
        g(torch.randn(3, 3), torch.randn(3, 3))  # captured aliased: g(x, y) is another call


# -- a returned view of an input: rebuilt on the caller's tensor, so its strides must follow ------
def _row_and_double(x):
    return x[1], x * 2


@pytest.mark.parametrize("kind", ["expanded", "sliced"])
def test_a_returned_view_of_an_input_passed_with_gaps_or_overlaps_is_refused_at_capture(graph_backend, kind):
    # the graph's copy of the input is dense: the view rebuilt on the caller's tensor with its
    # strides read other elements (a slice: silently wrong values) or none (an expanded tensor)
    x = torch.arange(4.0).expand(3, 4) if kind == "expanded" else torch.arange(24.0).reshape(3, 8)[:, ::2]
    g = CudaGraphModule(_row_and_double, warmup=1, backend=graph_backend)
    g(x)
    with pytest.raises(UnsupportedError) as info:
        g(x)
    strides = "(0, 1)" if kind == "expanded" else "(8, 2)"
    assert str(info.value) == (
        "CudaGraphModule(_row_and_double) cannot replay this call as a CUDA graph: the function returns a view "
        f"of args[0], passed with strides {strides}; a replay rebuilds that view on your tensor with the strides "
        "of the graph's dense copy of it ((4, 1)), which would read other elements of yours.\n"
        "To fix: pass that input dense (x.contiguous()), or return a copy of the view (.clone())."
    )
    for _ in range(2):  # then a dense call is captured and served
        y = torch.randn(3, 4)
        row, double = g(y)
        assert row._base is y and torch.equal(row, y[1]) and torch.equal(double, y * 2)


@pytest.mark.parametrize("max_graphs", [1, 2])
def test_a_returned_view_of_an_input_keeps_the_captured_strides(graph_backend, max_graphs):
    g = CudaGraphModule(_row_and_double, warmup=1, backend=graph_backend, max_graphs=max_graphs)
    for i in range(3):  # captured transposed (its buffer is transposed): served as eagerly
        x = (torch.arange(12.0).reshape(4, 3) + i).t()
        row, double = g(x)
        assert row._base is x._base and row.stride() == x[1].stride() and torch.equal(row, x[1])
        torch.testing.assert_close(double, x * 2)
    with pytest.raises(InputMismatchError) as info:  # the view must be x[1] of the caller's tensor
        g(torch.randn(3, 4))
    assert [m.describe() for m in info.value.mismatches] == [
        "args[0]: expected stride (1, 3) exactly (the function returns a view of it), got (4, 1)"]
