#!/bin/bash
# The peer tier's benchmark on a host with cores to spare (the 16-core GPU
# host: no NIC, so tcp;ofi_rxm between two network namespaces, or on
# loopback where the kernel has no veth or bridge), from the repository
# root. Builds nothing: the binaries are carried (tests/bench/GPU_NOTES.md).
#   1. tests/bench/peer.sh with TE=0 (no Mooncake venv there): peer restore,
#      raw fi_read and land (raw plus a peer restore's host work), median
#      of ROUNDS rounds, AHEAD requests admitted ahead;
#   2. with OLD set (a directory holding another l3kvd): bench_peer rounds
#      alternating BIN's daemons and OLD's, an A/B of the two daemons;
#      with AB_LANES set instead ("1 4"): bench_peer rounds alternating
#      those peer.lanes (-L) with BIN's daemons;
#   3. with FABRIC_E set ("1 2 4"): bench_fabric -e N for each (raw fi_read
#      on N endpoint pairs against fabric.c with N lanes), FABRIC_ROUNDS
#      rounds (3) of MIB each, where step 1 runs (namespaces or loopback).
#   BIN   bench_peer, bench_fabric, l3kvd, l3kvctl (default .carry/bin)
#   LIBS  extra shared libraries (default .carry/lib); IP a directory with
#         bin/ip and lib/ (default .carry/ip), used where ip is missing
#   WHL   a directory with mooncake-transfer-engine-non-cuda's wheel (the
#         pinned one, for this host's python): installed under $TMPDIR and
#         peer.sh runs with Mooncake's TE column (TE_PYTHON=python3)
#   OUT   logs go there when set; ROUNDS (3), AHEAD ("1 8"), LANES (1), MIB (128),
#         DRAM (512), WARM (256), AB_ROUNDS (3), AB_AHEAD (8); PROBE=1 has
#         the A/B's bench_peer measure PROBE round trips (-p); ROUNDS=0
#         skips step 1
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BIN=${BIN:-.carry/bin}
LIBS=${LIBS:-.carry/lib}
IP=${IP:-.carry/ip}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/l3kv-peer-XXXXXX")}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ! command -v ip >/dev/null 2>&1 && [ -x "$IP/bin/ip" ]; then
	export PATH="$PWD/$IP/bin:$PATH"
	export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/$IP/lib"
fi
echo "== host: $(nproc) cpus, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
ldd "$BIN/l3kvd" "$BIN/bench_peer" | grep 'not found' && echo "MISSING LIBRARIES"
mib=${MIB:-128}
dram=${DRAM:-512}
warm=${WARM:-256}
te=0
if [ -n "${WHL:-}" ]; then
	site=$(mktemp -d "${TMPDIR:-/tmp}/l3kv-site-XXXXXX")
	if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
	    --target "$site" "$WHL"/*.whl && PYTHONPATH=$site python3 -c 'import mooncake.engine'; then
		export PYTHONPATH=$site TE_PYTHON=python3
		te=1
	else
		echo "Mooncake TE does not load here: no TE column"
	fi
fi
if [ "${ROUNDS:-3}" = 0 ]; then
	echo "== ROUNDS=0: no peer.sh"
	where="-S tests/netns.sh"
	tests/netns.sh check >/dev/null || where="-l"
elif why=$(tests/netns.sh check); then
	echo "== peer.sh between two network namespaces (TE column: $te)"
	TE=$te ROUNDS=${ROUNDS:-3} AHEAD=${AHEAD:-1 8} LANES=${LANES:-1} MIB=$mib DRAM=$dram WARM=$warm \
	    timeout 540 tests/bench/peer.sh "$BIN" >"$OUT/peer.md" 2>&1
	echo "peer.sh: exit $?"
	tail -16 "$OUT/peer.md"
	where="-S tests/netns.sh"
else
	echo "== no network namespaces ($why): loopback"
	for r in $(seq 1 "${ROUNDS:-3}"); do
		"$BIN/bench_fabric" -r 1 -d 16 -m "$mib"
		"$BIN/bench_fabric" -L -r 1 -d 16 -m "$mib"
		for a in ${AHEAD:-1 8}; do
			"$BIN/bench_peer" -l -a "$a" -B "$BIN" -r 1 -m "$mib" -D "$dram" -W "$warm" -v |
			    sed "s/^peer 0 /peer $r a=$a /"
		done
	done >"$OUT/peer.md" 2>&1
	grep -E '^(peer|[0-9]+ (KiB|MiB))' "$OUT/peer.md" | head -60
	where="-l"
fi
if [ -n "${OLD:-}" ]; then
	echo "== A/B: $BIN/l3kvd against $OLD/l3kvd, ${AB_ROUNDS:-3} rounds, ${AB_AHEAD:-8} ahead"
	for r in $(seq 1 "${AB_ROUNDS:-3}"); do
		for b in "$BIN" "$OLD"; do
			# shellcheck disable=SC2086
			timeout 120 "$BIN/bench_peer" $where -a "${AB_AHEAD:-8}" -B "$b" -r 1 \
			    -m "$mib" -D "$dram" -W "$warm" ${PROBE:+-p} | sed -n "s|^peer 0 |$b $r |p"
		done
	done | tee "$OUT/ab.log"
elif [ -n "${AB_LANES:-}" ]; then
	echo "== A/B: peer.lanes $AB_LANES, ${AB_ROUNDS:-3} rounds, ${AB_AHEAD:-8} ahead"
	for r in $(seq 1 "${AB_ROUNDS:-3}"); do
		for l in $AB_LANES; do
			# shellcheck disable=SC2086
			timeout 150 "$BIN/bench_peer" $where -a "${AB_AHEAD:-8}" -B "$BIN" -L "$l" \
			    -r 1 -m "$mib" -D "$dram" -W "$warm" ${PROBE:+-p} |
			    sed -n "s|^peer 0 |lanes=$l $r |p"
		done
	done | tee "$OUT/ab.log"
fi
if [ -n "${FABRIC_E:-}" ]; then
	fw=-n
	[ "$where" = "-l" ] && fw=
	for e in $FABRIC_E; do
		echo "== bench_fabric $fw -e $e, ${FABRIC_ROUNDS:-3} rounds of $mib MiB"
		# shellcheck disable=SC2086
		timeout 150 "$BIN/bench_fabric" $fw -e "$e" -r "${FABRIC_ROUNDS:-3}" -d 16 -m "$mib" \
		    -S tests/netns.sh | tail -6
	done | tee "$OUT/fabric.log"
fi
