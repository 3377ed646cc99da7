#!/bin/bash
# The peer tier's restore (issue 14) against raw fi_read and Mooncake TE,
# all three between two network namespaces of tests/netns.sh, in one run:
# each round runs one bench_peer round (ADMIT to READY on B of objects
# published on A, fresh daemons per size) and one bench_mooncake.py round
# (a TE pass and a bench_fabric -n round: raw fi_read), their order
# alternating; the table gives the medians of the rounds and the medians
# of the per-round ratios peer/raw and peer/TE. Each round also runs
# bench_fabric -n -L: raw fi_read with every read landed as a peer restore
# into host memory must (its checksum, then a copy into other pages), the
# floor of what the tier can reach on a machine without a GPU; peer/land
# is the ratio against it.
#   tests/bench/peer.sh [BUILD_DIR]        (make bench runs it; 77: skipped)
# ROUNDS (5), MIB (per measurement, 64), DEPTH (raw and TE reads in
# flight, 16), DRAM (each daemon's MiB, 256), WARM (MiB published on each
# daemon before measuring, 256), AHEAD (bench_peer -a: requests admitted
# ahead, 1: one at a time) tune it. AHEAD may be a list ("1 4"): each
# round then runs one bench_peer round per value, their order rotating,
# and the table has rows for each value, paired with the same raw and TE
# rounds. LANES (1) is both daemons' peer.lanes (bench_peer -L); raw, land
# and TE stay one reader each. TE=0 leaves Mooncake out (its TE column is
# nan): raw comes from a bench_fabric -n round instead; PEER_BUILD names the
# directory of the daemons bench_peer starts (BUILD by default), for an A/B
# of two daemons.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/../.."
if [ "$(id -u)" != 0 ]; then
	echo "SKIPPED bench_peer: network namespaces need root"
	exit 77
fi
if ! why=$(tests/netns.sh check); then
	echo "SKIPPED bench_peer: $why"
	exit 77
fi
rounds=${ROUNDS:-5}
mib=${MIB:-64}
read -r -a ahead <<<"${AHEAD:-1}"
for a in "${ahead[@]}"; do
	[[ $a =~ ^[1-9][0-9]*$ ]] || { echo "peer.sh: AHEAD: $a is not a count" >&2; exit 2; }
done
out=$(mktemp -d "${TMPDIR:-/tmp}/l3kv-peer-bench.XXXXXX")
trap 'rm -rf "$out"' EXIT
# One bench_peer round per AHEAD value, starting with the round's turn.
peer_round() {
	local i a
	for ((i = 0; i < ${#ahead[@]}; i++)); do
		a=${ahead[(i + $1) % ${#ahead[@]}]}
		"$BUILD/bench_peer" -a "$a" -L "${LANES:-1}" -B "${PEER_BUILD:-$BUILD}" -r 1 -m "$mib" \
		    -D "${DRAM:-256}" -W "${WARM:-256}" -S tests/netns.sh -v |
		    sed -n "s/^peer 0 /peer $1 a=$a /p" >>"$out/peer"
	done
}
te_round() {
	if [ "${TE:-1}" = 0 ]; then
		# No Transfer Engine (a host without its venv): raw fi_read alone, TE "nan".
		"$BUILD/bench_fabric" -n -r 1 -d "${DEPTH:-16}" -m "$mib" -S tests/netns.sh |
		    awk -F'  +' '/ (object|coalesced) /{print $1 " nan " $2}' >"$out/te.$1"
		return
	fi
	ROUNDS=1 MIB=$mib DEPTH=${DEPTH:-16} tests/bench/mooncake.sh "$BUILD" >"$out/te.$1" || {
		rc=$?
		cat "$out/te.$1"
		exit $rc
	}
}
land_round() {
	"$BUILD/bench_fabric" -n -L -r 1 -d "${DEPTH:-16}" -m "$mib" -S tests/netns.sh \
	    >"$out/land.$1"
}
echo "cpus: $(nproc), kernel $(uname -r), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "setup: $rounds rounds, $mib MiB per measurement, raw and TE ${DEPTH:-16} reads in flight," \
    "bench_peer ${ahead[*]} request(s) admitted ahead (AHEAD), ${LANES:-1} lane(s)," \
    "${DRAM:-256} MiB of DRAM" \
    "and ${WARM:-256} MiB published on each daemon first"
for ((r = 0; r < rounds; r++)); do
	if ((r % 2 == 0)); then
		peer_round "$r"
		te_round "$r"
		land_round "$r"
	else
		land_round "$r"
		te_round "$r"
		peer_round "$r"
	fi
	echo "round $r done, load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
echo "per round (bench_peer -v):"
cat "$out/peer"
python3 - "$out" "$rounds" "${ahead[@]}" <<'PY'
import os, re, statistics, sys
out, rounds, aheads = sys.argv[1], int(sys.argv[2]), [int(a) for a in sys.argv[3:]]
labels = ["36 KiB object", "256 KiB object", "2.25 MiB object", "1 MiB coalesced", "8 MiB coalesced"]
peer = {}
for line in open(os.path.join(out, "peer")):
    m = re.match(r"peer (\d+) a=(\d+) (.+?) ([0-9.]+)", line)
    peer[(int(m.group(1)), int(m.group(2)), m.group(3))] = float(m.group(4))
te, raw, land = {}, {}, {}
for r in range(rounds):
    for line in open(os.path.join(out, "te.%d" % r)):
        for l in labels:
            if line.startswith(l + " "):
                f = line[len(l):].split()
                te[(r, l)], raw[(r, l)] = float(f[0]), float(f[1])
    for line in open(os.path.join(out, "land.%d" % r)):
        for l in labels:
            if line.startswith(l + " "):
                land[(r, l)] = float(line[len(l):].split()[0])
if len(land) != rounds * len(labels):
    sys.exit("peer.sh: cannot parse bench_fabric -L's output")
med = statistics.median
rs = range(rounds)
for a in aheads:
    print("AHEAD=%d" % a)
    print("%-18s %10s %9s %9s %8s %9s %9s %8s" % ("size", "peer GB/s", "raw GB/s", "land GB/s",
                                                   "TE GB/s", "peer/raw", "peer/land", "peer/TE"))
    for l in labels:
        print("%-18s %10.2f %9.2f %9.2f %8.2f %8.2fx %8.2fx %7.2fx" % (
            l, med([peer[(r, a, l)] for r in rs]), med([raw[(r, l)] for r in rs]),
            med([land[(r, l)] for r in rs]), med([te[(r, l)] for r in rs]),
            med([peer[(r, a, l)] / raw[(r, l)] for r in rs]),
            med([peer[(r, a, l)] / land[(r, l)] for r in rs]),
            med([peer[(r, a, l)] / te[(r, l)] for r in rs])))
PY
