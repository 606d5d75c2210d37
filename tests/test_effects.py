"""Effects on the caller's containers, replayed with eager key order (simulated and CUDA replays).

The differential harness (tests/test_differential.py) covers the classes broadly; these are
regressions it found, kept by name.
"""

import pytest
import torch
from tensordict import TensorDict

from graphmodule import CudaGraphModule, InputMismatchError, UnsupportedError


def _run(fn, make, backend, calls=4):
    g = CudaGraphModule(fn, warmup=1, backend=backend)
    for k in range(calls):
        mine, theirs = make(k), make(k)
        g(*mine)
        fn(*theirs)
        yield mine, theirs


def test_key_set_again_unchanged_then_a_new_key_keeps_eager_order(graph_backend):
    # before [x, b]; pop x, set x back (the same tensor), add a: eagerly [b, x, a]
    def fn(x, td):
        v = td.pop("x")
        td["x"] = v
        td["a"] = x
        return x * 2

    def make(k):
        return torch.full((1,), float(k)), TensorDict(x=torch.ones(1), b=torch.zeros(1), batch_size=[1])

    for (_, mine), (_, theirs) in _run(fn, make, graph_backend):
        assert list(mine.keys()) == list(theirs.keys()) == ["b", "x", "a"]


def test_nested_tensordict_written_then_removed(graph_backend):
    def fn(td):
        td["sub"]["new"] = td["sub"]["a"] * 2
        sub = td.pop("sub")
        return sub["new"] + td["x"]

    def make(k):
        return (TensorDict(sub=TensorDict(a=torch.full((2,), float(k)), batch_size=[2]), x=torch.ones(2),
                           batch_size=[2]),)

    for (mine,), (theirs,) in _run(fn, make, graph_backend):
        assert list(mine.keys()) == list(theirs.keys()) == ["x"]


def test_dict_and_list_effects(graph_backend):
    def fn(d, items):
        d["y"] = d.pop("x") * 2
        items.append(d["y"])
        return items[-1]

    def make(k):
        return {"x": torch.full((2,), float(k)), "z": 1}, []

    for (d, items), (d2, items2) in _run(fn, make, graph_backend):
        assert list(d) == list(d2) == ["z", "y"]
        torch.testing.assert_close(d["y"], d2["y"])
        assert len(items) == 1 and items[0] is d["y"]


def test_sub_tensordict_created_in_an_input_and_returned_is_one_object(graph_backend):
    # found by the long fuzz: the sub-TensorDict stored and the one returned were two copies
    def fn(td):
        td["b", "leaf"] = td["x"]
        return td["x"] * 2, td["b"]

    def make(k):
        return (TensorDict(x=torch.full((1,), float(k)), batch_size=[]),)

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for k in range(4):
        (td,) = make(k)
        _, sub = g(td)
        assert sub is td["b"]
        assert td["b", "leaf"] is td["x"]


def test_entries_written_then_a_larger_batch_size(graph_backend):
    # found by the long fuzz: the entry of the new shape is written before the batch size grows
    def fn(td):
        td["x"].add_(1)
        td["x"] = td["x"].unsqueeze(0)
        td.batch_size = [1, 1, 1]
        return td["x"] * 2

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for k in range(4):
        td = TensorDict({"x": torch.full((1, 1), float(k))}, batch_size=[])
        theirs = td.clone()
        out, want = g(td), fn(theirs)
        torch.testing.assert_close(out, want)
        assert td.batch_size == theirs.batch_size and td["x"].shape == theirs["x"].shape


def test_batch_size_shrunk_then_a_nested_key_created(graph_backend):
    # found by the long fuzz: the new sub-TensorDict took the old batch size
    def fn(x, td):
        td.batch_size = []
        td["b", "leaf"] = x
        return x * 2

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for k in range(4):
        td = TensorDict({"x": torch.zeros(1)}, batch_size=[1])
        theirs = td.clone()
        x = torch.full((1,), float(k))
        g(x, td)
        fn(x, theirs)
        assert td.batch_size == theirs.batch_size and td["b"].batch_size == theirs["b"].batch_size
        assert td["b", "leaf"] is x


def test_module_writes_below_a_nested_tensordict_it_does_not_read(graph_backend):
    # out_key ("next", "reward") into a TensorDict whose "next" holds other keys the module
    # does not read: eagerly the write merges into the caller's "next" (same object, its
    # keys kept); the replay must not replace it with a new "next" holding the reward only
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    module = TensorDictModule(lambda obs: (obs * 2, obs.sum(-1, keepdim=True)), in_keys=["obs"],
                              out_keys=["action", ("next", "reward")])
    g = CudaGraphModule(module, warmup=1, backend=graph_backend)

    def make(k):
        return TensorDict(obs=torch.full((2, 3), float(k)),
                          next=TensorDict(obs=torch.full((2, 3), k + 0.5), batch_size=[2]), batch_size=[2])

    for k in range(4):
        td, ref = make(k), make(k)
        nxt = td["next"]
        assert g(td) is td
        module(ref)
        assert list(td.keys(True, True)) == list(ref.keys(True, True))
        assert td["next"] is nxt  # the caller's nested TensorDict, written into
        for key in ref.keys(True, True):
            torch.testing.assert_close(td[key], ref[key])
    # a TensorDict without "next": served through a stand-in laid out as at capture, then the
    # module's writes set into it (it creates "next", as eagerly)
    td, ref = TensorDict(obs=torch.ones(2, 3), batch_size=[2]), TensorDict(obs=torch.ones(2, 3), batch_size=[2])
    assert g(td) is td
    module(ref)
    assert list(td.keys(True, True)) == list(ref.keys(True, True)) and (td == ref).all()


def test_module_creates_a_nested_tensordict_where_a_caller_may_hold_one(graph_backend):
    # captured on TensorDicts without "next": the module creates it. A later call whose
    # TensorDict holds a "next" (unread) merges eagerly: served through a stand-in, the
    # module's writes set into the caller's "next"
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule

    module = TensorDictModule(lambda obs: obs * 2, in_keys=["obs"], out_keys=[("next", "obs")])
    g = CudaGraphModule(module, warmup=1, backend=graph_backend)
    for k in range(3):
        td = TensorDict(obs=torch.full((2, 3), float(k)), batch_size=[2])
        g(td)
        torch.testing.assert_close(td["next", "obs"], td["obs"] * 2)
    td = TensorDict(obs=torch.ones(2, 3), next=TensorDict(done=torch.zeros(2, 1), batch_size=[2]), batch_size=[2])
    nxt = td["next"]
    assert g(td) is td and td["next"] is nxt
    assert list(td.keys(True, True)) == ["obs", ("next", "done"), ("next", "obs")]
    torch.testing.assert_close(td["next", "obs"], torch.full((2, 3), 2.0))
    td = TensorDict(obs=torch.ones(2, 3), batch_size=[2])  # and as captured
    torch.testing.assert_close(g(td)["next", "obs"], torch.full((2, 3), 2.0))


def _sequential():
    from tensordict.nn import TensorDictModule, TensorDictSequential

    first = TensorDictModule(lambda a: a * 0.5, in_keys=["a"], out_keys=["hidden"])
    second = TensorDictModule(lambda h: (h * 2, h * 3), in_keys=["hidden"], out_keys=["out", ("nested", "out2")])
    return TensorDictSequential(first, second)


def test_result_that_carries_unread_entries_is_refused_at_capture(graph_backend):
    # TensorDictSequential given tensordict_out copies the nested TensorDict it wrote into
    # whole, unread "c" included: the graph, reading only "a", cannot return "c"
    from tensordict import TensorDict

    g = CudaGraphModule(_sequential(), warmup=1, backend=graph_backend)

    def make():
        return TensorDict(a=torch.ones(2, 1), nested=TensorDict(c=torch.zeros(2, 1), batch_size=[2]), batch_size=[2])

    g(make(), tensordict_out=TensorDict(batch_size=[2]))  # warmup: eager
    td, out = make(), TensorDict(batch_size=[2])
    with pytest.raises(UnsupportedError, match=r"\[\('nested', 'c'\)\] come from entries the module reads or copies"):
        g(td, tensordict_out=out)
    assert list(out.keys()) == [] and list(td.keys(True, True)) == ["a", ("nested", "c")]


def test_unread_layout_that_a_result_would_carry_is_a_mismatch(graph_backend):
    # captured on TensorDicts without "nested": a later one holding it (unread) would have
    # it copied into the result eagerly
    from tensordict import TensorDict

    module = _sequential()
    g = CudaGraphModule(_sequential(), warmup=1, backend=graph_backend)
    for k in range(3):
        td = TensorDict(a=torch.full((2, 1), float(k)), batch_size=[2])
        got = g(td, tensordict_out=TensorDict(batch_size=[2]))
        want = module(td.clone(), tensordict_out=TensorDict(batch_size=[2]))
        assert list(got.keys(True, True)) == list(want.keys(True, True))
    td = TensorDict(a=torch.ones(2, 1), nested=TensorDict(c=torch.zeros(2, 1), batch_size=[2]), batch_size=[2])
    with pytest.raises(InputMismatchError, match=r"nested TensorDicts of TensorDict argument 0: expected \[\]"):
        g(td, tensordict_out=TensorDict(batch_size=[2]))


def test_nested_tensordict_written_into_an_input_and_returned_is_one_object(graph_backend):
    # found by the long differential run: the function creates k0["obs"] and returns
    # k0.exclude("x"), whose "obs" is that same TensorDict; the replay built it twice
    def fn(a0, k0):
        k0["obs", "leaf"] = a0["b"]
        return k0.exclude("x")

    def make(k):
        return (TensorDict(b=torch.full((2,), float(k))), TensorDict(x=torch.ones(1) * k, b=torch.ones(1)))

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for k in range(3):
        a0, k0 = make(k)
        out = g(a0, k0)
        assert out["obs"] is k0["obs"]
        torch.testing.assert_close(out["obs", "leaf"], a0["b"])


def test_returned_nested_tensordict_deleted_from_its_parent_afterwards(graph_backend):
    # found by the long differential run: the result holds k0["b"], which the function then
    # writes into and deletes from k0; the replay looked "b" up after the deletion (None)
    def fn(a0, *, k0):
        out = k0.exclude("x")
        k0["b"]["new"] = a0
        del k0["b"]
        return out

    def make(k):
        return torch.full((1,), float(k)), TensorDict(x=torch.ones(1), b=TensorDict(x=torch.zeros(1)))

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for k in range(3):
        a0, k0 = make(k)
        inner = k0["b"]
        out = g(a0, k0=k0)
        assert out["b"] is inner and list(k0.keys()) == ["x"]
        torch.testing.assert_close(out["b", "new"], a0)


METADATA = {
    "t_": (lambda x: x.t_(), (2, 3), "shape (2, 3), stride (3, 1) → shape (3, 2), stride (1, 3)"),
    "transpose_": (lambda x: x.transpose_(0, 1), (2, 3), "shape (2, 3), stride (3, 1) → shape (3, 2), stride (1, 3)"),
    "unsqueeze_": (lambda x: x.unsqueeze_(0), (4,), "shape (4,), stride (1,) → shape (1, 4), stride (4, 1)"),
    "squeeze_": (lambda x: x.squeeze_(0), (1, 3), "shape (1, 3), stride (3, 1) → shape (3,), stride (1,)"),
    "resize_": (lambda x: x.resize_(2), (4,), "shape (4,), stride (1,) → shape (2,), stride (1,)"),
    "as_strided_": (lambda x: x.as_strided_((2,), (2,)), (4,), "shape (4,), stride (1,) → shape (2,), stride (2,)"),
}


@pytest.mark.parametrize("op", sorted(METADATA))
def test_an_input_changed_in_shape_or_strides_in_place_is_refused_at_capture(graph_backend, op):
    change, shape, was = METADATA[op]

    def fn(x):
        change(x)
        return x * 2

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    g(torch.ones(shape))
    x = torch.ones(shape)
    with pytest.raises(UnsupportedError) as info:
        g(x)
    assert str(info.value) == (
        f"CudaGraphModule(fn) cannot replay this call as a CUDA graph: args[0] changed its shape or strides in "
        f"place ({was}); a replay copies each call's tensors into fixed buffers and cannot change the caller's "
        "tensor's shape.\nTo fix: use the out-of-place form (x = x.t(), x = x.unsqueeze(0)) and return the result."
    )
    assert x.shape == shape and g.state == "warmup"  # the caller's tensor is untouched


@pytest.mark.parametrize("kind", ["OrderedDict", "defaultdict"])
def test_dict_types_given_as_arguments(kind, graph_backend):
    # an OrderedDict or defaultdict argument is a container as a dict is: its scalars part of the
    # signature, what the function writes (keys, order; a defaultdict's missing key it reads)
    # done to the caller's, of its type
    from collections import OrderedDict, defaultdict

    def fn(x, cfg):
        y = x * cfg["scale"]
        if isinstance(cfg, defaultdict):
            y = y + cfg["missing"]  # inserts "missing": 0.0, at every call (a new dict each time)
        else:
            cfg.move_to_end("scale")
        cfg["out"] = y
        return y.sum()

    def make(k):
        cfg = OrderedDict(scale=2.0, tau=0.5) if kind == "OrderedDict" else defaultdict(float, scale=2.0, tau=0.5)
        return torch.full((3,), float(k)), cfg

    g = CudaGraphModule(fn, warmup=1, backend=graph_backend)
    for k in range(5):
        (x, mine), (x2, theirs) = make(k), make(k)
        torch.testing.assert_close(g(x, mine), fn(x2, theirs))
        assert type(mine) is type(theirs) and list(mine) == list(theirs)
        assert getattr(mine, "default_factory", None) is getattr(theirs, "default_factory", None)
        for key in theirs:
            if isinstance(theirs[key], torch.Tensor):
                torch.testing.assert_close(mine[key], theirs[key])
            else:
                assert mine[key] == theirs[key] and type(mine[key]) is type(theirs[key])
    assert g.stats.captures == 1
    # another scalar is another variant: served as the plain call (by default, a graph of its own)
    for _ in range(3):
        (x, mine), (x2, theirs) = make(1), make(1)
        mine["scale"] = theirs["scale"] = 3.0
        torch.testing.assert_close(g(x, mine), fn(x2, theirs))
        assert list(mine) == list(theirs)
    assert g.stats.captures == 2
    # with one graph allowed, it is refused, naming the key
    one = CudaGraphModule(fn, warmup=1, backend=graph_backend, max_graphs=1)
    for k in range(3):
        one(*make(k))
    x, cfg = make(0)
    cfg["scale"] = 3.0
    with pytest.raises(InputMismatchError, match=r"args\[1\]\['scale'\]: expected value 2\.0, got 3\.0"):
        one(x, cfg)
