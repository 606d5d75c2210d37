"""Reading calls: the fast readers and the slow explainer agree, on generated trees.

The replay's hot path reads a TensorDict through its nested dicts (``_read_fast``) and
decides a match with one comparison; a mismatch is explained by a separate, slow walk
(``_explain``). A disagreement would either replay a call that differs, or refuse one with
nothing to say. These tests generate TensorDicts and calls, and check both ways.
"""

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import LazyStackedTensorDict, TensorDict, tensorclass
from tensordict.nn import TensorDictModule

from graphmodule import CudaGraphModule, InputMismatchError, UnsupportedError
from graphmodule._tree import Layout

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAMES = st.sampled_from(["a", "b", "c", "obs", "h"])


@st.composite
def tensordicts(draw, depth=0, batch=(2,)):
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    source = {}
    for name in names:
        if depth < 2 and draw(st.integers(0, 3)) == 0:
            extra = draw(st.sampled_from([(), (3,)]))
            source[name] = draw(tensordicts(depth + 1, batch + extra))
        else:
            source[name] = torch.zeros(*batch, draw(st.integers(1, 2)))
    return TensorDict(source, batch_size=list(batch))


def change(td: TensorDict, how: str) -> TensorDict:
    td = td.clone()
    keys = list(td.keys())
    if how == "reorder" and len(keys) > 1:
        return TensorDict({k: td[k] for k in reversed(keys)}, batch_size=td.batch_size)
    if how == "add":
        td["zz"] = torch.zeros(*td.batch_size, 1)
    elif how == "remove" and len(keys) > 1:
        del td[keys[0]]
    elif how == "shape":
        leaf = next(iter(td.keys(True, True)))
        td[leaf] = torch.zeros(*td.get(leaf).shape[:-1], td.get(leaf).shape[-1] + 1)
    elif how == "dtype":
        leaf = next(iter(td.keys(True, True)))
        td[leaf] = td.get(leaf).double()
    elif how == "lazy":
        return LazyStackedTensorDict(*td.unbind(0), stack_dim=0)
    return td


HOWS = ["same", "reorder", "add", "remove", "shape", "dtype", "lazy"]


class TestReadersAgree:
    @SETTINGS
    @given(td=tensordicts(), how=st.sampled_from(HOWS), exact=st.booleans())
    def test_fast_and_general_readers_read_the_same(self, td, how, exact):
        keys = None if exact else [k if isinstance(k, str) else k for k in td.keys(True, True)][:2]
        layout = Layout.capture(((td,), {}), {} if exact else {(0, 0): [(k,) if isinstance(k, str) else k for k in keys]})
        slot = layout.slots[0]
        other = change(td, how)
        fast, general = slot._read_fast(other), slot._read_general(other)
        if isinstance(other, TensorDict):
            assert (fast is None) == (general is None)
            if fast is not None:
                assert len(fast) == len(general) and all(a is b for a, b in zip(fast, general))


class TestMatchAndExplainAgree:
    @SETTINGS
    @given(td=tensordicts(), how=st.sampled_from(HOWS))
    def test_a_call_replays_or_is_explained(self, td, how):
        g = CudaGraphModule(lambda t: sum(v.sum() for v in t.values(True, True)), warmup=1, backend="simulate")
        g(td.clone())
        g(td.clone())
        other = change(td, how)
        try:
            g(other)
        except InputMismatchError as err:
            assert err.mismatches, "refused with nothing to say"
            assert "a call that does not match it" not in str(err)  # the fallback of a disagreement
            assert how != "same"
        else:
            assert how in ("same",) or (how == "reorder" and len(list(td.keys())) == 1) or (
                how == "remove" and len(list(td.keys())) == 1)

    @pytest.mark.parametrize(
        "captured, called",
        [
            (({"b": 1.0, "a": 2.0},), ({"a": 2.0, "b": 1.0},)),
            (([torch.zeros(2)], 3), ([torch.zeros(2), torch.zeros(2)], 3)),
            ((torch.zeros(2), 0.0), (torch.zeros(2), -0.0)),
            ((torch.zeros(2), float("nan")), (torch.zeros(2), float("nan"))),
            ((torch.zeros(2), None), (torch.zeros(2), 0)),
        ],
        ids=["dict-order", "list-length", "negative-zero", "nan", "none-for-int"],
    )
    def test_hand_picked_pairs(self, captured, called):
        # (max_graphs=1: by default, a call differing only in Python values gets a graph of its own)
        g = CudaGraphModule(lambda *a: torch.zeros(1), warmup=1, backend="simulate", max_graphs=1)
        g(*captured)
        g(*captured)
        same = len(captured) == len(called) and all(
            (a != a and b != b) if isinstance(a, float) and a != a else repr(a) == repr(b) for a, b in zip(captured, called)
        )
        if same:
            g(*called)
            assert g.stats.replays == 2
        else:
            with pytest.raises(InputMismatchError) as info:
                g(*called)
            assert info.value.mismatches and "a call that does not match it" not in str(info.value)


def test_insertion_order_is_part_of_a_plain_dicts_structure():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = CudaGraphModule(lambda d: torch.cat(list(d.values())), warmup=1, backend="simulate")
    g({"b": torch.ones(1), "a": torch.zeros(1)})
    torch.testing.assert_close(g({"b": torch.ones(1), "a": torch.zeros(1)}), torch.tensor([1.0, 0.0]))
    with pytest.raises(InputMismatchError) as info:
        g({"a": torch.zeros(1), "b": torch.ones(1)})
    assert [m.describe() for m in info.value.mismatches] == ["args[0]: expected key order ['b', 'a'], got ['a', 'b']"]


@tensorclass
class Pose:
    pos: torch.Tensor
    vel: torch.Tensor


def _with_pose(i, n=3):
    pose = Pose(pos=torch.full((2, n), float(i)), vel=torch.ones(2, n), batch_size=[2])
    return TensorDict(pose=pose, obs=torch.ones(2, n), batch_size=[2])


def _read_pose(td):
    return td["pose"].pos * 2 + td["pose"].vel


class TestTensorclassesInTensorDicts:
    """A tensorclass held in a TensorDict is a nested level, read through its own TensorDict."""

    def test_a_function_reading_a_field(self, graph_backend):
        g = CudaGraphModule(_read_pose, warmup=1, backend=graph_backend)
        for i in range(4):
            torch.testing.assert_close(g(_with_pose(i)), _read_pose(_with_pose(i)))
        assert g.stats.captures == 1

    def test_a_module_reading_a_field_by_key(self, graph_backend):
        module = TensorDictModule(lambda pos: pos * 3, in_keys=[("pose", "pos")], out_keys=["y"])
        g = CudaGraphModule(module, warmup=1, backend=graph_backend)
        for i in range(4):
            td, plain = _with_pose(i), module(_with_pose(i))
            out = g(td)
            assert out is td and type(out["pose"]) is Pose
            torch.testing.assert_close(out["y"], plain["y"])
        assert g.stats.captures == 1

    def test_a_field_rebound_by_the_function(self, graph_backend):
        def step(td):
            td["pose"].pos = td["pose"].pos + td["pose"].vel
            return td["pose"]

        g = CudaGraphModule(step, warmup=1, backend=graph_backend)
        for i in range(4):
            td, plain = _with_pose(i), _with_pose(i)
            out = g(td)
            step(plain)
            assert out is td["pose"]
            torch.testing.assert_close(td["pose"].pos, plain["pose"].pos)

    def test_another_kind_of_value_where_a_tensorclass_was_captured(self):
        g = CudaGraphModule(_read_pose, warmup=1, backend="simulate")
        g(_with_pose(0))
        g(_with_pose(1))
        given = TensorDict(pose=TensorDict(pos=torch.ones(2, 3), vel=torch.ones(2, 3), batch_size=[2]),
                           obs=torch.ones(2, 3), batch_size=[2])
        with pytest.raises(InputMismatchError) as info:
            g(given)
        assert [m.describe() for m in info.value.mismatches][0] == (
            "args[0]['pose']: expected type Pose, got a TensorDict with batch size (2,)")


def _ragged(i):
    return LazyStackedTensorDict.lazy_stack(
        [TensorDict(obs=torch.full((3,), float(i)), a=torch.ones(2)),
         TensorDict(obs=torch.full((4,), float(i)), a=torch.ones(2))], 0)


class TestLazyStacksOfSeveralShapes:
    def test_a_function_given_one_is_refused(self):
        g = CudaGraphModule(lambda td: td[0]["obs"] + 1, warmup=1, backend="simulate")
        g(_ragged(0))
        with pytest.raises(UnsupportedError) as info:
            g(_ragged(1))
        assert str(info.value) == (
            "CudaGraphModule(<lambda>) cannot replay this call as a CUDA graph: expected one shape per entry, got a "
            "LazyStackedTensorDict whose entry args[0]['obs'] has shapes (3,) and (4,): a graph copies each input "
            "into a buffer of one shape.\n"
            "To fix: pass the stacked TensorDicts as a list (td.tensordicts, or list(td.unbind(td.stack_dim))), each "
            "of its own shapes, or pad the entry to one shape (td.get(key, as_padded_tensor=True)); a TensorDict "
            "module reads only its in_keys, which may stack while other entries do not."
        )

    def test_a_module_reading_entries_that_stack(self, graph_backend):
        module = TensorDictModule(lambda a: a * 2, in_keys=["a"], out_keys=["b"])
        g = CudaGraphModule(module, warmup=1, backend=graph_backend)
        for i in range(4):
            td, plain = _ragged(i), module(_ragged(i))
            assert g(td) is td
            torch.testing.assert_close(td["b"], plain["b"])
            assert [tuple(t.shape) for t in td.get("obs", as_list=True)] == [(3,), (4,)]
        assert g.stats.captures == 1
