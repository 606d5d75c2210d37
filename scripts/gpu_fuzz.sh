#!/usr/bin/env bash
# The differential harness on real CUDA graphs, for a fixed time. On a machine with a CUDA GPU,
# from the repository root:
#   bash scripts/gpu_fuzz.sh SECONDS [WORKERS]        # e.g. bash scripts/gpu_fuzz.sh 600 2
# Each worker is a pytest process fuzzing one focus with its own seed: a focus of
# tests/test_differential.py (generated calls, each compared with the plain function) or, named
# scenario:NAME, one of tests/test_scenarios.py (generated programs with state across calls); the count of cases
# and of differences is summed at the end into $OUT/fuzz-summary.txt (default OUT
# /tmp/graphmodule-fuzz). One or two workers: on an H100 one runs 15-22 cases/s, two about 25/s
# together, four about 10/s each; each spends some 20 s importing.
# Each worker rewrites $OUT/progressN.txt every 100 cases (a run cut short still counts) and
# stops itself 40 s before SECONDS; one still running at SECONDS gets SIGUSR1 (its stacks go to
# its log), then SIGINT, then SIGKILL 20 s later, so a hung case shows where it hangs.
# Knobs: GM_FUZZ_SEED_BASE (seeds, default 1000 + worker), GM_FUZZ_FOCUSES (default: mixed
# scenario:aliasing tensordict scenario:trainstep aliasing scenario:outputs mutation
# scenario:conventions outputs scenario:modes signature scenario:signatures), GM_FUZZ_OUTPUTS
# (clone, safe or static).
# The packages it needs beyond torch, and how to provide them offline: scripts/wheels.sh.
set -u
cd "$(dirname "$0")/.."
seconds=${1:-300}
workers=${2:-2}
OUT=${OUT:-/tmp/graphmodule-fuzz}
mkdir -p "$OUT"
GM_SITE_ONCE=1 . scripts/wheels.sh
# One intra-op thread per worker: the harness's CPU tensors are tiny, and one thread per core in
# every worker oversubscribes the cores.
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
focuses=(${GM_FUZZ_FOCUSES:-mixed scenario:aliasing tensordict scenario:trainstep aliasing scenario:outputs mutation
  scenario:conventions outputs scenario:modes signature scenario:signatures})
pids=()
for ((i = 0; i < workers; i++)); do
  focus=${focuses[$((i % ${#focuses[@]}))]}
  case $focus in
    scenario:*) test="tests/test_scenarios.py::test_scenario_fuzz[${focus#scenario:}]" ;;
    *) test="tests/test_differential.py::test_fuzz[$focus]" ;;
  esac
  rm -f "$OUT/progress$i.txt" "$OUT/worker$i.log"
  GM_FUZZ_SECONDS=$((seconds - 40)) GM_FUZZ_PROGRESS="$OUT/progress$i.txt" GM_FUZZ_BACKEND=${GM_FUZZ_BACKEND:-cuda} \
    GM_FUZZ_SEED=$((${GM_FUZZ_SEED_BASE:-1000} + i)) GM_FUZZ_EXAMPLES=1000000 \
    timeout -k 20 -s INT "$seconds" python3 -m pytest -q -s -p no:cacheprovider \
    -o addopts="--strict-markers --benchmark-disable" "$test" \
    > "$OUT/worker$i.log" 2>&1 &
  pids+=($!)
done
# just before the deadline, each worker's stacks (the pytest process under each timeout)
( sleep $((seconds - 3)); for pid in "${pids[@]}"; do pkill -USR1 -P "$pid"; done ) &
watchdog=$!
wait "${pids[@]}"
kill "$watchdog" 2>/dev/null
python3 - "$OUT" "$workers" <<'PY' | tee "$OUT/fuzz-summary.txt"
import os, re, sys
out, workers = sys.argv[1], int(sys.argv[2])
total = failures = 0
for i in range(workers):
    log = open(os.path.join(out, f"worker{i}.log"), errors="replace").read()
    done = re.findall(r"\[differential\] ([^:\n]+): (\d+) cases run", log)
    path = os.path.join(out, f"progress{i}.txt")
    progress = re.findall(r"\[differential\] ([^:\n]+): (\d+) cases run", open(path).read()) if os.path.exists(path) else []
    focus, n = (done or progress or [("?", "0")])[-1]
    failed = len(re.findall(r"differential failure", log))
    hung = "Thread 0x" in log and not done
    total += int(n)
    failures += failed
    print(f"worker {i} ({focus}): {n} cases{' (did not stop by itself: count from its progress file)' if not done else ''}"
          f"{', ' + str(failed) + ' differential failures' if failed else ''}{', stacks dumped' if hung else ''}")
print(f"workers: {workers}, cases run: {total}, differential failures: {failures}")
PY
