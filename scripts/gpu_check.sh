#!/usr/bin/env bash
# The whole GPU check in one call of the device tool (see README "Testing on a GPU"):
#   install the carried wheels, run every test file in its own process (a failed capture
#   cannot poison the next file), then the benchmark; everything lands under $OUT.
# Usage (device tool): bash scripts/gpu_check.sh [tests|bench|programs|all|MODE+MODE...]   (carry: .whl)
#   programs: graphmodule against tensordict's wrapper in the real programs, both wrappers in
#   one run switched every 20 iterations (benchmarks/programs.py --interleaved).
#   GM_TESTS: test files or folders to run (default: tests); GM_BENCH_K: a -k expression
#   selecting benchmark workloads (default: all).
set -u
what=${1:-all}
OUT=${OUT:-/tmp/graphmodule-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/site.sh"  # the carried wheels on PYTHONPATH
{
  date -u +"date: %Y-%m-%dT%H:%MZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  python3 -c "import sys, torch, tensordict, optree; print('python:', sys.version.split()[0]); print('torch:', torch.__version__, 'cuda', torch.version.cuda); print('tensordict:', tensordict.__version__); print('optree:', optree.__version__)"
} | tee "$OUT/summary.txt"

status=0
has() { [ "$what" = all ] || [[ "+$what+" == *"+$1+"* ]]; }
if has tests; then
  : > "$OUT/tests.log"
  mkdir -p /tmp/gm-logs
  # One process per file, 4 at a time: a capture that breaks CUDA state stays inside its
  # file, and a crash shows as that file's failure instead of hiding the others' results.
  # The slow files (GM_SLOW_FILES: the training examples run real scripts in subprocesses,
  # some 6 minutes on an H100) start first and get GM_SLOW_FILE_TIMEOUT.
  export GM_SLOW_FILES=${GM_SLOW_FILES:-tests/test_examples.py}
  { find ${GM_TESTS:-tests} -name 'test_*.py' | sort | grep -Fx -f <(tr ' ' '\n' <<<"$GM_SLOW_FILES");
    find ${GM_TESTS:-tests} -name 'test_*.py' | sort | grep -vFx -f <(tr ' ' '\n' <<<"$GM_SLOW_FILES"); } \
  | xargs -P "${GM_JOBS:-4}" -I{} bash -c '
    f={}; log=/tmp/gm-logs/$(echo "$f" | tr / _).log
    limit=${GM_FILE_TIMEOUT:-240}
    case " $GM_SLOW_FILES " in *" $f "*) limit=${GM_SLOW_FILE_TIMEOUT:-560};; esac
    timeout "$limit" python3 -m pytest -q -p no:cacheprovider -o addopts="-ra --strict-markers --benchmark-disable" "$f" >"$log" 2>&1
    echo $? > "$log.rc"'
  for f in $(find ${GM_TESTS:-tests} -name 'test_*.py' | sort); do
    log=/tmp/gm-logs/$(echo "$f" | tr / _).log
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
    for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", line):
        tot[k] = tot.get(k, 0) + int(n)
print("TOTAL:", ", ".join(f"{v} {k}" for k, v in sorted(tot.items())))
PY
fi
if has profile; then
  timeout 200 python3 benchmarks/profile_hot_path.py --calls 2000 > "$OUT/profile.txt" 2>&1
  grep -E "^==|wall" "$OUT/profile.txt"
fi
if has bench; then
  timeout 400 python3 benchmarks/compare.py --out "$OUT" ${GM_BENCH_K:+-k "$GM_BENCH_K"} 2>&1 | grep -v "^test_bench\[" | tail -n 14
fi
if has programs; then
  timeout 300 python3 benchmarks/programs.py --interleaved 20 --programs ${GM_PROGRAMS:-td3,sac,ppo_tdmodule} \
    --out "$OUT" 2>&1 | tail -n 8
fi
exit $status
