#!/bin/bash
# One call on the GPU host, from the repository root: the gpu and gpu_host
# test suites, then the GPU benchmark. Builds nothing: the binaries are
# built on the build machine and carried (tests/bench/GPU_NOTES.md).
#   BIN    where run, l3kvd and bench_gpu are (default .carry/bin; else
#          build, with build/tests/run); the daemon-level gpu tests start
#          $BIN/l3kvd (L3KV_BUILD=$BIN)
#   LIBS   extra shared libraries (default .carry/lib)
#   OUT    logs go there when set
#   BENCH_ARGS  options for bench_gpu (default -r 5)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-.carry/bin}
[ -x "$BIN/bench_gpu" ] || BIN=build
RUN=$BIN/run
[ -x "$RUN" ] || RUN=$BIN/tests/run
LIBS=${LIBS:-.carry/lib}
export L3KV_BUILD=${L3KV_BUILD:-$BIN}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/l3kv-gpu-XXXXXX")}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
	echo "== host"
	uname -a
	nvidia-smi -L || true
	nvidia-smi --query-gpu=driver_version,pcie.link.gen.current,pcie.link.width.current \
		--format=csv || true
	echo "== binaries ($BIN), libraries ($LIBS)"
	ls -la "$RUN" "$L3KV_BUILD/l3kvd" "$BIN/bench_gpu"
	ldd "$RUN" "$L3KV_BUILD/l3kvd" "$BIN/bench_gpu" | grep -E 'not found' &&
		echo "MISSING LIBRARIES: see above"
} 2>&1 | tee "$OUT/host.log"

status=0
echo "== suite gpu_host"
L3KV_SUITE=gpu_host timeout 60 "$RUN" 2>&1 | tee "$OUT/test_gpu_host.log" || status=1
echo "== suite gpu"
L3KV_SUITE=gpu timeout 240 "$RUN" 2>&1 | tee "$OUT/test_gpu.log" || status=1

echo "== bench_gpu"
# shellcheck disable=SC2086
timeout 240 tests/bench/gpu.sh "$BIN" ${BENCH_ARGS:--r 5} >"$OUT/bench_gpu.md" \
	2>"$OUT/bench_gpu.log" || { status=1; tail -20 "$OUT/bench_gpu.log"; }
echo "== bench_e2e"; timeout 90 "$BIN/bench_e2e" 2>&1 | tee -a "$OUT/bench_e2e.md" || status=1

echo "== summary"
grep -hE '^[0-9]+ passed|^SKIPPED|Failed|Error|:[0-9]+:[EF]:' "$OUT"/test_gpu*.log | head -40
cat "$OUT/bench_gpu.md"
echo "logs in $OUT; exit $status"
exit $status
