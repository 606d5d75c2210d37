"""Run the benchmark suite and print one side-by-side table (medians, ratios to the floor).

Usage: python benchmarks/compare.py --out DIR [-k EXPR]
Writes DIR/bench.json (pytest-benchmark's raw output), DIR/results.json (per-call
medians and ratios), DIR/table.md and DIR/chart.png.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from workloads import VARIANTS  # noqa: E402
FLOOR_OF = {"policy_td_b1": "policy_b1", "nested_td_12leaves_b64": None, "many_leaves_td_64": None}


def run_suite(out: str, expr: str | None) -> str:
    raw = os.path.join(out, "bench.json")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "test_benchmarks.py"),
           "--benchmark-enable", f"--benchmark-json={raw}", "--benchmark-columns=median", "-W", "ignore"]
    if expr:
        cmd += ["-k", expr]
    subprocess.run(cmd, check=False)
    return raw


def per_call(raw: str) -> dict[str, dict[str, float]]:
    data = json.load(open(raw))
    table: dict[str, dict[str, float]] = {}
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        table.setdefault(info["workload"], {})[info["variant"]] = bench["stats"]["median"] / info["calls"] * 1e6
    return table


def render(table: dict[str, dict[str, float]]) -> tuple[str, dict]:
    results = {}
    header = ("| workload | " + " | ".join(VARIANTS)
              + " | gm/floor | gm/floor_clone | gm_static/floor | gm/tensordict |")
    lines = [header, "|" + "---|" * (len(VARIANTS) + 5)]
    for workload, row in table.items():
        floor_key = FLOOR_OF.get(workload, workload)
        floor = table.get(floor_key, {}).get("floor") if floor_key else None
        floor_clone = table.get(floor_key, {}).get("floor_clone") if floor_key else None
        cells = [f"{row[v]:.1f}" if v in row else "—" for v in VARIANTS]
        gm, gms, td = row.get("graphmodule"), row.get("graphmodule_static"), row.get("tensordict")
        ratios = {
            "gm/floor": gm / floor if gm and floor else None,
            "gm/floor_clone": gm / floor_clone if gm and floor_clone else None,
            "gm_static/floor": gms / floor if gms and floor else None,
            "gm/tensordict": gm / td if gm and td else None,
        }
        cells += [f"{r:.2f}x" if r else "—" for r in ratios.values()]
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
        results[workload] = {"us_per_call": row, "floor_us": floor, **ratios}
    return "\n".join(lines), results


def chart(table: dict[str, dict[str, float]], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    workloads = list(table)
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(VARIANTS)
    for i, v in enumerate(VARIANTS):
        ys = []
        for w in workloads:
            floor_key = FLOOR_OF.get(w, w)
            ref = table.get(floor_key, {}).get("floor") if floor_key else table[w].get("tensordict")
            ys.append(table[w].get(v, 0) / ref if ref else 0)
        ax.bar([x + i * width for x in range(len(workloads))], ys, width, label=v)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))], workloads, rotation=15, fontsize=8)
    ax.set_ylabel("time per call / floor (TD-only cases: / tensordict)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("graphmodule vs prior art, median per call (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("-k", dest="expr", default=None)
    parser.add_argument("--raw", default=None, help="reuse an existing pytest-benchmark JSON")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    raw = args.raw or run_suite(args.out, args.expr)
    table = per_call(raw)
    text, results = render(table)
    print("\nmicroseconds per call (median):\n" + text)
    open(os.path.join(args.out, "table.md"), "w").write(text + "\n")
    json.dump(results, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    chart(table, os.path.join(args.out, "chart.png"))


if __name__ == "__main__":
    main()
