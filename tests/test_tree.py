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
from tensordict import LazyStackedTensorDict, TensorDict

from graphmodule import CudaGraphModule, InputMismatchError
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
        g = CudaGraphModule(lambda *a: torch.zeros(1), warmup=1, backend="simulate")
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
