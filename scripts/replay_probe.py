import time, torch
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)).cuda()
x = torch.randn(32, 64, device="cuda")
def cap(pool, mode):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2): net(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.no_grad():
        g.capture_begin(pool=pool, capture_error_mode=mode) if pool is not None else g.capture_begin(capture_error_mode=mode)
        net(x)
        g.capture_end()
    torch.cuda.synchronize()
    return g
def time_replay(g, n=3000):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): g.replay()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6
variants = {
    "default pool, global": (None, "global"),
    "default pool, thread_local": (None, "thread_local"),
    "graph_pool_handle, thread_local": (torch.cuda.graph_pool_handle(), "thread_local"),
    "MemPool.id, thread_local": (torch.cuda.MemPool().id, "thread_local"),
    "MemPool.id, global": (torch.cuda.MemPool().id, "global"),
}
graphs = {k: cap(*v) for k, v in variants.items()}
for rnd in range(3):
    for k, g in graphs.items():
        host, wall = time_replay(g)
        print(f"round {rnd} {k:36s} host {host:6.1f} us  wall {wall:6.1f} us")
