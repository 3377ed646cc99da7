#!/bin/bash
# GPU data-path benchmark (issue 5) on a GPU host: restore and publish
# through the cuda copy engine against pinned cudaMemcpy, one copy per
# page and one per (page, layer), as markdown tables on stdout.
#   tests/bench/gpu.sh [BIN_DIR] [bench_gpu options]   (BIN_DIR: build)
# bench_gpu -h lists the options (-r RUNS, -m MIB_PER_RUN, -s SIZES).
set -euo pipefail
BIN=${1:-build}
[ $# -gt 0 ] && shift
if command -v nvidia-smi >/dev/null; then
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current,clocks.sm,clocks.mem \
		--format=csv,noheader | sed 's/^/gpu: /' >&2 || true
fi
exec "$BIN/bench_gpu" "$@"
