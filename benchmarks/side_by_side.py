"""One call, every way of running it: the side-by-side table (medians, ratios to the floor).

Runs ``test_benchmarks.py`` under pytest-benchmark (every workload of ``workloads.py``
under every variant), divides each median by the calls per round, and writes:

- ``DIR/side_by_side.json``: per workload, the µs per call of each variant and the floor
  it is compared with (what ``report.py`` reads);
- ``DIR/side_by_side_raw.json``: pytest-benchmark's own JSON.

Used by ``run.py``; ``report.py`` renders the table and the chart from the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from workloads import LABELS, VARIANTS  # noqa: E402

# A TensorDict workload is compared with the floor of its plain twin (the same network);
# None: no floor (the hand-written loop would copy leaves the module never reads).
FLOOR_OF = {"policy_td_b1": "policy_b1", "nested_td_12leaves_b64": None, "many_leaves_td_64": None}
SHOWN = ("eager", "floor", "tensordict", "compile", "graphmodule", "graphmodule_dropped", "graphmodule_clone",
         "graphmodule_static")
# shown where measured: graphmodule at another revision (GRAPHMODULE_BASELINE, scripts/baseline.sh)
BASELINE_SHOWN = ("baseline", "baseline_dropped")
HEADINGS = {"graphmodule": "graphmodule (default, result held)", "graphmodule_dropped": "result dropped", "graphmodule_clone": "`outputs=\"clone\"`",
            "graphmodule_static": "`outputs=\"static\"`", "compile": "torch.compile",
            "baseline": "baseline revision, held", "baseline_dropped": "baseline, dropped"}


def run_suite(raw: str, expr: str | None) -> int:
    """pytest-benchmark over ``test_benchmarks.py``, its JSON written to ``raw``."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "test_benchmarks.py"),
           "--benchmark-enable", f"--benchmark-json={raw}", "--benchmark-columns=median", "-W", "ignore"]
    if expr:
        cmd += ["-k", expr]
    return subprocess.run(cmd, check=False).returncode


def per_call(raw: str) -> dict[str, dict]:
    """``{workload: {"us_per_call": {variant: µs}, "floor_us": µs or None}}`` from pytest-benchmark's JSON."""
    with open(raw) as f:
        data = json.load(f)
    table: dict[str, dict[str, float]] = {}
    for bench in data["benchmarks"]:
        info = bench["extra_info"]
        table.setdefault(info["workload"], {})[info["variant"]] = bench["stats"]["median"] / info["calls"] * 1e6
    results = {}
    for workload, row in table.items():
        floor_key = FLOOR_OF.get(workload, workload)
        floor = table.get(floor_key, {}).get("floor") if floor_key else None
        results[workload] = {"us_per_call": row, "floor_us": floor}
    return results


def markdown(results: dict[str, dict]) -> str:
    """µs per call, each with its ratio to the floor: ``23.0 (2.47x)``."""
    shown = SHOWN + tuple(v for v in BASELINE_SHOWN if any(v in e["us_per_call"] for e in results.values()))
    lines = ["| workload (µs per call, x the floor) | " + " | ".join(HEADINGS.get(v, v) for v in shown) + " |",
             "|---|" + "---:|" * len(shown)]
    for workload, entry in results.items():
        row, floor = entry["us_per_call"], entry.get("floor_us")
        cells = []
        for variant in shown:
            us = row.get(variant)
            if us is None:
                cells.append("—")
            elif floor and variant != "floor":
                cells.append(f"{us:.1f} ({us / floor:.2f}x)")
            else:
                cells.append(f"{us:.1f}")
        lines.append(f"| {LABELS.get(workload, workload)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def chart(results: dict[str, dict], path: str, title: str) -> bool:
    """Each variant's time per call over the floor, a bar per workload (False without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    workloads = [w for w, e in results.items() if e.get("floor_us")]
    variants = [v for v in SHOWN if v != "floor"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        ys = [results[w]["us_per_call"].get(variant, 0) / results[w]["floor_us"] for w in workloads]
        ax.bar([x + i * width for x in range(len(workloads))], ys, width, label=HEADINGS.get(variant, variant).replace("`", ""))
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))],
                  [LABELS.get(w, w).replace("`", "") for w in workloads], fontsize=8)
    ax.set_ylabel("time per call / floor (log)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def measure(out: str, expr: str | None = None) -> dict[str, dict] | None:
    """Run the suite, write ``side_by_side.json`` and its raw JSON under ``out``; the results."""
    raw = os.path.join(out, "side_by_side_raw.json")
    run_suite(raw, expr)
    if not os.path.exists(raw):
        return None
    results = per_call(raw)
    with open(os.path.join(out, "side_by_side.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


__all__ = ["FLOOR_OF", "VARIANTS", "chart", "markdown", "measure", "per_call"]
