#!/usr/bin/env bash
# The training examples on a GPU in one call of the device tool (carry: .whl):
#   examples/train_ppo.py and examples/train_sac.py in every mode, with one env and with many,
#   each run under its own time limit and the whole under a deadline (default 480 s, within
#   the tool's 10 minutes); then one markdown table of the runs, the two one-env goals of #9
#   (results_table.py --goals) and a plot per script.
# Usage (device tool): bash scripts/gpu_examples.sh                    (carry: [".whl"])
# Writes under $OUT/examples:
#   envs<N>/<script>_<mode>.csv, envs<N>/<script>_<mode>_summary.json, envs<N>/<script>.png
#   logs/<script>_envs<N>_<mode>.log (each run's output), runs.tsv (exit status and time of each),
#   table.md (the table and the goals, also printed), train_ppo.png and train_sac.png (every
#   mode, a panel per number of envs; need matplotlib from .whl).
# What shows the goals: "train_ppo 1 graph" (PPO's whole iteration, rollout and every update,
# one graph replay: its steady env steps/s against the published script's ~1 800) and
# "train_sac 1 graph" (after training it times the GPU time of one update and of the step
# graph with CUDA events: its steady env steps/s against that floor). They run first.
# Runs go most important first (graph, eager, compile+graph, and compile last, with many envs
# only), so a deadline cuts the least important: a run that does not fit is skipped (said so,
# and shown in the table: usually the compile modes with many envs), a run that fails is recorded.
# Knobs: GM_EX_SECONDS (training seconds per run, default 15), GM_EX_GOAL_SECONDS (the graph
# runs with one env, default 25), GM_EX_COMPILE_SECONDS (compile modes, whose compilation counts
# in their time, default 40), GM_EX_DEADLINE (default 480),
# GM_EX_RUNS (an extended regex over "script:envs:mode" picking runs, e.g. 'ppo.*:graph$').
set -u
OUT=${OUT:-/tmp/graphmodule-gpu}
start=$SECONDS
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=5  # a progress line every 5 s in the logs
. "$(dirname "$0")/site.sh"  # the carried wheels on PYTHONPATH
dir=$OUT/examples
mkdir -p "$dir/logs"
seconds=${GM_EX_SECONDS:-15} compile_seconds=${GM_EX_COMPILE_SECONDS:-40} deadline=${GM_EX_DEADLINE:-480}
goal_seconds=${GM_EX_GOAL_SECONDS:-25}
{
  date -u +"date: %Y-%m-%dT%H:%MZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  python3 -c "import sys, torch, tensordict; print('python:', sys.version.split()[0], '| torch:', torch.__version__, 'cuda', torch.version.cuda, '| tensordict:', tensordict.__version__)"
  python3 -c "import tqdm, matplotlib; print('tqdm:', tqdm.__version__, '| matplotlib:', matplotlib.__version__)" 2>&1 | tail -n 1
  echo "budgets: $seconds s per run, $goal_seconds s for the graph runs with one env, $compile_seconds s per compile run, deadline $deadline s"
} | tee "$dir/summary.txt"
printf 'script\tenvs\tmode\trc\tseconds\n' > "$dir/runs.tsv"

# Sizes (see each script's docstring): PPO with one env collects 1024 steps per iteration
# (five episodes) in minibatches of 64 over 10 epochs, 160 updates per 1024 env steps (the
# ratio of CleanRL's ppo_continuous_action: 2048 steps, 32 minibatches, 10 epochs); with 256
# envs one whole episode (200 steps) per iteration, minibatches of 2048. --steps is each run's
# horizon (PPO anneals its learning rate over it); the time limit ends the slower modes first.
PPO_1="--envs 1 --rollout 1024 --minibatch 64 --steps 100000"
PPO_N="--envs 256 --rollout 200 --minibatch 2048 --steps 2048000"
SAC_1="--envs 1 --steps 20000"
SAC_N="--envs 64 --steps 640000"
RUNS=(
  "train_ppo 1 graph" "train_sac 1 graph" "train_ppo 256 graph" "train_sac 64 graph"
  "train_ppo 1 eager" "train_sac 1 eager" "train_ppo 256 eager" "train_sac 64 eager"
  "train_ppo 1 compile+graph" "train_sac 1 compile+graph" "train_ppo 256 compile+graph" "train_sac 64 compile+graph"
  "train_ppo 256 compile" "train_sac 64 compile"
)
echo "runs, in this order, until the deadline: ${RUNS[*]/%/,}" | sed 's/,$//' | tee -a "$dir/summary.txt"
echo "(the compile modes with many envs come last: with the default budgets they may not fit, and are then skipped)" \
  | tee -a "$dir/summary.txt"
skipped=()

stub() {  # a summary for a run that wrote none, so that the table shows it
  printf '{"script": "%s", "envs": %s, "mode": "%s", "error": "%s"}\n' "$1" "$2" "$3" "$4" \
    > "$dir/envs$2/$1_$3_summary.json"
}

for run in "${RUNS[@]}"; do
  read -r script envs mode <<< "$run"
  if [ -n "${GM_EX_RUNS:-}" ] && ! [[ "$script:$envs:$mode" =~ $GM_EX_RUNS ]]; then continue; fi
  case "$script:$envs" in
    train_ppo:1) sizes=$PPO_1 ;; train_ppo:*) sizes=$PPO_N ;;
    train_sac:1) sizes=$SAC_1 ;; *) sizes=$SAC_N ;;
  esac
  budget=$seconds; [[ $mode == compile* ]] && budget=$compile_seconds
  [[ $envs == 1 && $mode == graph ]] && budget=$goal_seconds  # the goal runs: a longer steady window
  mkdir -p "$dir/envs$envs"
  rm -f "$dir/envs$envs/${script}_${mode}_summary.json"
  left=$((deadline - (SECONDS - start) - 20))  # 20 s kept for the table and the plots
  if [ "$left" -lt $((budget + 20)) ]; then
    echo "$script envs=$envs $mode: skipped ($left s left, the run needs $budget s and some)"
    skipped+=("$script envs=$envs $mode")
    stub "$script" "$envs" "$mode" "skipped: deadline"
    printf '%s\t%s\t%s\tskipped\t0\n' "$script" "$envs" "$mode" >> "$dir/runs.tsv"
    continue
  fi
  limit=$((budget + 120)); [ "$limit" -gt "$left" ] && limit=$left  # startup, compilation, evaluation
  log=$dir/logs/${script}_envs${envs}_${mode}.log
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" python3 "examples/$script.py" --mode "$mode" $sizes --max-seconds "$budget" \
    --out "$dir/envs$envs" > "$log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$script" "$envs" "$mode" "$rc" "$((SECONDS - t0))" >> "$dir/runs.tsv"
  if [ "$rc" -eq 0 ] && [ -f "$dir/envs$envs/${script}_${mode}_summary.json" ]; then
    echo "$script envs=$envs $mode ($((SECONDS - t0)) s): $(grep '^summary:' "$log" | sed 's/ (random policy.*//; s/^summary: //')"
    grep '^floor:' "$log" | sed 's/^/    /'
  else
    why="exit $rc"; [ "$rc" -eq 124 ] && why="exit 124 (timeout after $limit s)"
    echo "$script envs=$envs $mode: FAILED, $why; the log ends:"
    tail -n 8 "$log" | tr '\r' '\n' | tail -n 8 | sed 's/^/    /'
    stub "$script" "$envs" "$mode" "failed: $why"
  fi
done

echo
if [ "${#skipped[@]}" -gt 0 ]; then
  printf 'skipped for the deadline (%s s): %s\n' "$deadline" "$(IFS=,; echo "${skipped[*]}" | sed 's/,/, /g')"
fi
python3 examples/results_table.py "$dir" --goals | tee "$dir/table.md"
python3 examples/results_table.py "$dir" --plot-only || echo "no combined plots (matplotlib?)"
echo "total: $((SECONDS - start)) s"
