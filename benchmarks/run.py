"""The benchmarks in one command: the side-by-side table and the real programs' A/B.

On a machine with a CUDA GPU:

    python benchmarks/run.py --out benchmarks/results/DATE-GPU      # everything (some 10 minutes)
    python benchmarks/run.py --out DIR --only side-by-side -k policy # one part, some workloads
    python benchmarks/report.py                                      # RESULTS.md from benchmarks/results/

1. *Side by side* (``side_by_side.py``): one call of each workload (a tiny function, an MLP
   policy, TensorDict modules, a SAC update, a large batch) run eagerly, by the hand-written
   ``torch.cuda.graph`` copy+replay loop (the floor), by tensordict's ``CudaGraphModule``, by
   ``torch.compile(mode="reduce-overhead")`` and by graphmodule; pytest-benchmark medians.
2. *Programs* (``programs.py --interleaved``): TD3, SAC and PPO training loops, each run with
   graphmodule and tensordict's wrapper around every wrapped function, switched every
   ``--interleaved`` iterations; ``--runs`` runs per program.
3. *Capture cost* (``capture.py``): the time of each kind of capture, and the memory of 1, 4
   and 16 graphs in one pool against one pool each.

Each part prints its table and writes its raw file under ``--out`` (``environment.json``,
``side_by_side.json``, ``programs.md``, ``capture.json``): the files ``report.py`` reads.
``--smoke`` runs every part at tiny sizes (no GPU needed; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from report import describe, programs_table, program_rows  # noqa: E402  (no torch imported here)

PARTS = ("side-by-side", "programs", "capture")
ENVIRONMENT = r"""
import json, sys, time, optree, tensordict, torch
cuda = torch.cuda.is_available()
print(json.dumps({"date": time.strftime("%Y-%m-%d", time.gmtime()),
                  "gpu": torch.cuda.get_device_name() if cuda else "no CUDA (CPU)",
                  "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                  "tensordict": tensordict.__version__, "optree": optree.__version__}))
"""


def environment(out: str) -> dict:
    """The device and versions, read in a child process (this one never touches the GPU)."""
    env = json.loads(subprocess.run([sys.executable, "-c", ENVIRONMENT], check=True, capture_output=True,
                                    text=True).stdout)
    with open(os.path.join(out, "environment.json"), "w") as f:
        json.dump(env, f, indent=1)
    return env


def side_by_side(out: str, expr: str | None, smoke: bool) -> bool:
    from side_by_side import markdown, measure

    if smoke:
        os.environ.setdefault("GRAPHMODULE_BENCH_CALLS", "2")
        os.environ.setdefault("GRAPHMODULE_BENCH_ROUNDS", "1")
    results = measure(out, expr)
    if not results:
        print("side by side: no result (see pytest's output above)")
        return False
    print("\nOne call, side by side (µs per call, median; in brackets x the floor):\n" + markdown(results))
    return True


def programs(out: str, names: str, runs: int, block: int, smoke: bool, timeout: float) -> bool:
    """``runs`` interleaved runs of ``programs.py``; their rows appended to ``out/programs.md``."""
    rows: list[str] = []
    header: list[str] = []
    ok = True
    for run in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, os.path.join(HERE, "programs.py"), "--interleaved", str(block),
                   "--programs", names, "--out", tmp, "--timeout", str(timeout)] + (["--smoke"] if smoke else [])
            print(f"programs: run {run + 1} of {runs}", flush=True)
            ok = subprocess.run(cmd, check=False).returncode == 0 and ok
            path = os.path.join(tmp, "interleaved.md")
            if os.path.exists(path):
                with open(path) as f:
                    lines = f.read().splitlines()
                header, rows = lines[:2], rows + [line for line in lines[2:] if line.startswith("| ")]
    if not rows:
        return False
    with open(os.path.join(out, "programs.md"), "w") as f:
        f.write("\n".join(header + rows) + "\n")
    print("\nReal programs, graphmodule's steps/s over tensordict's wrapper's:\n"
          + programs_table(program_rows(os.path.join(out, "programs.md"))))
    return ok


def capture(out: str, smoke: bool) -> bool:
    cmd = [sys.executable, os.path.join(HERE, "capture.py"), "--out", out] + (["--smoke"] if smoke else [])
    return subprocess.run(cmd, check=False).returncode == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the raw files (one measurement)")
    parser.add_argument("--only", choices=PARTS, action="append", help="run this part only (repeatable)")
    parser.add_argument("-k", dest="expr", help="side by side: a pytest -k expression selecting workloads")
    parser.add_argument("--programs", default="td3,sac,ppo_tdmodule", help="programs: comma-separated (programs.py)")
    parser.add_argument("--runs", type=int, default=3, help="programs: interleaved runs per program (default 3)")
    parser.add_argument("--interleaved", type=int, default=20, metavar="K",
                        help="programs: iterations per block before switching wrappers (default 20)")
    parser.add_argument("--timeout", type=float, default=300, help="programs: seconds a run may take (default 300)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks that it runs, anywhere")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    env = environment(args.out)
    print(f"{describe(env)}; raw files in {args.out}", flush=True)
    if env["gpu"].startswith("no CUDA") and not args.smoke:
        print("No CUDA GPU here: the floor, tensordict's wrapper and torch.compile's CUDA graphs need one. "
              "Run on a machine with a CUDA GPU (or pass --smoke to check that the benchmarks run).")
        return 1
    parts = args.only or PARTS
    ok = True
    if "side-by-side" in parts:
        ok = side_by_side(args.out, args.expr, args.smoke) and ok
    if "programs" in parts:
        # smoke runs are a few iterations long: blocks of 2 so that both wrappers get some
        ok = programs(args.out, args.programs, 1 if args.smoke else args.runs, 2 if args.smoke else args.interleaved,
                      args.smoke, args.timeout) and ok
    if "capture" in parts:
        ok = capture(args.out, args.smoke) and ok
    print(f"\nraw files in {args.out}; RESULTS.md from them: python benchmarks/report.py "
          f"(after moving the folder under benchmarks/results/)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
