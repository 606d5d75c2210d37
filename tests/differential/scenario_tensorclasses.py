"""Scenarios: TensorDicts holding tensorclasses, and lazy stacks of TensorDicts of several shapes.

The input is a TensorDict whose ``"pose"`` entry is a tensorclass (or a lazy stack of two
TensorDicts whose ``"extra"`` entries differ in shape), read by a plain function (fields read,
a field rebound, the tensorclass returned) or by a TensorDict module through nested keys such
as ``("pose", "pos")``. Fresh inputs each step; results may be held. The wrapper must give
the plain results and leave the inputs as the plain call does, or refuse before any effect
(a plain function given entries of several shapes).
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
from tensordict import LazyStackedTensorDict, tensorclass
from tensordict.nn import TensorDictModule


@tensorclass
class Pose:
    pos: torch.Tensor
    vel: torch.Tensor


def make(i):
    if {ragged}:
        parts = [TensorDict(a=torch.full(({n},), 0.5 * i + k), extra=torch.zeros(k + 1), device=device)
                 for k in range(2)]
        return LazyStackedTensorDict.lazy_stack(parts, 0)
    pose = Pose(pos=torch.full(({batch}, {n}), 0.25 * i), vel=torch.ones({batch}, {n}), batch_size=[{batch}])
    return TensorDict(pose=pose, obs=torch.full(({batch}, {n}), -0.5 * i), batch_size=[{batch}], device=device)


def function(td):
    {body}


def build():
    if {module}:
        fn = TensorDictModule(lambda *xs: sum(xs) * 2, in_keys={in_keys!r}, out_keys={out_keys!r})
    else:
        fn = function
    return {{"fn": fn, "held": [], "inputs": []}}


def shown(value):
    # (a lazy stack of several shapes is compared as its TensorDicts: it cannot be read whole)
    return list(value.tensordicts) if isinstance(value, LazyStackedTensorDict) else value


def step(world, f, i):
    td = make(i)
    with torch.no_grad():
        out = f(td)
    world["inputs"].append(td)
    if {hold}:
        world["held"].append(out)
    return shown(out)


def observe(world):
    return shown(world["inputs"][-1]) if world["inputs"] else None
"""

BODIES = {
    "read fields": "return td['pose'].pos * 2 + td['pose'].vel",
    "rebind a field": "td['pose'].pos = td['pose'].pos + td['pose'].vel\n    return td['pose'].pos.sum(-1)",
    "return the tensorclass": "td['pose'].vel.mul_(2)\n    return td['pose']",
    "read a lazy stack": "return td['a'] * 2",
}
MODULE_KEYS = [
    ([("pose", "pos")], ["y"]),
    ([("pose", "pos"), "obs"], ["y"]),
    ([("pose", "vel")], [("pose", "pos")]),
]


@register("tensorclasses")
@st.composite
def tensorclass_scenarios(draw):
    module = draw(st.booleans())
    ragged = draw(st.booleans())
    body = "read a lazy stack" if ragged else draw(st.sampled_from(sorted(set(BODIES) - {"read a lazy stack"})))
    in_keys, out_keys = (["a"], ["b"]) if ragged else draw(st.sampled_from(MODULE_KEYS))
    steps = draw(st.integers(3, 6))
    src = TEMPLATE.format(
        ragged=ragged,
        n=draw(st.integers(1, 3)),
        batch=draw(st.integers(1, 2)),
        body=BODIES[body],
        module=module,
        in_keys=in_keys,
        out_keys=out_keys,
        hold=draw(st.booleans()),
    )
    options = (("outputs", draw(st.sampled_from(["safe", "clone"]))),)
    # a plain function given a lazy stack of several shapes is refused; everything else is served
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options,
                    refusable=ragged and not module,
                    tags=frozenset({"module" if module else body, "ragged" if ragged else "tensorclass"}))
