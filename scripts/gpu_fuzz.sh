#!/usr/bin/env bash
# The long differential run on a GPU: pytest workers, each fuzzing one focus of
# tests/test_differential.py with real CUDA graphs and its own seed, for a fixed time.
# Each worker rewrites $OUT/progressN.txt every 100 cases (so a run cut short still counts)
# and prints "[differential] <focus>: N cases run" when it stops; the total is summed at the end.
# Usage (device tool, carry .whl): bash scripts/gpu_fuzz.sh SECONDS [WORKERS]   (GM_FUZZ_SEED_BASE: other seeds)
# 2026-11-24, H100: one worker alone ran 15-22 cases/s, two 25/s together, four about 10/s
# each. Each worker also spends ~20 s importing.
# Each worker stops itself 40 s before SECONDS (GM_FUZZ_SECONDS: imports take ~20 s); one still
# running at SECONDS gets SIGUSR1 (its stacks into its log), then SIGINT, then SIGKILL 20 s
# later: a hung case shows where it hangs and cannot hold the device call. (A worker that
# stops itself ends its log with hypothesis printing the case it was on: not a failure.)
set -u
seconds=${1:-300}
workers=${2:-2}
OUT=${OUT:-/tmp/graphmodule-fuzz}
mkdir -p "$OUT"
GM_SITE_ONCE=1 . "$(dirname "$0")/site.sh"  # the carried wheels on PYTHONPATH
# One intra-op thread per worker: the harness's CPU tensors are tiny, and torch's default (one
# thread per core in every worker) oversubscribes the cores, which may be what stopped workers
# from scaling (not tried on a GPU yet; the time-slicing explanation above is not proven either).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
focuses=(${GM_FUZZ_FOCUSES:-mixed tensordict aliasing mutation outputs signature})
pids=()
for ((i = 0; i < workers; i++)); do
  focus=${focuses[$((i % ${#focuses[@]}))]}
  rm -f "$OUT/progress$i.txt" "$OUT/worker$i.log"
  GM_FUZZ_SECONDS=$((seconds - 40)) GM_FUZZ_PROGRESS="$OUT/progress$i.txt" GM_FUZZ_BACKEND=${GM_FUZZ_BACKEND:-cuda} \
    GM_FUZZ_SEED=$((${GM_FUZZ_SEED_BASE:-1000} + i)) GM_FUZZ_EXAMPLES=1000000 \
    timeout -k 20 -s INT "$seconds" python3 -m pytest -q -s -p no:cacheprovider \
    -o addopts="--strict-markers --benchmark-disable" "tests/test_differential.py::test_fuzz[$focus]" \
    > "$OUT/worker$i.log" 2>&1 &
  pids+=($!)
done
( sleep $((seconds - 3)); pkill -USR1 -f "^[^ ]*python3 -m pytest .*test_differential.py::test_fuzz" ) &
watchdog=$!
wait "${pids[@]}"
kill "$watchdog" 2>/dev/null
python3 - "$OUT" "$workers" <<'PY' | tee "$OUT/fuzz-summary.txt"
import os, re, sys
out, workers = sys.argv[1], int(sys.argv[2])
total = failures = 0
for i in range(workers):
    log = open(os.path.join(out, f"worker{i}.log"), errors="replace").read()
    done = re.findall(r"\[differential\] (\S+): (\d+) cases run", log)
    path = os.path.join(out, f"progress{i}.txt")
    progress = re.findall(r"\[differential\] (\S+): (\d+) cases run", open(path).read()) if os.path.exists(path) else []
    focus, n = (done or progress or [("?", "0")])[-1]
    failed = len(re.findall(r"differential failure", log))
    hung = "Thread 0x" in log and not done
    total += int(n)
    failures += failed
    print(f"worker {i} ({focus}): {n} cases{' (did not stop by itself: count from its progress file)' if not done else ''}"
          f"{', ' + str(failed) + ' differential failures' if failed else ''}{', stacks dumped' if hung else ''}")
print(f"workers: {workers}, cases run: {total}, differential failures: {failures}")
PY
