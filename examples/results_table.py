"""The table of the training examples' runs, and their curves side by side.

    python examples/results_table.py DIR              # print the markdown table
    python examples/results_table.py DIR --plot       # and write DIR/<script>.png
    python examples/results_table.py DIR --plot-only  # only the plots

Reads every ``*_summary.json`` below ``DIR`` (what ``train_ppo.py`` and ``train_sac.py``
write with ``--out``; ``scripts/gpu_examples.sh`` puts each configuration in its own folder)
and prints one markdown table: script, envs, mode, env steps/s, seconds and env steps until
the return first reached the threshold, and the final return (the mean of the latest 10 or
more finished episodes, as for the threshold). A summary with an ``"error"``
(a run that failed or was skipped, written by ``scripts/gpu_examples.sh``) shows as such.
With ``--plot`` (or ``--plot-only``), ``DIR/<script>.png`` draws return against wall-clock seconds for each mode,
one panel per number of envs, from the CSV beside each summary.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os

MODES = ("eager", "graph", "compile", "compile+graph")  # as examples/training.py; no torch import here

__all__ = ["load", "markdown_table", "plot"]


def load(root: str) -> list[dict]:
    """Every ``*_summary.json`` below ``root``, each with ``"path"`` (its file) added, sorted
    by script, number of envs and mode."""
    results = []
    for path in glob.glob(os.path.join(root, "**", "*_summary.json"), recursive=True):
        with open(path) as f:
            result = json.load(f)
        result["path"] = path
        results.append(result)
    mode_order = {mode: i for i, mode in enumerate(MODES)}
    return sorted(results, key=lambda r: (r["script"], r["envs"], mode_order.get(r["mode"], len(MODES)), r["mode"]))


def _number(x, digits: int = 0) -> str:
    """``12 345`` (a space between thousands, as in the project's docs); ``—`` for None."""
    return "—" if x is None else f"{x:,.{digits}f}".replace(",", " ")


def markdown_table(results: list[dict]) -> str:
    """One line per run, under a line naming the threshold(s), the random policy's return and
    the device(s) the runs had."""
    ok = [r for r in results if "error" not in r]
    facts = []
    for label, key in (("threshold", "threshold"), ("random policy", "random_return"), ("device", "device"),
                       ("torch", "torch")):
        values = sorted({_number(r[key]) if isinstance(r[key], float) else str(r[key]) for r in ok})
        if values:
            facts.append(f"{label} {', '.join(values)}")
    lines = []
    if facts:  # threshold -200; random policy -1 263; device cuda (...); torch 2.11.0
        lines += ["; ".join(facts) + " (the threshold: the mean return of the latest 10+ finished episodes)", ""]
    lines += ["| script | envs | mode | env steps/s | s to threshold | env steps to threshold | final return (10+ episodes) "
              "| note |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            cells = ["—"] * 4 + [r["error"]]
        else:
            reached = r["threshold_seconds"] is not None
            cells = [_number(r["steps_per_s"]),
                     _number(r["threshold_seconds"], 1) if reached else "not reached",
                     _number(r["threshold_env_steps"]) if reached else "—",
                     _number(r.get("recent_return", r["final_return"])),
                     f"stopped at {_number(r['seconds'])} s" if r.get("time_limited") else ""]
        lines.append("| " + " | ".join([r["script"], str(r["envs"]), r["mode"], *cells]) + " |")
    return "\n".join(lines)


def _curve(result: dict) -> list[tuple[float, float]]:
    path = os.path.join(os.path.dirname(result["path"]), f"{result['script']}_{result['mode']}.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [(float(row["wall_seconds"]), float(row["mean_return"])) for row in csv.DictReader(f)]


def plot(results: list[dict], out_dir: str) -> list[str]:
    """``out_dir/<script>.png`` for each script: return against wall-clock seconds, a curve per
    mode, a panel per number of envs. Returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    ok = [r for r in results if "error" not in r]
    for script in sorted({r["script"] for r in ok}):
        runs = [r for r in ok if r["script"] == script]
        envs = sorted({r["envs"] for r in runs})
        fig, axes = plt.subplots(1, len(envs), figsize=(6 * len(envs), 4.5), squeeze=False, sharey=True)
        for ax, n in zip(axes[0], envs):
            for r in (r for r in runs if r["envs"] == n):
                data = _curve(r)
                if data:
                    ax.plot(*zip(*data), label=f"{r['mode']} ({_number(r['steps_per_s'])} steps/s)",
                            color=f"C{MODES.index(r['mode']) if r['mode'] in MODES else len(MODES)}")
            first = next(r for r in runs if r["envs"] == n)
            ax.axhline(first["threshold"], color="black", linestyle=":", label=f"threshold {first['threshold']:g}")
            if first["random_return"] is not None:
                ax.axhline(first["random_return"], color="gray", linestyle="--", label="random policy")
            ax.set(xlabel="wall-clock seconds", title=f"{first['algo']}, {n} env{'s' if n > 1 else ''}")
            ax.legend(fontsize="small")
        axes[0][0].set_ylabel("mean episode return")
        fig.suptitle(f"{script} on Pendulum, {runs[0]['device']}, torch {runs[0]['torch']}")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{script}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="the folder holding the runs' *_summary.json (searched recursively)")
    parser.add_argument("--plot", action="store_true", help="also write DIR/<script>.png (needs matplotlib)")
    parser.add_argument("--plot-only", action="store_true", help="write DIR/<script>.png, print no table")
    args = parser.parse_args(argv)
    results = load(args.dir)
    if not results:
        raise SystemExit(f"no *_summary.json below {args.dir}")
    if not args.plot_only:
        print(markdown_table(results))
    if args.plot or args.plot_only:
        for path in plot(results, args.dir):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
