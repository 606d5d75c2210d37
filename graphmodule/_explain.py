"""Why a call does not match its capture: the cold path, run only after ``match`` failed.

Walks the call next to the captured :class:`~graphmodule._spec.InputSpec` and lists
every difference at once, each with its key path (``kwargs['obs']``,
``tensordict['agent', 'obs']``). A test keeps this walk and the fast ``match`` in
agreement: a call ``match`` refuses has at least one mismatch here, and a call it
accepts has none.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from tensordict import TensorDictBase, is_tensorclass

from ._errors import WITHOUT_GRAPH, InputMismatchError, Mismatch, MismatchKind, MissingKeyError, RequiresGradError
from ._paths import describe, format_key, format_path, leaf_texts
from ._slots import MISSING, Node, Slot, _is_non_tensor, child_td
from ._spec import InputSpec, TensorFacts, captured, same_constant
from ._tree import flatten_with_path, is_slot_value

__all__ = ["describe_facts", "describe_graphs", "describe_spec", "explain_mismatches", "mismatch_error"]


def describe_facts(f: TensorFacts) -> str:
    extra = "" if f.layout is torch.strided else f", {f.layout}"
    return f"a tensor of shape {tuple(f.shape)}, {f.dtype} on {f.device}{extra}"


def describe_spec(spec: InputSpec, arg_names: Sequence[str] = ()) -> str:
    """The captured signature, one input per line."""
    facts_at = dict(zip(spec.tensor_index, spec.facts))
    consts_at = dict(zip(spec.const_index, spec.constants))
    lines = []
    for i, text in enumerate(leaf_texts(spec.layout.leaf_paths(), arg_names)):
        if i in facts_at:
            lines.append(f"{text}: {describe_facts(facts_at[i])}")
        else:
            lines.append(f"{text}: constant {describe(consts_at[i])}")
    return "\n".join(lines)


def describe_graphs(entries: list, arg_names: Sequence[str] = ()) -> list[str]:
    """``explain()``'s lines for each graph (most recently used first): its inputs, its
    backward graph (a layer), where its results come from. A signature served without a
    graph (``EagerEntry``) says so."""
    lines: list[str] = []
    for n, entry in enumerate(entries):
        if entry.when == WITHOUT_GRAPH:
            title = f"inputs, {entry.when}:" if len(entries) == 1 else f"{entry.noun} {n} inputs:"
        else:
            title = "captured inputs:" if len(entries) == 1 else f"{entry.noun} {n} inputs:"
        lines.append(title)
        lines += ["  " + line for line in describe_spec(entry.spec, arg_names).splitlines()]
        if entry.layer is not None:
            lines.append("  " + entry.layer.describe())
        if entry.outputs is not None:
            lines.append("  " + entry.outputs.describe())
    return lines


def _order_mismatches(captured: list[tuple], got: list[tuple], arg_names) -> list[Mismatch]:
    """Containers holding the same keys in another order (a dict iterated by the function)."""
    def children(paths):
        out: dict[tuple, list] = {}
        for path in paths:
            for depth in range(1, len(path)):
                parent, child = path[:depth], path[depth]
                names = out.setdefault(parent, [])
                if child not in names:
                    names.append(child)
        return out

    want, have = children(captured), children(got)
    found = []
    for parent, names in want.items():
        other = have.get(parent)
        if other is not None and set(other) == set(names) and other != names:
            found.append(Mismatch(format_path(parent, arg_names), MismatchKind.ORDER, repr(names), repr(other)))
    return found


def _structure(spec: InputSpec, tree: Any, arg_names) -> tuple[dict, list[Mismatch]]:
    """The call's optree leaves by path, and the container-level mismatches."""
    layout = spec.layout
    paths, outer, treespec = flatten_with_path(tree)
    by_path = dict(zip(map(tuple, paths), outer))
    captured = {path: position for position, path in enumerate(layout.paths)}
    found: list[Mismatch] = []
    for path, position in captured.items():
        if path not in by_path:
            found.append(Mismatch(format_path(path, arg_names), MismatchKind.MISSING, describe(layout.outer[position]),
                                  "nothing"))
    for path, value in by_path.items():
        if path not in captured:
            found.append(Mismatch(format_path(path, arg_names), MismatchKind.EXTRA, "", describe(value)))
    if not found:
        found += _order_mismatches(layout.paths, [tuple(p) for p in paths], arg_names)
    if not found and treespec != layout.treespec:
        found.append(Mismatch("inputs", MismatchKind.STRUCTURE, _spec_text(layout.treespec), _spec_text(treespec)))
    return by_path, found


def _spec_text(treespec: Any) -> str:
    text = str(treespec)
    if text.startswith("PyTreeSpec("):
        text = text[len("PyTreeSpec(") : -1]
    return text.replace(", namespace='graphmodule'", "")


def _node_values(node: Node, td: TensorDictBase, text: str, prefix: tuple, found: list, out: list) -> None:
    """Append the values at ``node``'s leaves (``MISSING`` where absent) and note differences."""
    here = f"{text}[{format_key(prefix)}]" if prefix else text
    if prefix and td.batch_size != node.batch_size:
        found.append(Mismatch(here, MismatchKind.BATCH_SIZE, str(tuple(node.batch_size)), str(tuple(td.batch_size))))
    names = list(td.keys())
    if node.exact:
        extra = [name for name in names if name not in node.keys]
        for name in extra:
            found.append(Mismatch(f"{text}[{format_key(prefix + (name,))}]", MismatchKind.EXTRA, "",
                                  describe(td.get(name))))
        if not extra and set(names) == set(node.keys) and tuple(names) != node.keys:
            found.append(Mismatch(here, MismatchKind.ORDER, repr(list(node.keys)), repr(names)))
        for name in node.keys:
            child = dict(node.entries)[name]
            if name not in names and type(child) is not int and not child.leaf_keys():
                found.append(Mismatch(f"{text}[{format_key(prefix + (name,))}]", MismatchKind.MISSING,
                                      "an empty TensorDict", "nothing"))
    for name, child in node.entries:
        value = td.get(name, MISSING)
        if type(child) is int:
            if value is not MISSING and _is_non_tensor(value):
                value = td[name]
            out.append(value)
        elif value is MISSING or child_td(child, value) is None:  # (a tensorclass: of its class)
            if value is not MISSING:
                expected = child.tc.__name__ if child.tc is not None else "a TensorDict"
                found.append(Mismatch(f"{text}[{format_key(prefix + (name,))}]", MismatchKind.TYPE, expected,
                                      describe(value)))
            out += [MISSING] * len(child.leaf_keys())
        else:
            _node_values(child, child_td(child, value), text, prefix + (name,), found, out)


def _slot_values(slot: Slot, obj: Any, text: str) -> tuple[list, list[Mismatch]]:
    found: list[Mismatch] = []
    if not is_slot_value(obj):
        found.append(Mismatch(text, MismatchKind.TYPE, f"a {slot.cls.__name__}", describe(obj)))
        return [MISSING] * len(slot.keys), found
    if type(obj) is not slot.cls and (slot.exact or slot.is_tc or is_tensorclass(obj)):
        found.append(Mismatch(text, MismatchKind.TYPE, slot.cls.__name__, type(obj).__name__))
    if is_tensorclass(obj) and slot.is_tc and dict(obj._non_tensordict) != slot.tc_extra:
        found.append(Mismatch(text, MismatchKind.VALUE, repr(slot.tc_extra), repr(dict(obj._non_tensordict))))
    td = obj._tensordict if is_tensorclass(obj) else obj
    if td.batch_size != slot.batch_size:
        compat = (f"CudaGraphModule was captured with batch_size={slot.batch_size} but got "
                  f"batch_size={td.batch_size}. CUDA graphs replay fixed shapes.")
        found.append(Mismatch(text, MismatchKind.BATCH_SIZE, str(tuple(slot.batch_size)), str(tuple(td.batch_size)),
                              compat))
    if isinstance(td, TensorDictBase) and td.is_locked != slot.locked:
        found.append(Mismatch(text, MismatchKind.VALUE,
                              "a locked TensorDict" if slot.locked else "an unlocked TensorDict",
                              "a locked one" if td.is_locked else "an unlocked one"))
    out: list = []
    _node_values(slot.root, td, text, (), found, out)
    return out, found


def _tensor_mismatches(path: str, f: TensorFacts, leaf: Any, key: tuple | None = None) -> list[Mismatch]:
    """What differs between a tensor leaf and the captured facts ``f``."""
    if not isinstance(leaf, torch.Tensor):
        return [Mismatch(path, MismatchKind.TYPE, "a tensor", describe(leaf))]
    found = []
    if leaf.shape != f.shape:
        if key is None:
            compat = f"CudaGraphModule was captured with an input of shape {f.shape} but got shape {leaf.shape}."
        else:
            name = key[0] if len(key) == 1 else key
            compat = (f"CudaGraphModule was captured with the entry {name!r} of shape {f.shape} but got shape "
                      f"{leaf.shape}.")
        compat += " CUDA graphs replay fixed shapes."
        found.append(Mismatch(path, MismatchKind.SHAPE, str(tuple(f.shape)), str(tuple(leaf.shape)), compat))
    for kind, captured_fact, now in (
        (MismatchKind.DTYPE, f.dtype, leaf.dtype),
        (MismatchKind.DEVICE, f.device, leaf.device),
        (MismatchKind.LAYOUT, f.layout, leaf.layout),
        (MismatchKind.REQUIRES_GRAD, f.requires_grad, leaf.requires_grad),
    ):
        if now != captured_fact:
            found.append(Mismatch(path, kind, str(captured_fact), str(now)))
    return found


def explain_mismatches(spec: InputSpec, tree: Any, arg_names: Sequence[str] = ()) -> list[Mismatch]:
    """Every difference between the call ``tree`` (``(args, kwargs)``) and the capture."""
    by_path, found = _structure(spec, tree, arg_names)
    layout = spec.layout
    leaves: list = []
    for position, path in enumerate(layout.paths):
        value = by_path.get(path, MISSING)
        slot = layout.slot_at.get(position)
        if slot is None:
            if value is not MISSING and is_slot_value(value):
                found.append(Mismatch(format_path(path, arg_names), MismatchKind.TYPE, describe(layout.outer[position]),
                                      describe(value)))
                value = MISSING
            leaves.append(value)
        elif value is MISSING:
            leaves += [MISSING] * len(slot.keys)
        else:
            values, slot_found = _slot_values(slot, value, format_path(path, arg_names))
            found += slot_found
            leaves += values
    facts_at = dict(zip(spec.tensor_index, spec.facts))
    consts_at = dict(zip(spec.const_index, spec.constants))
    keys = [key for _, key in layout.leaf_paths()]
    missing_keys: list = []
    for i, (leaf, text) in enumerate(zip(leaves, leaf_texts(spec.layout.leaf_paths(), arg_names))):
        if leaf is MISSING:
            if any(m.path == text for m in found) or _under_missing(text, found):
                continue
            expected = describe_facts(facts_at[i]) if i in facts_at else describe(consts_at[i])
            found.append(Mismatch(text, MismatchKind.MISSING, expected, "nothing"))
            if keys[i] is not None:
                missing_keys.append(keys[i][0] if len(keys[i]) == 1 else keys[i])
        elif i in facts_at:
            found += _tensor_mismatches(text, facts_at[i], leaf, keys[i])
        elif not same_constant(leaf, consts_at[i]):
            other_type = isinstance(leaf, torch.Tensor) or type(leaf) is not type(captured(consts_at[i]))
            kind = MismatchKind.TYPE if other_type else MismatchKind.VALUE
            compat = "Varying inputs must be torch.Tensor subclasses." if kind is MismatchKind.VALUE else None
            found.append(Mismatch(text, kind, describe(consts_at[i]), describe(leaf), compat))
    if missing_keys:
        compat = f"CudaGraphModule input is missing the in_keys {missing_keys} that the captured graph reads."
        found = [Mismatch(m.path, m.kind, m.expected, m.got, compat) if m.kind is MismatchKind.MISSING else m
                 for m in found]
    return found


def _under_missing(text: str, found: list[Mismatch]) -> bool:
    return any(m.kind in (MismatchKind.MISSING, MismatchKind.TYPE) and text.startswith(m.path + "[") for m in found)


def mismatch_error(owner: str, spec: InputSpec, tree: Any, arg_names: Sequence[str], modes: list[Mismatch],
                   tensordict_module: bool, when: str = "captured", built: bool = False) -> InputMismatchError:
    """The error for a call that does not match, of the class a user would catch; ``modes``:
    what differs in the modes (``ModeReader.mismatches``); ``when``: where the signature
    comes from (``Entry.when``); ``built``: the first argument is a TensorDict dispatch built
    from keywords, whose batch size the caller did not choose (not reported)."""
    found = explain_mismatches(spec, tree, arg_names) + modes
    if built:
        found = [m for m in found if not (m.kind is MismatchKind.BATCH_SIZE and m.path == arg_names[0])] or found
    if not found:  # the fast and slow readers disagree: a bug, but never a silent replay
        found = [Mismatch("inputs", MismatchKind.STRUCTURE, "the captured call", "a call that does not match it")]
    if all(m.kind is MismatchKind.REQUIRES_GRAD for m in found):
        return RequiresGradError(owner, found, when)
    if tensordict_module and all(m.kind is MismatchKind.MISSING and "[" in m.path for m in found):
        return MissingKeyError(owner, found, when)
    return InputMismatchError(owner, found, when)
