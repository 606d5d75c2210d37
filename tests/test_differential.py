"""Differential tests: every wrapped call must do what the plain call does, or raise a GraphModuleError.

Two parts:

- fuzzing with hypothesis (``test_fuzz[...]``, ``test_fuzz_random``, and
  ``test_fuzz_on_cuda_graphs[...]`` on a GPU): generated call trees and function bodies
  (``tests/differential/strategies.py``) run through the oracle
  (``tests/differential/oracle.py``), which compares results, argument side effects,
  identity and aliasing call by call;
- hand-picked regressions (``TestInputs``, ``TestBodies``, ``TestOutputs``, ...), one small
  case per class of inputs, body operations and outputs, so that a failing class shows by name.

Environment:

- ``GM_FUZZ_EXAMPLES``: generated cases over all fuzz tests (default 150: about 10 s on CPU
  when they pass);
- ``GM_FUZZ_BACKEND``: ``simulate`` (default), ``cuda`` (real graphs, tensors on the GPU) or
  ``eager`` (a self-check of the oracle: no graph, so only the wrapper's input checks can differ);
- ``GM_FUZZ_SEED``: explore with this seed instead of the fixed, derandomized one;
- ``GM_FUZZ_SHRINK_RUNS``: runs spent shrinking a failure (default 200, 5 to 20 s per failing test);
- ``GM_FUZZ_ALL_BUGS=1``: shrink one repro per kind of difference, not just the first (slow);
- ``GM_FUZZ_SECONDS``: stop each fuzz test cleanly after this long (long runs);
- ``GM_FUZZ_PROGRESS``: a file rewritten with the count every 100 cases (and stacks on SIGUSR1);
- ``GM_FUZZ_PROFILE``: a file for a cProfile of the cases after the 20th;
- ``GM_FUZZ_OUTPUTS``: the wrappers' ``outputs`` option in ``test_fuzz`` (default ``clone``,
  the default; ``test_fuzz_safe_outputs`` always uses ``safe``).

A failure prints the case as a script (paste it after the header to reproduce), the call
sequence, and each difference with the eager and the wrapped value.
"""

import functools
from textwrap import dedent

import pytest
import torch

from tests.differential.fuzz import BACKEND, DEVICE, EXAMPLES, OUTPUTS, cuda_backend_or_skip, run_fuzz
from tests.differential.oracle import check_case, check_random_case
from tests.differential.strategies import RANDOM_BODIES, Case, RandomCase, cases, random_cases

# share of GM_FUZZ_EXAMPLES per fuzz test
SHARES = {
    "mixed": 0.30,
    "tensordict": 0.15,
    "aliasing": 0.13,
    "mutation": 0.12,
    "outputs": 0.10,
    "signature": 0.10,
    "random": 0.10,
}


@pytest.mark.parametrize("focus", [f for f in SHARES if f != "random"])
def test_fuzz(focus, capsys):
    cuda_backend_or_skip()
    check = functools.partial(check_case, outputs=OUTPUTS)
    run_fuzz(focus, cases(focus), check, EXAMPLES * SHARES[focus], BACKEND, DEVICE, capsys)


@pytest.mark.parametrize("focus", ["mixed", "outputs", "aliasing", "mutation"])
def test_fuzz_safe_outputs(focus, capsys):
    """outputs="safe" (lent buffers, a twin capture, moves): every result kept to the end of
    the sequence is compared again there, as with copies."""
    cuda_backend_or_skip()
    check = functools.partial(check_case, outputs="safe")
    run_fuzz(f"safe {focus}", cases(focus), check, EXAMPLES * SHARES[focus], BACKEND, DEVICE, capsys)


def test_fuzz_random(capsys):
    cuda_backend_or_skip()
    run_fuzz("random", random_cases(), check_random_case, EXAMPLES * SHARES["random"], BACKEND, DEVICE, capsys)


@pytest.mark.cuda
@pytest.mark.parametrize("focus", list(SHARES))
def test_fuzz_on_cuda_graphs(focus, capsys):
    """The same harness with real CUDA graphs and tensors on the GPU."""
    if BACKEND == "cuda":
        pytest.skip("GM_FUZZ_BACKEND=cuda: test_fuzz runs on the GPU already")
    n = EXAMPLES * SHARES[focus]
    if focus == "random":
        run_fuzz("cuda random", random_cases(), check_random_case, n, "cuda", "cuda", capsys)
    else:
        run_fuzz(f"cuda {focus}", cases(focus), check_case, n, "cuda", "cuda", capsys)


# -- hand-picked regressions -----------------------------------------------------------------
BACKENDS = [
    pytest.param(BACKEND, id=BACKEND),
    *([] if BACKEND == "cuda" else [pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]),
]


@pytest.fixture(params=BACKENDS)
def check(request):
    backend = request.param
    device = "cuda" if backend == "cuda" else "cpu"

    def _check(inputs: str, fn: str, *, changed: str | None = None, what: str = "", warmup: int = 2,
               replays: int = 2, reuse: bool = False) -> None:
        case = Case(
            inputs_src=dedent(inputs),
            fn_src=dedent(fn),
            warmup=warmup,
            replays=replays,
            changed_src=dedent(changed) if changed else None,
            changed_what=what,
            reuse=reuse,
        )
        check_case(case, backend, device)

    return _check


class TestInputs:
    """Kinds of call trees, with a body that only computes."""

    def test_positional_and_keyword_args(self, check):
        check(
            """
            def make_inputs(k):
                return (val((3,), k), val((3,), k, salt=1)), {'scale': 2.0, 'bias': val((3,), k, salt=2)}
            """,
            """
            def fn(x, y, *, scale, bias):
                return x * scale + y + bias
            """,
            replays=3,  # replay 1 passes the keywords in reversed order
        )

    def test_nested_dicts_lists_tuples(self, check):
        check(
            """
            def make_inputs(k):
                return ({'a': [val((2,), k), (val((2,), k, salt=1), 3)], 'b': {'c': val((2, 2), k, salt=2)}},), {}
            """,
            """
            def fn(tree):
                return tree['a'][0] + tree['a'][1][0] * tree['a'][1][1] + tree['b']['c'].sum(0)
            """,
        )

    def test_tensordict_nested_keys_and_batch_dims(self, check):
        check(
            """
            def make_inputs(k):
                td = TensorDict({'obs': val((4, 3), k), 'next': {'obs': val((4, 3), k, salt=1)}}, batch_size=[4])
                return (td,), {}
            """,
            """
            def fn(td):
                return td['next', 'obs'] - td['obs']
            """,
        )

    def test_tensordict_child_with_more_batch_dims(self, check):
        # multi-agent layout: parent [4], child [4, 3]
        check(
            """
            def make_inputs(k):
                agents = TensorDict({'obs': val((4, 3, 2), k)}, batch_size=[4, 3])
                return (TensorDict({'agents': agents, 'done': val((4, 1), k, torch.bool)}, batch_size=[4]),), {}
            """,
            """
            def fn(td):
                return td['agents'].apply(lambda x: x * 2)
            """,
        )

    def test_tensordict_key_order_seen_by_a_plain_function(self, check):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'b': val((2,), k), 'a': val((2,), k, salt=1)}, batch_size=[]),), {}
            """,
            """
            def fn(td):
                return list(td.keys()), torch.cat([v for v in td.values()])
            """,
        )

    @pytest.mark.parametrize(
        "body",
        ["td.clone()['b'] + 1", "td['s'] + 'x'", "td.apply(lambda x: x * 2)"],
        ids=["clone", "read", "apply"],
    )
    def test_tensordict_with_a_non_tensor_entry(self, check, body):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'s': 'abc', 'b': val((1,), k)}, batch_size=[]),), {}
            """,
            f"""
            def fn(td):
                return {body}
            """,
        )

    def test_tensorclass_argument(self, check):
        check(
            """
            def make_inputs(k):
                return (Pair(obs=val((4, 2), k), reward=val((4,), k, salt=1), batch_size=[4]),), {}
            """,
            """
            def fn(p):
                return p.obs.sum(-1) + p.reward
            """,
        )

    def test_constants_int_float_bool_str_none(self, check):
        check(
            """
            def make_inputs(k):
                return (val((3,), k), 2, 0.5, True, 'mode', None), {}
            """,
            """
            def fn(x, i, f, b, s, n):
                y = x * i + f
                y = y if b else -y
                return y * (2 if s == 'mode' else 3) + (1 if n is None else 0)
            """,
        )

    def test_negative_zero_is_not_zero(self, check):
        check(
            """
            def make_inputs(k):
                return (val((3,), k) + 3, 0.0), {}
            """,
            """
            def fn(x, c):
                return x * c
            """,
            changed="""
            def make_changed_inputs(k):
                return (val((3,), k) + 3, -0.0), {}
            """,
            what="constant 0.0 -> -0.0",
        )

    def test_nan_constant(self, check):
        check(
            """
            def make_inputs(k):
                return (val((3,), k), float('nan')), {}
            """,
            """
            def fn(x, fill):
                return torch.where(x > 0, x, fill)
            """,
        )

    def test_same_tensor_passed_twice(self, check):
        check(
            """
            def make_inputs(k):
                t = val((3,), k)
                return (t, t), {}
            """,
            """
            def fn(a, b):
                a.add_(1)
                return b * 2
            """,
        )

    def test_view_of_another_input(self, check):
        check(
            """
            def make_inputs(k):
                t = val((4,), k)
                return (t, t[1:]), {}
            """,
            """
            def fn(x, tail):
                x.mul_(2)
                return tail + 0
            """,
        )

    def test_one_tensor_under_two_tensordict_keys(self, check):
        check(
            """
            def make_inputs(k):
                t = val((2, 3), k)
                return (TensorDict({'x': t, 'y': t}, batch_size=[2]),), {}
            """,
            """
            def fn(td):
                td['x'].add_(1)
                return td['y'] * 1
            """,
        )

    def test_no_tensor_at_all(self, check):
        check(
            """
            def make_inputs(k):
                return ('a',), {}
            """,
            """
            def fn(s):
                return {'s': s + 'b'}
            """,
        )


class TestBodies:
    """Operations a body does to its arguments."""

    def test_pure_compute(self, check):
        check(
            """
            def make_inputs(k):
                return (val((3, 2), k), val((3, 2), k, torch.float64, 1)), {}
            """,
            """
            def fn(x, y):
                return (x * 2 + 1) @ y.t().float(), x.flip(0).abs(), y.clamp(min=0).sum(0)
            """,
        )

    @pytest.mark.parametrize(
        "stmt", ["x.add_(1)", "x.mul_(2)", "x.copy_(y * 2)", "x[0].add_(1)", "x.data.add_(1)"]
    )
    def test_inplace_write_into_an_input(self, check, stmt):
        check(
            """
            def make_inputs(k):
                return (val((3,), k), val((3,), k, salt=1)), {}
            """,
            f"""
            def fn(x, y):
                {stmt}
                return y + 1
            """,
        )

    def test_dict_setitem(self, check):
        check(
            """
            def make_inputs(k):
                return ({'x': val((2,), k)},), {}
            """,
            """
            def fn(d):
                d['y'] = d['x'] * 2
                return d['x'] + 1
            """,
        )

    def test_dict_pop(self, check):
        check(
            """
            def make_inputs(k):
                return ({'x': val((2,), k), 'y': val((2,), k, salt=1)},), {}
            """,
            """
            def fn(d):
                y = d.pop('y')
                return d['x'] + y
            """,
        )

    def test_dict_rebind_to_another_input(self, check):
        check(
            """
            def make_inputs(k):
                return ({'x': val((2,), k)}, val((2,), k, salt=1)), {}
            """,
            """
            def fn(d, t):
                d['x'] = t
                return t * 2
            """,
        )

    def test_list_append(self, check):
        check(
            """
            def make_inputs(k):
                return ([val((2,), k)],), {}
            """,
            """
            def fn(items):
                items.append(items[0] * 2)
                return items[0] + 1
            """,
        )

    def test_list_pop(self, check):
        check(
            """
            def make_inputs(k):
                return ([val((2,), k), val((2,), k, salt=1)],), {}
            """,
            """
            def fn(items):
                last = items.pop()
                return items[0] + last
            """,
        )

    def test_tensordict_set(self, check):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'obs': val((4, 2), k)}, batch_size=[4]),), {}
            """,
            """
            def fn(td):
                td['action'] = td['obs'].sum(-1)
                td['nested', 'leaf'] = td['obs'] * 2
                return td['obs'] + 1
            """,
        )

    def test_tensordict_set_an_input_tensor(self, check):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'obs': val((4, 2), k)}, batch_size=[4]), val((4,), k, salt=1)), {}
            """,
            """
            def fn(td, r):
                td['reward'] = r
                return td['obs'] + 1
            """,
        )

    def test_tensordict_del(self, check):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'obs': val((4, 2), k), 'tmp': val((4,), k, salt=1)}, batch_size=[4]),), {}
            """,
            """
            def fn(td):
                del td['tmp']
                return td['obs'] + 1
            """,
        )

    def test_tensordict_pop_nested(self, check):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'obs': val((4, 2), k), 'sub': {'a': val((4,), k, salt=1)}}, batch_size=[4]),), {}
            """,
            """
            def fn(td):
                sub = td.pop('sub')
                return td['obs'].sum(-1) + sub['a']
            """,
        )

    def test_tensordict_set_batch_size(self, check):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'obs': val((4, 2), k)}, batch_size=[]),), {}
            """,
            """
            def fn(td):
                td.batch_size = [4]
                return td['obs'] + 1
            """,
        )

    def test_tensorclass_field_set(self, check):
        check(
            """
            def make_inputs(k):
                return (Pair(obs=val((4, 2), k), reward=val((4,), k, salt=1), batch_size=[4]),), {}
            """,
            """
            def fn(p):
                p.reward = p.obs.sum(-1)
                return p.reward + 1
            """,
        )


    @pytest.mark.parametrize("remove", ["td.pop('y')", "del td['y']"])
    def test_tensordict_key_removed_then_set_again_goes_last(self, check, remove):
        check(
            """
            def make_inputs(k):
                return (TensorDict({'y': val((2,), k), 'b': val((2,), k, salt=1)}, batch_size=[]),), {}
            """,
            f"""
            def fn(td):
                y = td['y']
                {remove}
                td['y'] = y * 2
                return list(td.keys())
            """,
        )

    def test_dict_key_popped_then_set_again_goes_last(self, check):
        check(
            """
            def make_inputs(k):
                return ({'y': val((2,), k), 'b': val((2,), k, salt=1)},), {}
            """,
            """
            def fn(d):
                d['y'] = d.pop('y') * 2
                return list(d)
            """,
        )

    @pytest.mark.parametrize(
        "change",
        ["td['sub']['new'] = td['sub']['a'] * 2", "td['sub']['a'] = td['sub']['a'] * 2",
         "td['sub'].batch_size = []", "td['sub']['a'].mul_(2)"],
        ids=["new-key", "rebind", "batch_size", "inplace"],
    )
    @pytest.mark.parametrize("remove", ["td.pop('sub')", "del td['sub']"], ids=["pop", "del"])
    def test_nested_tensordict_changed_then_removed(self, check, change, remove):
        check(
            """
            def make_inputs(k):
                sub = TensorDict({'a': val((2,), k)}, batch_size=[2])
                return (TensorDict({'sub': sub, 'x': val((2,), k, salt=1)}, batch_size=[]),), {}
            """,
            f"""
            def fn(td):
                {change}
                {remove}
                return td['x'] + 1
            """,
        )


class TestErrorsOfTheFunction:
    """The function itself raises (as eagerly): the same error, and the same effects before it."""

    def test_error_at_capture_keeps_the_effects_made_before_it(self, check):
        # the first call deletes 'a'; the capturing call (same objects) raises KeyError
        check(
            """
            def make_inputs(k):
                return (val((2,), k), {'a': 1}, []), {}
            """,
            """
            def fn(x, d, items):
                x.add_(1)
                items.append(1)
                del d['a']
                return x * 2
            """,
            warmup=1,
            reuse=True,
        )


class TestOutputs:
    """What a body returns."""

    INPUTS = """
        def make_inputs(k):
            return (val((3, 2), k), {'d': val((3,), k, salt=1)}), {}
        """

    @pytest.mark.parametrize(
        "ret",
        [
            pytest.param("x * 2", id="new-tensor"),
            pytest.param("x", id="input-as-is"),
            pytest.param("x[1:]", id="view-x[1:]"),
            pytest.param("x.t()", id="view-x.t()"),
            pytest.param("d", id="input-dict-as-is"),
            pytest.param("d['d']", id="tensor-from-input-dict"),
            pytest.param("(x + 1, x - 1, 2)", id="tuple"),
            pytest.param("[x + 1, None, 'tag']", id="list"),
            pytest.param("{'b': x + 1, 'a': x - 1}", id="dict-key-order"),
            pytest.param("-0.0", id="negative-zero"),
        ],
    )
    def test_returns(self, check, ret):
        check(self.INPUTS, f"def fn(x, d):\n    return {ret}\n")

    def test_same_tensor_twice(self, check):
        check(self.INPUTS, "def fn(x, d):\n    y = x * 2\n    return y, y\n")

    def test_view_of_another_output(self, check):
        check(self.INPUTS, "def fn(x, d):\n    y = x * 2\n    return y, y[1:]\n")

    def test_tensordict(self, check):
        check(self.INPUTS, "def fn(x, d):\n    return TensorDict({'b': x * 2, 'a': d['d'] + 1}, batch_size=[3])\n")

    def test_tensordict_holding_an_input(self, check):
        check(self.INPUTS, "def fn(x, d):\n    return TensorDict({'x': x, 'y': x * 2}, batch_size=[3])\n")

    def test_tensordict_child_with_more_batch_dims(self, check):
        check(
            self.INPUTS,
            """
            def fn(x, d):
                agents = TensorDict({'obs': x * 2}, batch_size=[3, 2])
                return TensorDict({'agents': agents, 'r': d['d'] + 1}, batch_size=[3])
            """,
        )

    def test_tensorclass(self, check):
        check(self.INPUTS, "def fn(x, d):\n    return Pair(obs=x * 2, reward=d['d'] + 1, batch_size=[3])\n")

    def test_dataclass(self, check):
        check(self.INPUTS, "def fn(x, d):\n    return Out(a=x * 2, b={'r': d['d'] + 1})\n")

    @pytest.mark.parametrize(
        "store, ret",
        [("items.append(x[0])", "items[0]"), ("d['v'] = x[0]", "d['v']"), ("td['v'] = x[0]", "td['v']")],
        ids=["list", "dict", "tensordict"],
    )
    def test_view_stored_into_an_input_container_and_returned(self, check, store, ret):
        check(
            """
            def make_inputs(k):
                return (val((2, 2), k), [], {}, TensorDict({}, batch_size=[2])), {}
            """,
            f"""
            def fn(x, items, d, td):
                {store}
                return {ret}
            """,
        )

    def test_tensor_free_input_dict_inside_a_dataclass(self, check):
        check(
            """
            def make_inputs(k):
                return ({'a': None}, val((2,), k)), {}
            """,
            """
            def fn(d, x):
                return Out(a=d, b=None)
            """,
        )

    def test_normal_distribution(self, check):
        check(self.INPUTS, "def fn(x, d):\n    return Normal(x * 2, x.abs() + 1, validate_args=False)\n")


class TestSignatureChanges:
    """A call with another signature: a GraphModuleError (or the eager result), and the next call works."""

    INPUTS = """
        def make_inputs(k):
            return (val((3,), k), {'a': val((2,), k, salt=1)}), {'c': 1.5}
        """

    @pytest.mark.parametrize(
        "changed, what",
        [
            ("(val((3,), k, torch.float64), {'a': val((2,), k, salt=1)}), {'c': 1.5}", "dtype"),
            ("(val((4,), k), {'a': val((2,), k, salt=1)}), {'c': 1.5}", "shape"),
            ("(val((3,), k), {'a': val((2,), k, salt=1), 'b': val((2,), k)}), {'c': 1.5}", "extra key"),
            ("(val((3,), k), {'a': val((2,), k, salt=1)}), {'c': 2.5}", "constant"),
            ("(val((3,), k), {'a': val((2,), k, salt=1)}), {'c': 1}", "constant type"),
        ],
        ids=["dtype", "shape", "extra-key", "constant", "constant-type"],
    )
    def test_changed_call_then_a_good_call(self, check, changed, what):
        check(
            self.INPUTS,
            "def fn(x, d, *, c):\n    return x.sum() * c + d['a']\n",
            changed=f"def make_changed_inputs(k):\n    return {changed}\n",
            what=what,
        )

    def test_aliasing_changes_after_capture(self, check):
        check(
            """
            def make_inputs(k):
                return (val((3,), k), val((3,), k, salt=1)), {}
            """,
            """
            def fn(a, b):
                a.add_(1)
                return b * 2
            """,
            changed="""
            def make_changed_inputs(k):
                t = val((3,), k)
                return (t, t), {}
            """,
            what="one tensor passed twice",
        )


@pytest.mark.parametrize("body", sorted(RANDOM_BODIES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_randomness_by_distribution(body, backend):
    device = "cuda" if backend == "cuda" else "cpu"
    torch.manual_seed(0)
    check_random_case(RandomCase(body, 4096, "float32", 2.0, 2, 3), backend, device)


# -- the referee itself ----------------------------------------------------------------------
@pytest.mark.parametrize("bug", ["value", "aliasing"])
def test_the_harness_sees_a_planted_difference(monkeypatch, bug):
    """The batched value and aliasing checks still report a wrapper that answers wrongly."""
    import tests.differential.oracle as oracle
    from graphmodule import CudaGraphModule as Real

    class Buggy(Real):
        def __call__(self, *args, **kwargs):
            out = super().__call__(*args, **kwargs)
            if self.state != "captured":
                return out
            return out + 1 if bug == "value" else out.clone()  # a copy where eager returns the input

    monkeypatch.setattr(oracle, "CudaGraphModule", Buggy)
    body = "return x * 2" if bug == "value" else "return x"
    case = Case(inputs_src=dedent("""
        def make_inputs(k):
            return (val((3,), k),), {}
        """), fn_src=dedent(f"""
        def fn(x):
            {body}
        """), warmup=1, replays=2, changed_src=None, changed_what="", reuse=False)
    outcome = oracle.run_case(case, "simulate", "cpu")
    kinds = {d.kind for d in outcome.diffs}
    assert ("output:value" if bug == "value" else "output:identity") in kinds or \
           any(k.endswith("aliasing") for k in kinds), outcome.report() if outcome.diffs else "no difference found"


def test_the_referee_compares_bits_of_any_layout():
    """Strided, one-element, expanded, complex, empty and 0-dim tensors: a changed bit is
    seen, an unchanged tensor is not (found on the GPU fuzz: a one-element view of stride 2)."""
    from tests.differential.oracle import _Bytes

    x = torch.arange(8.0)
    c = torch.randn(3, 2, dtype=torch.cfloat).t()
    tensors = [x[::2], x[::2][1:2], torch.ones(1).expand(3), c, torch.zeros(0), torch.tensor(-0.0)]
    before = _Bytes([t.clone() for t in tensors])
    assert before.differs(tensors) == [False] * 6
    x[2] += 1  # element 1 of x[::2], the one element of x[::2][1:2]
    tensors[5].neg_()  # -0.0 -> 0.0: equal as numbers, not as bits
    assert before.differs(tensors) == [True, True, False, False, False, True]
