"""The training examples' runs as one markdown table, and their curves side by side.

    python benchmarks/results_table.py                  # the runs in results/ (the examples' usual --out)
    python benchmarks/results_table.py DIR --plot       # the runs below DIR, and DIR/<script>.png
    python benchmarks/results_table.py DIR --plot-only  # only the plots
    python benchmarks/results_table.py DIR --goals      # the table, then the one-env runs against their targets

Reads every ``*_summary.json`` below ``DIR`` (what ``train_ppo.py`` and ``train_sac.py`` write
with ``--out``) and prints: script, envs, mode, env steps/s (whole run and steady), the GPU floor
where measured (SAC on CUDA), time and env steps to the threshold, and the final return. The
plots draw return against wall-clock seconds for each mode, a panel per number of envs.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os

MODES = ("eager", "graph", "compile", "compile+graph")  # as examples/common/training.py; no torch import here

__all__ = ["goals", "load", "markdown_table", "plot"]


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
    lines += ["| script | envs | mode | env steps/s | steady env steps/s | GPU floor env steps/s (steady / floor) "
              "| s to threshold | env steps to threshold | final return (10+ episodes) | note |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            cells = ["—"] * 6 + [r["error"]]
        else:
            reached = r["threshold_seconds"] is not None
            steady, floor = r.get("steady_steps_per_s"), r.get("floor")
            notes = [f"stopped at {_number(r['seconds'])} s"] if r.get("time_limited") else []
            if floor:
                ratio = floor.get("steady_vs_floor")
                floor_cell = _number(floor["floor_steps_per_s"]) + (f" ({ratio:.2f}x)" if ratio is not None else "")
                notes.append(f"update {floor['update_gpu_us']:.0f} µs GPU; step graph {floor['step_graph_gpu_us']:.0f} µs "
                             f"({_number(floor['step_graph_steps_per_s'])} steps/s)")
            else:
                floor_cell = "—"
            cells = [_number(r["steps_per_s"]), _number(steady), floor_cell,
                     _number(r["threshold_seconds"], 1) if reached else "not reached",
                     _number(r["threshold_env_steps"]) if reached else "—",
                     _number(r.get("recent_return", r["final_return"])),
                     "; ".join(notes)]
        lines.append("| " + " | ".join([r["script"], str(r["envs"]), r["mode"], *cells]) + " |")
    return "\n".join(lines)


# the published single-file scripts (tensordict's wrapper, gymnasium's Pendulum, one CPU env) on
# an H200, in env steps/s
PUBLISHED = {"train_ppo": 1_800, "train_sac": 520}
PPO_GOAL, SAC_GOAL = 3.0, 0.9  # PPO: >= 3x the published script; SAC: within 10% of its update's GPU time


def goals(results: list[dict]) -> list[str]:
    """The one-env targets, from the ``graph`` runs with one env: PPO's steady env
    steps/s against ``PPO_GOAL`` times the published script's, and SAC's steady env steps/s
    against its GPU floor (one update per env step, ``"floor"`` in its summary)."""
    lines = []
    runs = {r["script"]: r for r in results if r.get("envs") == 1 and r.get("mode") == "graph"}
    ppo = runs.get("train_ppo")
    if ppo is None or "error" in ppo or ppo.get("steady_steps_per_s") is None:
        why = "no run" if ppo is None else ppo.get("error", "no steady speed")
        lines.append(f"PPO, 1 env, graph: not measured ({why})")
    else:
        steady, target = ppo["steady_steps_per_s"], PPO_GOAL * PUBLISHED["train_ppo"]
        lines.append(
            f"PPO, 1 env, graph: steady {_number(steady)} env steps/s (whole run, warmup and capture included: "
            f"{_number(ppo['steps_per_s'])}) = {steady / PUBLISHED['train_ppo']:.2f}x the published script's "
            f"~{_number(PUBLISHED['train_ppo'])}; goal >= {PPO_GOAL:g}x ({_number(target)}): "
            f"{'met' if steady >= target else 'NOT met'}")
    sac = runs.get("train_sac")
    floor = sac.get("floor") if sac else None
    if sac is None or "error" in sac or not floor or sac.get("steady_steps_per_s") is None:
        why = ("no run" if sac is None else sac.get("error") if "error" in sac
               else "no floor: measured on CUDA only" if not floor else "no steady speed")
        lines.append(f"SAC, 1 env, graph: not measured ({why})")
    else:
        steady, ratio = sac["steady_steps_per_s"], sac["steady_steps_per_s"] / floor["floor_steps_per_s"]
        one_stream = floor.get("step_graph_one_stream_gpu_us")
        lines.append(
            f"SAC, 1 env, graph: steady {_number(steady)} env steps/s; floor {_number(floor['floor_steps_per_s'])} "
            f"(one update per env step: {floor['update_gpu_us']:.1f} µs of GPU time); steady / floor = {ratio:.2f}; "
            f"goal >= {SAC_GOAL:g} (within 10%): {'met' if ratio >= SAC_GOAL else 'NOT met'}. "
            f"The step graph alone: {floor['step_graph_gpu_us']:.1f} µs per env step "
            f"({_number(floor['step_graph_steps_per_s'])} env steps/s"
            + (f"; on one stream {one_stream:.1f} µs" if one_stream is not None else "") + ")")
    return lines


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
    parser.add_argument("dir", nargs="?", default="results",
                        help="the folder holding the runs' *_summary.json, searched recursively (default: results)")
    parser.add_argument("--plot", action="store_true", help="also write DIR/<script>.png (needs matplotlib)")
    parser.add_argument("--plot-only", action="store_true", help="write DIR/<script>.png, print no table")
    parser.add_argument("--goals", action="store_true", help="after the table, the one-env runs against their targets "
                        "(PPO: 3x the published script's env steps/s; SAC: within 10%% of its GPU floor)")
    args = parser.parse_args(argv)
    results = load(args.dir)
    if not results:
        print(f"No training runs below {args.dir}/ yet. Make some first, e.g.\n"
              f"    python examples/train_ppo.py --mode graph --out {args.dir}/\n"
              f"    python examples/train_ppo.py --mode eager --out {args.dir}/\n"
              f"then run this again (python benchmarks/results_table.py --help for more).")
        return
    if not args.plot_only:
        print(markdown_table(results))
        if args.goals:
            print()
            print("\n".join(f"- {line}" for line in goals(results)))
    if args.plot or args.plot_only:
        for path in plot(results, args.dir):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
