#!/bin/bash
# One call on the GPU host, from the repository root: the gpu_host, gpu
# and python_gpu test suites, then the GPU benchmark, the end-to-end
# restores through l3kvd (bench_e2e: as is, with the client spinning, with
# the daemon's timeline) and the same from a torch engine through the
# Python client (bench_e2e_torch.py). Builds nothing: the binaries are
# built on the build machine and carried (tests/bench/GPU_NOTES.md).
# About 4 minutes in all (suites ~2, benchmarks ~2 with BENCH_ARGS
# -r 3 -m 256); 8 files in $OUT.
#   BIN    where run, l3kvd, bench_gpu, bench_e2e, libl3kv.so (and
#          bench_dram, for the churned-arena layouts) are
#          (default .carry/bin; else build, with build/tests/run); the
#          daemon-level tests start $BIN/l3kvd (L3KV_BUILD=$BIN)
#   LIBS   extra shared libraries (default .carry/lib)
#   OUT    logs go there when set
#   BENCH_ARGS  options for bench_gpu (default -r 5)
#   E2E_ARGS    options for bench_e2e and bench_e2e_torch.py (default -n 20)
#   SUITES      the suites (default gpu_host gpu python_gpu)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-.carry/bin}
[ -x "$BIN/bench_gpu" ] || BIN=build
RUN=$BIN/run
[ -x "$RUN" ] || RUN=$BIN/tests/run
LIBS=${LIBS:-.carry/lib}
export L3KV_BUILD=${L3KV_BUILD:-$BIN}
export L3KV_LIB=${L3KV_LIB:-$PWD/$BIN/libl3kv.so}
[ -f "$L3KV_LIB" ] || L3KV_LIB=$PWD/build/libl3kv.so
export PYTHONUNBUFFERED=1
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
for s in ${SUITES:-gpu_host gpu python_gpu}; do
	echo "== suite $s"
	L3KV_SUITE=$s timeout 240 "$RUN" >"$OUT/test_$s.log" 2>&1 || status=1
	grep -hE '^[0-9]+ passed|^SKIPPED' "$OUT/test_$s.log"
done

echo "== bench_gpu"
# shellcheck disable=SC2086
timeout 240 tests/bench/gpu.sh "$BIN" ${BENCH_ARGS:--r 5} >"$OUT/bench_gpu.md" \
	2>"$OUT/bench_gpu.log" || { status=1; tail -20 "$OUT/bench_gpu.log"; }
# Restores as a churned arena leaves them, before and after issue 16's batch runs (bench_dram -c
# -n / -c: the same request stream, one arena of 4096 x 36 KiB; the restores' layouts and the
# new batches' as their PUBLISH wrote them), replayed by bench_gpu -L.
if [ -x "$BIN/bench_dram" ]; then
	echo "== bench_gpu -L (churned arena layouts)"
	lay=$(mktemp -d "${TMPDIR:-/tmp}/l3kv-layout-XXXXXX")
	if "$BIN/bench_dram" -c -n -L "$lay/unbatched" -B "$lay/unbatched-publish" 4096 36864 \
	    >"$OUT/bench_layout.log" 2>&1 &&
	    "$BIN/bench_dram" -c -L "$lay/batched" -B "$lay/batched-publish" 4096 36864 \
	    >>"$OUT/bench_layout.log" 2>&1; then
		# shellcheck disable=SC2086
		timeout 240 "$BIN/bench_gpu" ${BENCH_ARGS:--r 5} -L "$lay/unbatched" -L "$lay/batched" \
		    -L "$lay/unbatched-publish" -L "$lay/batched-publish" \
		    >"$OUT/bench_layout.md" 2>>"$OUT/bench_layout.log" || status=1
	else
		status=1
	fi
	tail -3 "$OUT/bench_layout.log"
	rm -rf "$lay"
fi
# shellcheck disable=SC2086
# a leading word names the checksum kernel's form (L3KV_CUDA_CSUM=cta|warp; cta is the default)
# (bench_e2e's client spins by L3KV_SPIN_AUTO unless -S says otherwise)
for v in "" "-S 0" "-S 5000" "-T" "warp -S 0" "" "-S 0"; do
	echo "== bench_e2e $v"
	echo "### bench_e2e ${v:-(defaults)}" >>"$OUT/bench_e2e.md"
	csum=cta
	case $v in cta*|warp*) csum=${v%% *}; v=${v#"$csum"}; v=${v# } ;; esac
	L3KV_CUDA_CSUM=$csum timeout 90 "$BIN/bench_e2e" $v ${E2E_ARGS:--n 20} \
		>>"$OUT/bench_e2e.md" 2>>"$OUT/bench_gpu.log" || { status=1; tail -5 "$OUT/bench_gpu.log"; }
done
# shellcheck disable=SC2086
for v in "" "-S 5000"; do
	echo "== bench_e2e_torch.py $v"
	echo "### bench_e2e_torch.py ${v:-(defaults)}" >>"$OUT/bench_torch.md"
	timeout 120 python3 tests/bench/bench_e2e_torch.py $v ${E2E_ARGS:--n 20} \
		>>"$OUT/bench_torch.md" 2>&1 || { status=1; tail -5 "$OUT/bench_torch.md"; }
done

echo "== summary"
grep -hE '^[0-9]+ passed|^SKIPPED|Failed|Error|:[0-9]+:[EF]:' "$OUT"/test_*.log | head -40
grep -hE '^###|^\| [0-9]+ tok|^\| (arrive|handled|submit|first|gpu|last|notify|done|reply|client|copy)' \
	"$OUT/bench_e2e.md" "$OUT/bench_torch.md"
grep -E '^\| [0-9]' "$OUT/bench_gpu.md" | head -40
grep -E '^\| (un)?batched' "$OUT/bench_layout.md" 2>/dev/null
echo "logs in $OUT; exit $status"
exit $status
