"""``CudaGraphModule``: an explicit state machine over warmup, capture and replay.

::

    WARMUP ──(call warmup+1)──► capture ──ok──► CAPTURED (every call: check, copy, replay)
       ▲                           │
       │                           ├─fails, on_capture_failure="raise"──► FAILED (raises, no retry)
       └──────── reset() ──────────┴─fails, on_capture_failure="eager"──► EAGER
                                                           no CUDA ─────► EAGER (checked, eager)
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from tensordict import TensorDictBase
from tensordict.nn import dispatch
from torch import nn

from ._buffers import Effects, OutputPlan, StaticInputs
from ._capture import CAPTURE_ERROR_MODES, CudaRunner, EagerRunner, SimulatedRunner
from ._dispatch import in_keys_for_layout, module_name, resolve_keys, run_with_tensordict_out
from ._errors import CaptureError, GraphStateError, InputMismatchError, Mismatch
from ._spec import InputSpec, refuse_requires_grad
from ._stats import GraphStats
from ._tree import MISSING, Layout, tensor_leaves

__all__ = ["CudaGraphModule"]

_BACKENDS = ("auto", "cuda", "simulate", "eager")
_OUTPUTS = ("clone", "static")
_ON_FAILURE = ("raise", "eager")


class _Captured:
    """Everything one capture produced; replaced as a whole, never patched."""

    __slots__ = ("spec", "inputs", "effects", "outputs", "training")

    def __init__(self, spec, inputs, effects, outputs, training):
        self.spec, self.inputs, self.effects, self.outputs = spec, inputs, effects, outputs
        self.training = training


def _choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {choices} (got {value!r}).")


class CudaGraphModule:
    """Run a function, ``nn.Module`` or TensorDict module as a CUDA graph.

    The first ``warmup`` calls run eagerly on a side stream. The next call captures
    one CUDA graph and replays it; every later call checks its inputs against the
    captured ones (structure, keys, shape, dtype, device, requires_grad, non-tensor
    values), copies them into the graph's buffers with one launch and replays the
    graph on the current stream, without synchronising with the host.

    A drop-in for ``tensordict.nn.CudaGraphModule``: same arguments, same calling
    conventions (tensors, pytrees, TensorDicts, keyword arguments named after
    ``in_keys``, ``tensordict_out=``).

    Args:
        module: the callable to graph.
        warmup: eager calls before the capture (at least 1). Compiled functions need
            enough calls to finish compiling.
        in_keys: input keys, if the callable takes a TensorDict (the module's own
            ``in_keys`` win). ``[]`` marks a function that takes a TensorDict.
        out_keys: output keys of a TensorDict module (the module's own win).
        device: the CUDA device of the graph; defaults to the current device.

    Keyword-only options:
        outputs: ``"clone"`` (default): results are fresh tensors that later calls
            never overwrite. ``"static"``: zero-copy, results are the graph's own
            output buffers, overwritten by the next call; copy what you keep.
        capture_error_mode: passed to CUDA graph capture. ``"thread_local"``
            (default) lets other threads (data-loader pin-memory threads) use CUDA
            during a capture; ``"global"`` and ``"relaxed"`` as in torch.
        on_capture_failure: ``"raise"`` (default): raise a :class:`CaptureError`
            naming the cause, then refuse to run until :meth:`reset`; ``"eager"``:
            warn once and run eagerly from then on.
        backend: ``"auto"`` (CUDA graphs if CUDA is available, else eager with a
            warning), ``"cuda"``, ``"eager"`` (no graphs; every check still runs) or
            ``"simulate"`` (the full capture/replay machinery, with each replay
            re-running the function on the graph's buffers: tests on CPU).

    Example:
        >>> import torch, warnings
        >>> from graphmodule import CudaGraphModule
        >>> device = "cuda" if torch.cuda.is_available() else "cpu"
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # no CUDA: a warning, then eager calls
        ...     g = CudaGraphModule(lambda x, y: x * y + 1)
        >>> x, y = torch.ones(3, device=device), torch.full((3,), 2.0, device=device)
        >>> for _ in range(4):
        ...     out = g(x, y)
        >>> out.tolist()
        [3.0, 3.0, 3.0]
        >>> g(x, y.double())
        Traceback (most recent call last):
          ...
        graphmodule._errors.InputMismatchError: CudaGraphModule(<lambda>) was captured with other inputs than this call's (1 mismatch):
          args[1]: expected dtype torch.float32, got torch.float64
        To fix: copying into the graph's buffer would cast silently: convert the input with .to(dtype) before the call.
    """

    def __init__(
        self,
        module: Callable[..., Any],
        warmup: int = 2,
        in_keys: Any = None,
        out_keys: Any = None,
        device: torch.device | str | int | None = None,
        *,
        outputs: str = "clone",
        capture_error_mode: str = "thread_local",
        on_capture_failure: str = "raise",
        backend: str = "auto",
    ) -> None:
        if not callable(module):
            raise TypeError(f"module must be callable (got {type(module).__name__}).")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup must be an int >= 1 (got {warmup!r}).")
        _choice("outputs", outputs, _OUTPUTS)
        _choice("capture_error_mode", capture_error_mode, CAPTURE_ERROR_MODES)
        _choice("on_capture_failure", on_capture_failure, _ON_FAILURE)
        _choice("backend", backend, _BACKENDS)
        self.module = module
        self.warmup = warmup
        self.in_keys, self.out_keys = resolve_keys(module, in_keys, out_keys)
        self._options = {
            "outputs": outputs,
            "capture_error_mode": capture_error_mode,
            "on_capture_failure": on_capture_failure,
            "backend": backend,
        }
        self._given_device = device
        self._clone = outputs == "clone"
        self._owner = f"CudaGraphModule({module_name(module)})"
        self._is_td = self.in_keys is not None
        self._arg_names = ("tensordict",) if self._is_td else ()
        self._layout_keys = {0: in_keys_for_layout(self.in_keys)} if self._is_td else None
        self._runner = self._make_runner(backend, device, capture_error_mode)
        self.device = getattr(self._runner, "device", None)
        self._stats = GraphStats()
        self._reset_state()

    def _make_runner(self, backend: str, device: Any, capture_error_mode: str):
        has_cuda = torch.cuda.is_available()
        if backend == "auto":
            if not has_cuda:
                warnings.warn(
                    "CudaGraphModule: CUDA is not available, so calls run eagerly (same results, "
                    "no speed-up). Inputs are still checked against the first call after warmup, "
                    "as they would be on a GPU.",
                    UserWarning,
                    stacklevel=3,
                )
                return EagerRunner()
            backend = "cuda"
        if backend == "eager":
            return EagerRunner()
        if backend == "simulate":
            return SimulatedRunner()
        if not has_cuda:
            raise RuntimeError(
                "CudaGraphModule(backend='cuda') needs CUDA, but torch.cuda.is_available() is "
                "False; use backend='auto' to run eagerly without CUDA."
            )
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"device must be a CUDA device (got {device}).")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return CudaRunner(device, capture_error_mode)

    def _reset_state(self) -> None:
        self._captured: _Captured | None = None
        self._eager_spec: InputSpec | None = None
        self._eager_training: bool | None = None
        self._failure: CaptureError | None = None
        self._warmed = 0

    # -- public surface ----------------------------------------------------------------
    @property
    def state(self) -> str:
        """``"warmup"``, ``"captured"``, ``"eager"`` or ``"failed"``."""
        if self._captured is not None:
            return "captured"
        if self._failure is not None:
            return "failed"
        if self._eager_spec is not None:
            return "eager"
        return "warmup"

    @property
    def stats(self) -> GraphStats:
        """A snapshot of the counters (see :class:`GraphStats`)."""
        return self._stats.copy()

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        """The captured ``torch.cuda.CUDAGraph``, if any."""
        return getattr(self._runner, "graph", None)

    def explain(self) -> str:
        """The state and, once captured, the input signature every call must match."""
        lines = [f"{self._owner}: state {self.state}, {self._stats}"]
        spec = self._captured.spec if self._captured is not None else self._eager_spec
        if spec is not None:
            lines.append("captured inputs:")
            lines += ["  " + line for line in spec.describe().splitlines()]
        if self._failure is not None:
            lines.append(f"capture failed: {self._failure}")
        return "\n".join(lines)

    def reset(self) -> None:
        """Drop the graph; the next calls warm up and capture again."""
        self._runner.release()
        self._reset_state()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict:
        """The wrapped module's ``state_dict`` (``{}`` if it has none)."""
        fn = getattr(self.module, "state_dict", None)
        return fn(*args, **kwargs) if fn is not None else {}

    def load_state_dict(self, state_dict: dict, *args: Any, **kwargs: Any) -> Any:
        """Load into the wrapped module; in-place, so a captured graph sees the new values."""
        fn = getattr(self.module, "load_state_dict", None)
        return fn(state_dict, *args, **kwargs) if fn is not None else None

    def __repr__(self) -> str:
        parts = [
            repr(self.module),
            f"warmup={self.warmup}",
            f"in_keys={self.in_keys!r}",
            f"out_keys={self.out_keys!r}",
            f"device={self._given_device!r}",
        ]
        defaults = {"outputs": "clone", "capture_error_mode": "thread_local",
                    "on_capture_failure": "raise", "backend": "auto"}
        parts += [f"{k}={v!r}" for k, v in self._options.items() if defaults[k] != v]
        return f"CudaGraphModule({', '.join(parts)})"

    # -- calls -------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._is_td and (kwargs or not args or not isinstance(args[0], TensorDictBase)):
            # keyword calls and tensordict_out go through tensordict's dispatch; a
            # TensorDict call is passed on unchanged by it, so it skips the wrapper
            return self._call_td(*args, **kwargs)
        return self._run(args, kwargs)

    @dispatch(source="in_keys", dest="out_keys", auto_batch_size=False)
    def _call_td(self, tensordict, *args: Any, tensordict_out=None, **kwargs: Any) -> Any:
        if tensordict_out is not None:
            return run_with_tensordict_out(
                lambda td, a, k: self._run((td, *a), k), tensordict, tensordict_out, args, kwargs
            )
        return self._run((tensordict, *args), kwargs)

    def _run(self, args: tuple, kwargs: dict) -> Any:
        captured = self._captured
        if captured is None:
            return self._run_uncaptured(args, kwargs)
        try:
            leaves, tds = captured.spec.split(args, kwargs)
            if captured.training is not None and self.module.training is not captured.training:
                self._raise_mode(captured.training)
        except InputMismatchError:
            self._stats.input_mismatches += 1
            raise
        captured.inputs.copy_from(leaves)
        self._runner.replay()
        self._stats.replays += 1
        if captured.effects.any:
            captured.effects.apply(leaves, tds, self._clone)
        return captured.outputs.build(leaves, tds)

    def _run_uncaptured(self, args: tuple, kwargs: dict) -> Any:
        module = self.module
        if self._failure is not None:
            raise GraphStateError(
                f"{self._owner} failed to capture its graph earlier and does not retry: "
                f"{str(self._failure).splitlines()[0]}\nFix the cause, then call reset() to "
                "warm up and capture again, or pass on_capture_failure='eager'."
            ) from self._failure
        if self._eager_spec is not None:  # no CUDA, or a failed capture: checked, eager
            try:
                self._eager_spec.split(args, kwargs)
                if self._eager_training is not None and module.training is not self._eager_training:
                    self._raise_mode(self._eager_training)
            except InputMismatchError:
                self._stats.input_mismatches += 1
                raise
            self._stats.eager_calls += 1
            return module(*args, **kwargs)
        if self._warmed < self.warmup:
            self._refuse_grad((args, kwargs))
            self._warmed += 1
            self._stats.warmup_calls += 1
            return self._runner.run_eager(lambda: module(*args, **kwargs))
        return self._capture(args, kwargs)

    def _capture(self, args: tuple, kwargs: dict) -> Any:
        module, tree = self.module, (args, kwargs)
        layout, split = Layout.capture(tree, self._layout_keys)
        if split is None:  # a TensorDict lacks some of the module's in_keys
            self._stats.input_mismatches += 1
            raise InputMismatchError(self._owner, self._missing_in_keys(layout, tree), "called")
        leaves, tds = split
        paths = layout.leaf_paths(self._arg_names)
        refuse_requires_grad(self._owner, leaves, paths)
        self._check_devices(leaves, paths)
        spec = InputSpec(self._owner, layout, leaves, self._arg_names)
        training = module.training if isinstance(module, nn.Module) else None
        if not self._runner.captures:
            self._eager_spec, self._eager_training = spec, training
            self._stats.eager_calls += 1
            return module(*args, **kwargs)

        inputs = StaticInputs(layout, leaves, {p: td.device for p, td in tds.items()})
        versions = inputs.versions()

        def body():
            (m_args, m_kwargs), passed = inputs.materialize()
            return module(*m_args, **m_kwargs), passed

        try:
            out, passed = self._runner.capture(body, self._owner)
        except CaptureError as err:
            self._stats.capture_failures += 1
            if self._options["on_capture_failure"] == "raise":
                self._failure = err
                raise
            warnings.warn(
                f"{err}\n{self._owner} runs eagerly from now on (on_capture_failure='eager').",
                UserWarning,
                stacklevel=3,
            )
            self._eager_spec, self._eager_training = spec, training
            self._stats.eager_calls += 1
            return self._runner.run_eager(lambda: module(*args, **kwargs))
        self._stats.captures += 1
        self._stats.capture_seconds = self._runner.capture_seconds
        captured = _Captured(
            spec,
            inputs,
            Effects(inputs, versions, passed),
            OutputPlan(out, inputs, passed, self._clone),
            training,
        )
        self._captured = captured
        if isinstance(self._runner, CudaRunner):  # a capture records; it does not run
            self._runner.replay()
        self._stats.replays += 1
        if captured.effects.any:
            captured.effects.apply(leaves, tds, self._clone)
        return captured.outputs.build(leaves, tds)

    # -- checks outside the replay's fast path -------------------------------------------
    def _refuse_grad(self, tree: Any) -> None:
        if any(t.requires_grad for t in tensor_leaves(tree)):
            layout, split = Layout.capture(tree, None)
            refuse_requires_grad(self._owner, split[0], layout.leaf_paths(self._arg_names))

    def _check_devices(self, leaves: list, paths: list[str]) -> None:
        device = self.device
        if device is None:
            return
        found = [
            Mismatch(path, "device", str(device), str(leaf.device))
            for leaf, path in zip(leaves, paths)
            if isinstance(leaf, torch.Tensor) and leaf.device != device
        ]
        if found:
            raise InputMismatchError(self._owner, found, "asked to capture on " + str(device))

    def _missing_in_keys(self, layout: Layout, tree: Any) -> list[Mismatch]:
        leaves, found = layout.loose_leaves(tree, self._arg_names)
        paths = layout.leaf_paths(self._arg_names)
        return found + [
            Mismatch(path, "missing", "an entry (it is in the module's in_keys)", "nothing")
            for leaf, path in zip(leaves, paths)
            if leaf is MISSING
        ]

    def _raise_mode(self, captured_training: bool) -> None:
        names = {True: "train mode", False: "eval mode"}
        raise InputMismatchError(
            self._owner,
            [Mismatch("module.training", "mode", names[captured_training], names[not captured_training])],
        )
