#!/usr/bin/env bash
# The long differential run on a GPU: many pytest workers, each fuzzing one focus of
# tests/test_differential.py with real CUDA graphs and its own seed, for a fixed time.
# Each worker prints "[differential] <focus>: N cases run"; the total is summed at the end.
# Usage (device tool, carry .whl): bash scripts/gpu_fuzz.sh SECONDS [WORKERS]   (GM_FUZZ_SEED_BASE: other seeds)
# Few workers: processes time-slice one GPU, and every host sync of one waits for the
# others' slices (2026-11-23, H100: 14 workers ran 10.6 cases/s in all, 5 workers 9.8/s,
# one worker alone about 16/s under cProfile). Each worker also spends ~20 s importing.
set -u
seconds=${1:-300}
workers=${2:-2}
OUT=${OUT:-/tmp/graphmodule-fuzz}
mkdir -p "$OUT" /tmp/gm-fuzz
rm -f /tmp/gm-fuzz/worker*.log  # a warm machine keeps the last run's logs
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/tensordict ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
focuses=(mixed tensordict aliasing mutation outputs signature)
for ((i = 0; i < workers; i++)); do
  focus=${focuses[$((i % ${#focuses[@]}))]}
  GM_FUZZ_BACKEND=${GM_FUZZ_BACKEND:-cuda} GM_FUZZ_SEED=$((${GM_FUZZ_SEED_BASE:-1000} + i)) GM_FUZZ_EXAMPLES=1000000 \
    timeout -s INT "$seconds" python3 -m pytest -q -s -p no:cacheprovider \
    -o addopts="--strict-markers --benchmark-disable" "tests/test_differential.py::test_fuzz[$focus]" \
    > "/tmp/gm-fuzz/worker$i.log" 2>&1 &
done
wait
cat /tmp/gm-fuzz/worker*.log > "$OUT/fuzz.log"
python3 - "$OUT/fuzz.log" <<'PY' | tee "$OUT/fuzz-summary.txt"
import re, sys
text = open(sys.argv[1]).read()
counts = [int(n) for n in re.findall(r"\[differential\] \S+: (\d+) cases run", text)]
failures = len(re.findall(r"differential failure", text))
print(f"workers reporting: {len(counts)}, cases run: {sum(counts)}, differential failures: {failures}")
PY
