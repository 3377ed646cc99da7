#!/bin/bash
# File-tier benchmark: restores through the file tier against a raw
# O_DIRECT io_uring loop over the same files, cold and warm, the median of
# RUNS runs each; then the startup scan of SCAN_OBJECTS small objects; then
# write-through, PUBLISH_OBJECTS objects of 16 KiB through a real l3kvd.
#   tests/bench/file.sh [BUILD_DIR]      (make bench runs it)
# BENCH_DIR picks the filesystem (default $TMPDIR or /var/tmp); SIZES (KiB),
# TOTAL_MIB per size, RUNS, READERS, DEPTH, FD_CACHE (the tier's open-file
# cache, entries; 0 turns it off) and BUFFERED=1 tune the reads;
# SCAN_OBJECTS=1000000 measures the scan at its design size (8 GiB of disk).
#
# On the GPU host, as root (cold runs drop the page cache), one command
# also measures restores into GPU memory (bench_file --gpu: each batch of
# reads copied H2D from pinned staging, against raw reads + the same
# copies), with the binaries built here and carried (GPU_NOTES.md):
#   GPU=1 LD_LIBRARY_PATH=.carry/lib tests/bench/file.sh .carry/bin
# GPU=only skips the host-memory runs and the scan. Without a usable GPU
# the --gpu run says it skipped and exits 0.
set -euo pipefail
BUILD=${1:-build}
base=${BENCH_DIR:-${TMPDIR:-/var/tmp}}
dir=$(mktemp -d "$base/l3kv-bench-file-XXXXXX")
trap 'rm -rf "$dir"' EXIT

echo "filesystem: $(df -hT "$dir" | awk 'NR == 2 {print $1, $2, $3 " total,", $5 " free"}')"
echo "cpus: $(nproc), memory: $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r)," \
	"open files: $(ulimit -n)"
[ "$(id -u)" = 0 ] || echo "note: not root: the page cache cannot be dropped; cold runs are skipped"

args=(-d "$dir" -s "${SIZES:-2304,256,36}" -t "${TOTAL_MIB:-1024}" -r "${RUNS:-3}"
	-R "${READERS:-2}" -q "${DEPTH:-32}" ${FD_CACHE:+-F "$FD_CACHE"})
if [ "${GPU:-}" != only ]; then
	"$BUILD/bench_file" "${args[@]}" ${BUFFERED:+-b}
fi
if [ -n "${GPU:-}" ]; then
	"$BUILD/bench_file" --gpu "${args[@]}"
fi
if [ "${GPU:-}" != only ]; then
	"$BUILD/bench_file" -d "$dir" -S "${SCAN_OBJECTS:-100000}" -l 4096
	# Write-through: PUBLISH through a real l3kvd against the tier's own write
	# rate, with DRAM for every object, then with 64 MiB (publishes wait for writes).
	"$BUILD/bench_file" -d "$dir" -P "${PUBLISH_OBJECTS:-32768}" -l 16384
	"$BUILD/bench_file" -d "$dir" -P "${PUBLISH_OBJECTS:-32768}" -l 16384 -m 64
fi
