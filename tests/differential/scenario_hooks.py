"""Scenarios: module hooks present at capture, added and removed between calls.

A small network may carry torch's old-style ``weight_norm`` (a pure hook, recorded by the
capture) and, from the start or from a drawn step, Python hooks: a forward hook logging the
activation into a list the program reads, one that rescales the output, a pre-hook that
shifts the input; hooks may be removed later. A replay runs no Python: the wrapper must give
the plain results and the plain log, serving the hooks that only compute tensors, and refuse
(its capture's log entry put back) the one that logs.
"""

from hypothesis import strategies as st

from .scenarios import Scenario, register

TEMPLATE = """\
import warnings

EVENTS = {events!r}


def build():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (old-style weight_norm is deprecated)
        first = nn.Linear({n}, {n})
        if {weight_norm}:
            first = torch.nn.utils.weight_norm(first)
    net = nn.Sequential(first, nn.Tanh(), nn.Linear({n}, {n})).to(device)
    return {{"fn": net, "net": net, "log": [], "handles": {{}}, "held": []}}


def hook(world, kind):
    log = world["log"]
    if kind == "log":
        return "register_forward_hook", lambda module, args, out: log.append(out.detach().clone())
    if kind == "rescale":
        return "register_forward_hook", lambda module, args, out: out * 2
    return "register_forward_pre_hook", lambda module, args: (args[0] + 1,)


def step(world, f, i):
    for action, kind, where in EVENTS.get(i, ()):
        handles = world["handles"]
        if action == "add" and (kind, where) not in handles:
            register, fn = hook(world, kind)
            handles[kind, where] = getattr(world["net"][where], register)(fn)
        elif action == "remove" and (kind, where) in handles:
            handles.pop((kind, where)).remove()
    with torch.no_grad():
        out = f(torch.full(({batch}, {n}), 0.25 * i - 0.5, device=device))
    if {hold}:
        world["held"].append(out)
    return out


def observe(world):
    return list(world["log"])
"""

EVENT = st.tuples(st.sampled_from(["add", "remove"]), st.sampled_from(["log", "rescale", "shift"]),
                  st.sampled_from([0, 2]))


@register("hooks")
@st.composite
def hook_scenarios(draw):
    steps = draw(st.integers(3, 7))
    events = draw(st.dictionaries(st.integers(0, steps - 1), st.lists(EVENT, min_size=1, max_size=2), max_size=3))
    src = TEMPLATE.format(
        events=events,
        n=draw(st.integers(1, 3)),
        batch=draw(st.integers(1, 2)),
        weight_norm=draw(st.booleans()),
        hold=draw(st.booleans()),
    )
    options = (("outputs", draw(st.sampled_from(["safe", "clone"]))),
               ("on_stale", draw(st.sampled_from(["raise", "recapture"]))))
    added = any(action == "add" for evs in events.values() for action, _, _ in evs)
    kinds = {f"{action} {kind}" for evs in events.values() for action, kind, _ in evs}
    return Scenario(src=src, steps=steps, warmup=draw(st.integers(1, 2)), options=options,
                    refusable=added, tags=frozenset(kinds))
