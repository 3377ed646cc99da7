#!/bin/bash
# File-tier benchmark: restores through the file tier against a raw
# O_DIRECT io_uring loop over the same files, cold and warm, the median of
# RUNS runs each; then the startup scan of SCAN_OBJECTS small objects.
#   tests/bench/file.sh [BUILD_DIR]      (make bench runs it)
# BENCH_DIR picks the filesystem (default $TMPDIR or /var/tmp); SIZES (KiB),
# TOTAL_MIB per size, RUNS, READERS, DEPTH and BUFFERED=1 tune the reads;
# SCAN_OBJECTS=1000000 measures the scan at its design size (8 GiB of disk).
set -euo pipefail
BUILD=${1:-build}
base=${BENCH_DIR:-${TMPDIR:-/var/tmp}}
dir=$(mktemp -d "$base/l3kv-bench-file-XXXXXX")
trap 'rm -rf "$dir"' EXIT

echo "filesystem: $(df -hT "$dir" | awk 'NR == 2 {print $1, $2, $3 " total,", $5 " free"}')"
echo "cpus: $(nproc), memory: $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r)"
[ "$(id -u)" = 0 ] || echo "note: not root: the page cache cannot be dropped; cold runs are skipped"

"$BUILD/bench_file" -d "$dir" -s "${SIZES:-2304,256,36}" -t "${TOTAL_MIB:-1024}" \
	-r "${RUNS:-3}" -R "${READERS:-2}" -q "${DEPTH:-32}" ${BUFFERED:+-b}
"$BUILD/bench_file" -d "$dir" -S "${SCAN_OBJECTS:-100000}" -l 4096
