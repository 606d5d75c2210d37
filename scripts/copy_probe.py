"""What an input copy costs on the host, through torch and through the CUDA API itself (GPU).

The hand-written floor copies a call's input with ``static.copy_(x)`` (the dispatcher, a
TensorIterator, then ``cudaMemcpyAsync``) and replays the graph. This prints host and wall µs
per call of the copy through torch, through the runtime's ``cudaMemcpyAsync`` and the driver's
``cuMemcpyDtoDAsync`` (ctypes), the pieces such a copy needs, the replay and a ``detach``
(host, median of 7 x 5 000 calls); then, in 15 alternating rounds of 2 000 calls (wall, median),
both floors and graphmodule with its driver copy and with ``copy_`` (``GRAPHMODULE_TORCH_COPY=1``),
default and static outputs: for the tiny graph and the batch-1 policy.

    python scripts/copy_probe.py
"""

import ctypes
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"), ROOT]

import torch  # noqa: E402
from profile_hot_path import per_call  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

from graphmodule import CudaGraphModule  # noqa: E402


def loaded(name: str) -> str:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if name in os.path.basename(path):
                return path
    raise SystemExit(f"{name} is not loaded")


torch.set_grad_enabled(False)  # a policy's calls, as in replay_steps.py
torch.zeros(1, device="cuda")
rt = ctypes.CDLL(loaded("libcudart"))
rt.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
rt.cudaMemcpyAsync.restype = ctypes.c_int
drv = ctypes.CDLL("libcuda.so.1")
drv.cuMemcpyDtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
drv.cuMemcpyDtoDAsync_v2.restype = ctypes.c_int
raw_stream = torch._C._cuda_getCurrentRawStream
memcpy, dtod = rt.cudaMemcpyAsync, drv.cuMemcpyDtoDAsync_v2

for name in ("tiny_fn", "policy_b1"):
    case = WORKLOADS[name](torch.device("cuda"))
    x = case.args[0]
    static = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            case.fn(static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = case.fn(static)
    n = x.numel() * x.element_size()
    dst, src = static.data_ptr(), x.data_ptr()

    def floor():
        static.copy_(x)
        graph.replay()

    def drv_floor():
        dtod(static.data_ptr(), x.data_ptr(), n, raw_stream(0))
        graph.replay()

    rows = [
        ("copy_", lambda: static.copy_(x)),
        ("cudaMemcpyAsync", lambda: memcpy(dst, src, n, 3, raw_stream(0))),
        ("cuMemcpyDtoDAsync", lambda: dtod(dst, src, n, raw_stream(0))),
        ("raw stream", lambda: raw_stream(0)),
        ("data_ptr", x.data_ptr),
        ("replay", graph.replay),
        ("detach", out.detach),
    ]
    assert memcpy(dst, src, n, 3, raw_stream(0)) == 0 and dtod(dst, src, n, raw_stream(0)) == 0
    for label, fn in rows:
        fn()
        print(f"{name:10s} {label:20s} host {per_call(fn, 5000, wait=False):7.2f} us")
    # graphmodule with the driver copy and with copy_ (GRAPHMODULE_TORCH_COPY=1 when built),
    # against both floors, in alternating rounds: wall µs per call, each result dropped
    variants = {"floor": floor, "floor, driver copy": drv_floor}
    for outputs in ("safe", "static"):
        for label, env in (("driver copy", None), ("copy_", "1")):
            if env:
                os.environ["GRAPHMODULE_TORCH_COPY"] = env
            g = CudaGraphModule(case.fn, warmup=2, outputs=outputs)
            for _ in range(4):
                g(x)
            os.environ.pop("GRAPHMODULE_TORCH_COPY", None)
            assert (g._entries[0].inputs._raw is None) == bool(env)
            variants[f"gm {outputs}, {label}"] = (lambda g: lambda: g(x))(g)
    times = {k: [] for k in variants}
    for _ in range(15):
        for k, fn in variants.items():
            times[k].append(per_call(fn, 2000, repeats=1))
    base = statistics.median(times["floor"])
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:10s} {k:24s} wall {m:7.2f} us  {m / base:5.2f}x floor")
    # the raw copy gives the same graph result as the torch copy
    x2 = torch.randn_like(x)
    static.copy_(x2)
    graph.replay()
    want = out.clone()
    static.zero_()
    dtod(static.data_ptr(), x2.data_ptr(), n, raw_stream(0))
    graph.replay()
    torch.cuda.synchronize()
    print(f"{name:10s} same result through the driver copy: {torch.equal(out, want)}")
