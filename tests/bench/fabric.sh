#!/bin/bash
# The peer tier's reads (issue 14): fabric_read against a raw fi_read loop
# on the same provider, on loopback and between two network namespaces of
# tests/netns.sh (root only; skipped with the reason otherwise).
#   tests/bench/fabric.sh [BUILD_DIR]      (make bench runs it)
# PROV (default tcp), ROUNDS (7), DEPTH (reads in flight, 16) and MIB (read
# per measurement, 256) tune it. Mooncake TE: tests/bench/mooncake.sh.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/../.."
args=(-p "${PROV:-tcp}" -r "${ROUNDS:-7}" -d "${DEPTH:-16}" -m "${MIB:-256}" -S tests/netns.sh)
echo "cpus: $(nproc), kernel $(uname -r), load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/bench_fabric" "${args[@]}"
if why=$(tests/netns.sh check); then
	"$BUILD/bench_fabric" -n "${args[@]}"
else
	echo "SKIPPED bench_fabric -n: $why"
fi
