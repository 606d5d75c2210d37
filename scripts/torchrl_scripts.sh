#!/usr/bin/env bash
# TorchRL's published training scripts with graphmodule, on a machine with a CUDA GPU:
#   bash scripts/torchrl_scripts.sh DIR
# DIR holds the scripts as TorchRL's sota-implementations/ lays them out, with their utils and
# configs: sac/sac.py, td3/td3.py, ddpg/ddpg.py, ppo/ppo_mujoco.py (they are not part of this
# repository). Each runs on gymnasium's Pendulum-v1 (PPO on Pendulum64-v1, the same with float64
# observations, as its MuJoCo env transforms expect: scripts/torchrl_launch.py) for a short run, with
# compile.cudagraphs=False and =True, no torch.compile and no logger, through
# scripts/torchrl_launch.py, which binds tensordict.nn.CudaGraphModule to graphmodule's (GM_WRAPPERS
# "graphmodule tensordict" also runs tensordict's own wrapper). Each run appends a line to
# $OUT/results.jsonl (wall time, frames per second, the graphs' counters, the error if it failed);
# $OUT/summary.txt is the table (speedup: the cudagraphs=False run's wall time over the run's);
# $OUT/logs/ holds each run's output. Exits 1 where a run failed.
# Knobs: OUT (default /tmp/graphmodule-torchrl), GM_SCRIPTS ("sac td3 ddpg ppo"), GM_WRAPPERS
# (the wrappers run with cudagraphs=True, "graphmodule"), GM_FRAMES (frames per run, 10000), GM_BATCH (frames
# per collector batch, 1000: the off-policy scripts make as many updates per batch),
# GM_INIT_FRAMES (random frames before the first update, 1000), GM_PPO_FRAMES (20480),
# GM_PPO_BATCH (2048), GM_RUN_TIMEOUT (s per run, 900), GM_WRAPPER_OPTIONS (options our wrapper gets where
# the script passes none, e.g. "on_capture_failure=eager": see scripts/torchrl_launch.py).
# Beyond scripts/wheels.sh's packages it needs torchrl, hydra-core (omegaconf, antlr4), tqdm and
# pyyaml: installed, or as wheels in .whl/.
set -u
cd "$(dirname "$0")/.."
DIR=$(cd "${1:?usage: bash scripts/torchrl_scripts.sh DIR (TorchRL sota-implementations/)}" && pwd)
OUT=${OUT:-/tmp/graphmodule-torchrl}
mkdir -p "$OUT/logs" "$OUT/hydra"
export PYTHONUNBUFFERED=1
. scripts/wheels.sh
missing=$(python3 - <<'PY'
import importlib.util
names = ["torchrl", "hydra", "omegaconf", "tqdm", "yaml"]
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "missing Python packages: $missing (install them, or put their wheels in .whl/)" >&2
  exit 1
fi

F=${GM_FRAMES:-10000} B=${GM_BATCH:-1000} I=${GM_INIT_FRAMES:-1000}
PF=${GM_PPO_FRAMES:-20480} PB=${GM_PPO_BATCH:-2048}
# the off-policy scripts share their config keys; eval_iter=F evaluates once, after the first batch
OFF_POLICY="env.name=Pendulum-v1 env.library=gymnasium env.max_episode_steps=200 collector.total_frames=$F
  collector.frames_per_batch=$B collector.init_random_frames=$I replay_buffer.size=$F logger.eval_iter=$F"
declare -A SCRIPT=([sac]=sac/sac.py [td3]=td3/td3.py [ddpg]=ddpg/ddpg.py [ppo]=ppo/ppo_mujoco.py)
declare -A ARGS=([sac]=$OFF_POLICY [td3]=$OFF_POLICY [ddpg]=$OFF_POLICY
  [ppo]="env.env_name=Pendulum64-v1 collector.total_frames=$PF collector.frames_per_batch=$PB logger.num_test_episodes=1")

{
  date -u +"date: %Y-%m-%dT%H:%MZ"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  python3 -c "import torch, tensordict, torchrl; print('torch:', torch.__version__, '| tensordict:', tensordict.__version__, '| torchrl:', torchrl.__version__)" 2>/dev/null
} > "$OUT/summary.txt"
status=0
for name in ${GM_SCRIPTS:-sac td3 ddpg ppo}; do
  runs="False:graphmodule"  # (without graphs the wrapper plays no part: one run)
  for wrapper in ${GM_WRAPPERS:-graphmodule}; do runs="$runs True:$wrapper"; done
  for r in $runs; do
    cg=${r%%:*} wrapper=${r#*:}
    run=${name}_cudagraphs${cg}_${wrapper}
    echo "== $run"
    # shellcheck disable=SC2086  (the overrides split on spaces)
    timeout "${GM_RUN_TIMEOUT:-900}" python3 scripts/torchrl_launch.py "$OUT/results.jsonl" --wrapper "$wrapper" \
      "$DIR/${SCRIPT[$name]}" ${ARGS[$name]} logger.backend= compile.compile=False compile.cudagraphs=$cg \
      "hydra.run.dir=$OUT/hydra/$run" >"$OUT/logs/$run.log" 2>&1
    rc=$?
    grep '^{"script"' "$OUT/logs/$run.log" | tail -n 1
    if [ "$rc" -ne 0 ]; then status=1; echo "   rc=$rc: see $OUT/logs/$run.log"; fi
  done
done
python3 - "$OUT/results.jsonl" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
base = {r["script"]: r for r in rows if r["cudagraphs"] == "False" and not r["error"]}
print(f"{'script':<22} {'wrapper':<12} {'cudagraphs':<10} {'wall s':>8} {'frames/s':>9} {'speedup':>8}  graphs / error")
for r in rows:
    b = base.get(r["script"])
    speed = f"{b['wall_s'] / r['wall_s']:.2f}x" if b and not r["error"] else ""
    graphs = "; ".join(f"{g['captures']} capt, {g['replays']} repl, {g['eager_calls']} eager" for g in r["graphs"])
    print(f"{r['script']:<22} {r['wrapper']:<12} {r['cudagraphs']:<10} {r['wall_s']:>8} {str(r['frames_per_s']):>9} {speed:>8}  {(r['error'] or graphs).splitlines()[0] if (r['error'] or graphs) else ''}")
PY
exit $status
