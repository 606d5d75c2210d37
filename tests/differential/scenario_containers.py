"""Scenarios: Python scalars inside the lists and dicts a function reads, changed between calls.

The function reads ``cfg["tau"]``, a flag that picks a branch, a nested ``cfg["optim"]["lr"]``
and ``scales[-1]`` from containers it closes over; between steps the program may set a value,
rebind an equal one, append to the list, or remove and restore a key. With
``on_stale="recapture"`` every call must give the plain result; with ``"raise"`` the wrapper
may refuse (before any effect) once something it baked in changed.
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
CHANGES = {changes!r}


def build():
    net = nn.Linear({n}, {n}).to(device)
    cfg = {{"tau": 0.5, "explore": True, "optim": {{"lr": 0.1}}, "name": "a"}}
    scales = [2.0]

    def fn(x):
        y = net(x) * cfg["tau"] + cfg["optim"]["lr"] * scales[-1]
        if cfg["explore"]:
            y = y + 1
        return y.relu() if cfg["name"] == "a" else y

    return {{"fn": fn, "net": net, "cfg": cfg, "scales": scales, "held": []}}


def change(world, what, i):
    cfg, scales = world["cfg"], world["scales"]
    if what == "tau":
        cfg["tau"] = 0.25 * i
    elif what == "equal tau":
        cfg["tau"] = float(repr(cfg["tau"]))
    elif what == "flag":
        cfg["explore"] = not cfg["explore"]
    elif what == "nested":
        cfg["optim"]["lr"] = 0.01 * (i + 1)
    elif what == "name":
        cfg["name"] = "b" if cfg["name"] == "a" else "a"
    elif what == "append":
        scales.append(1.0 + i)
    elif what == "scale":
        scales[0] = -scales[0]
    elif what == "key removed and restored":
        value = cfg.pop("tau")
        cfg["tau"] = value


def step(world, f, i):
    with torch.no_grad():
        out = f(torch.full(({batch}, {n}), 0.25 * i, device=device))
    if {hold}:
        world["held"].append(out)
    for what in CHANGES.get(i, ()):
        change(world, what, i)
    return out


def observe(world):
    return dict(world["cfg"]), list(world["scales"])
"""

KINDS = ("tau", "equal tau", "flag", "nested", "name", "append", "scale", "key removed and restored")


@register("containers")
@st.composite
def container_scenarios(draw):
    steps = draw(st.integers(3, 8))
    at = st.lists(st.sampled_from(KINDS), min_size=1, max_size=2)
    changes = draw(st.dictionaries(st.integers(0, steps - 1), at, max_size=3))
    src = TEMPLATE.format(
        changes=changes,
        n=draw(st.integers(1, 3)),
        batch=draw(st.integers(1, 2)),
        hold=draw(st.booleans()),
    )
    on_stale = draw(st.sampled_from(["raise", "recapture"]))
    options = (("outputs", draw(st.sampled_from(["safe", "clone"]))), ("on_stale", on_stale))
    kinds = {what for whats in changes.values() for what in whats}
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options,
                    refusable=on_stale == "raise", tags=frozenset(kinds))
