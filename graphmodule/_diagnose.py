"""Why a capture failed: the likely cause of a CUDA graph capture error, in words.

CUDA reports most capture failures as one of a few generic errors ("operation not
permitted when stream is capturing"). The text of the error, the frames it went
through and the user's own line usually tell the cause apart: a host sync such as
``.item()``, a boolean mask, ``torch.distributions`` argument validation, an optimizer
without ``capturable=True``, a CPU-to-GPU copy, a library initialising itself...
"""

from __future__ import annotations

import os
import traceback

from ._errors import CaptureError

__all__ = ["diagnose", "USER_ERROR"]

USER_ERROR = "error-in-function"
# (markers in the error text, short cause, what to do)
_CAUSES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("nonzero", "masked_select", "_unique"),
        "data-dependent-shape",
        "torch.nonzero (and boolean-mask indexing, masked_select, unique) return a shape that "
        "depends on the data, which a graph cannot replay and which needs the host to wait for the "
        "GPU. Use torch.where(mask, x, 0), or multiply by the mask, or gather a fixed number of items.",
    ),
    (
        ("capturable is False", "capturable=False", "capturable=True"),
        "optimizer-not-capturable",
        "the optimizer steps inside the graph but was created without capturable=True. "
        "Create it with capturable=True, e.g. torch.optim.Adam(params, lr=1e-3, capturable=True).",
    ),
    (
        ("not permitted when stream is capturing", "cudaErrorStreamCaptureUnsupported",
         "cudaStreamSynchronize", "synchronize"),
        "host-sync",
        "the function waits for the GPU during capture (.item(), .cpu(), .tolist(), print of a "
        "tensor, `if tensor:`, torch.nonzero or boolean-mask indexing). Keep values on the GPU "
        "(torch.where instead of `if`), or move the synchronising line out of the wrapped function.",
    ),
    (
        ("Cannot copy between CPU and CUDA", "unless the CPU tensor is pinned"),
        "cpu-to-gpu-copy",
        "a CPU tensor is copied to the GPU inside the function (torch.tensor(...) or .to('cuda') "
        "of CPU data). The graph would bake that data in: create the tensor on the GPU outside "
        "the function and pass it as an input.",
    ),
    (
        ("legacy stream depend on a capturing blocking stream", "cudaErrorStreamCaptureImplicit",
         "cudaErrorStreamCaptureIsolation", "cudaErrorStreamCaptureUnjoined", "cudaErrorStreamCaptureMerge"),
        "cross-stream",
        "work ran on a stream other than the capture stream: usually a CPU-to-GPU copy or "
        "tensor creation from Python data inside the function, or work on a stream not forked "
        "from the current one. Create GPU tensors outside the function and pass them in.",
    ),
    (
        ("current_seed", "philox_cuda_state", "manual_seed", "get_rng_state", "set_rng_state"),
        "rng-state",
        "the random generator's seed or state was read or set during capture (torch.manual_seed, "
        "activation checkpointing, or torch.compile recompiling inside the graph). Move seeding "
        "out of the function; for compiled functions, raise `warmup` so compilation ends before capture.",
    ),
    (
        ("CUBLAS_STATUS", "CUDNN_STATUS", "cuBLAS", "cuDNN", "cusolver", "CUFFT"),
        "lazy-init",
        "a CUDA library initialised itself during capture. Raise `warmup` so that the eager "
        "calls before capture initialise it.",
    ),
    (
        ("torch._dynamo", "Dynamo", "inductor", "Recompil", "recompil"),
        "compile",
        "torch.compile was still compiling during capture. Raise `warmup` until no recompile "
        "happens (TORCH_LOGS=recompiles lists them).",
    ),
    (
        ("out of memory",),
        "out-of-memory",
        "the GPU ran out of memory while capturing. Free memory, reduce the batch, or share "
        "one pool between graphs.",
    ),
    (
        ("cudaErrorStreamCaptureInvalidated", "previous error during capture", "Invalid capture"),
        "capture-invalidated",
        "an operation inside the function broke the capture without raising where it ran; "
        "typical culprits are host synchronisations and copies between CPU and GPU. Run the "
        "function with torch.cuda.set_sync_debug_mode('error') to find it.",
    ),
)

_INTERNAL = (
    os.sep + os.path.join("torch", ""),
    os.sep + os.path.join("tensordict", ""),
    os.sep + os.path.join("graphmodule", ""),
)


def _user_frame(exc: BaseException) -> str | None:
    """``file:line in func`` of the innermost frame outside torch/tensordict/graphmodule."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if not any(part in frame.filename for part in _INTERNAL):
            line = f" `{frame.line.strip()}`" if frame.line else ""
            return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}{line}"
    return None


def _frames(exc: BaseException) -> list:
    return traceback.extract_tb(exc.__traceback__)


def _in_distributions(exc: BaseException) -> bool:
    return any(os.sep + "distributions" + os.sep in f.filename for f in _frames(exc))


def _refine_host_sync(exc: BaseException) -> str | None:
    """A more precise hint for a host sync, from the frames and the user's line."""
    if _in_distributions(exc) and any("torch.normal(" in (f.line or "") for f in _frames(exc)):
        return (
            "Normal.sample() calls torch.normal, which checks on the host that every std is >= 0. "
            "Use dist.rsample() (loc + scale * randn: the same distribution, no check), under "
            "torch.no_grad() if no gradient is needed."
        )
    if _in_distributions(exc):
        return (
            "torch.distributions validates its arguments, which reads tensor values on the host. "
            "Create the distribution with validate_args=False, or call "
            "torch.distributions.Distribution.set_default_validate_args(False) once."
        )
    where = _user_frame(exc) or ""
    line = where.split("`")[1] if "`" in where else ""
    if ".item()" in line or ".tolist()" in line or ".cpu()" in line:
        return (
            "the function reads a value on the host (`.item()`, `.tolist()`, `.cpu()`), which waits "
            "for the GPU. Keep the value on the GPU (return the tensor, use torch.where instead of `if`)."
        )
    if "nonzero" in line or "masked_select" in line or "unique" in line:
        return (
            "torch.nonzero (and masked_select, unique, boolean-mask indexing) return a data-dependent "
            "shape, which needs the host to wait for the GPU. Use torch.where(mask, x, 0) or a "
            "fixed-size gather instead."
        )
    if "[" in line and "mask" in line:
        return (
            "indexing with a boolean mask gives a data-dependent shape, which needs the host to wait "
            "for the GPU. Use torch.where(mask, x, 0) or multiply by the mask instead."
        )
    return None


def diagnose(owner: str, original: BaseException, end_error: BaseException | None = None) -> CaptureError:
    """The :class:`CaptureError` naming the likely cause of a failed capture.

    Its ``cause`` is :data:`USER_ERROR` when nothing points at the capture: the
    function raised as it would have eagerly.
    """
    texts = [f"{type(original).__name__}: {original}"]
    if end_error is not None and end_error is not original:
        texts.append(str(end_error))
    text = "\n".join(texts)
    for markers, cause, hint in _CAUSES:
        if any(marker in text for marker in markers):
            if cause in ("host-sync", "capture-invalidated"):
                hint = _refine_host_sync(original) or hint
            if cause == "cpu-to-gpu-copy" and _in_distributions(original):
                hint = (
                    "torch.distributions turns Python numbers into tensors on the CPU and copies "
                    "them to the GPU: pass tensors on the GPU instead (e.g. Normal(loc, "
                    "torch.ones_like(loc)) rather than Normal(loc, 1.0))."
                )
            return CaptureError(owner, cause, hint, original, _user_frame(original))
    return CaptureError(
        owner,
        USER_ERROR,
        "the wrapped function raised while it was captured; the error above comes from it.",
        original,
        _user_frame(original),
    )
