#!/usr/bin/env bash
# The whole GPU check. On a machine with a CUDA GPU, from the repository root:
#   bash scripts/gpu_check.sh              # the tests, then the benchmarks
#   bash scripts/gpu_check.sh tests        # or one part: tests | bench
# tests: every test file in its own process, GM_JOBS (4) at a time, so that a capture that
#        breaks CUDA state stays inside its file and a crash shows as that file's failure;
# bench: python benchmarks/run.py (the side-by-side table, the real programs' A/B, memory).
# Everything lands under $OUT (default /tmp/graphmodule-gpu-check): summary.txt (versions, one
# line per test file, the total), tests.log, bench/ (the raw files benchmarks/report.py reads).
# The packages it needs beyond torch, and how to provide them offline: scripts/wheels.sh.
# Knobs: GM_TESTS (files or folders, default "tests benchmarks"), GM_FILE_TIMEOUT (s per file,
# 240), GM_SLOW_FILES (started first, default tests/test_examples.py, which runs the training
# examples) and GM_SLOW_FILE_TIMEOUT (560), GM_BENCH_ARGS (more arguments for run.py).
set -u
cd "$(dirname "$0")/.."
parts=${*:-tests bench}
OUT=${OUT:-/tmp/graphmodule-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/wheels.sh
{
  date -u +"date: %Y-%m-%dT%H:%MZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  python3 -c "import sys, torch, tensordict, optree; print('python:', sys.version.split()[0]); print('torch:', torch.__version__, 'cuda', torch.version.cuda); print('tensordict:', tensordict.__version__); print('optree:', optree.__version__)"
} | tee "$OUT/summary.txt"

status=0
if [[ " $parts " == *" tests "* ]]; then
  : > "$OUT/tests.log"
  logs="$OUT/logs"
  mkdir -p "$logs"
  export GM_SLOW_FILES=${GM_SLOW_FILES:-tests/test_examples.py} GM_LOGS=$logs
  files=$(find ${GM_TESTS:-tests benchmarks} -name 'test_*.py' | sort)
  { grep -Fx -f <(tr ' ' '\n' <<<"$GM_SLOW_FILES") <<<"$files"; grep -vFx -f <(tr ' ' '\n' <<<"$GM_SLOW_FILES") <<<"$files"; } \
  | xargs -P "${GM_JOBS:-4}" -I{} bash -c '
    f={}; log=$GM_LOGS/$(echo "$f" | tr / _).log
    limit=${GM_FILE_TIMEOUT:-240}
    case " $GM_SLOW_FILES " in *" $f "*) limit=${GM_SLOW_FILE_TIMEOUT:-560};; esac
    timeout "$limit" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --strict-markers --benchmark-disable" "$f" >"$log" 2>&1
    echo $? > "$log.rc"'
  for f in $files; do
    log=$logs/$(echo "$f" | tr / _).log
    rc=$(cat "$log.rc")
    cat "$log" >> "$OUT/tests.log"
    line=$(grep -E "(passed|failed|error|skipped|no tests ran)" "$log" | tail -n 1)
    if [ "$rc" = 124 ]; then line="TIMED OUT (killed at its time limit; $(grep -o '[.FEsx]' "$log" | wc -l) tests had run) $line"; fi
    printf '%-48s rc=%-3s %s\n' "$f" "$rc" "$line" | tee -a "$OUT/summary.txt"
    if [ "$rc" -ne 0 ]; then status=1; fi
  done
  python3 - "$OUT/summary.txt" <<'PY' | tee -a "$OUT/summary.txt"
import re, sys
tot = {}
for line in open(sys.argv[1]):
    for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed)", line):
        tot[k] = tot.get(k, 0) + int(n)
print("TOTAL:", ", ".join(f"{v} {k}" for k, v in sorted(tot.items())))
PY
fi
if [[ " $parts " == *" bench "* ]]; then
  python3 benchmarks/run.py --out "$OUT/bench" ${GM_BENCH_ARGS:-} 2>&1 | grep -v "^test_bench\[" | tee "$OUT/bench.log" | tail -n 40
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then status=1; fi
fi
exit $status
