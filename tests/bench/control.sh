#!/bin/bash
# Control-path benchmark: l3kvd PROBE and ADMIT+RELEASE against Redis
# EXISTS over a Unix socket, same key counts, 1 and 8 connections, the
# median of RUNS runs each, Redis and l3kv runs interleaved, all in one run
# on this machine.
#   tests/bench/control.sh [BUILD_DIR]   (make bench runs it)
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-3}
SECS=${SECS:-2}
dir=$(mktemp -d "${TMPDIR:-/tmp}/l3kv-bench-XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

cat > "$dir/l3kvd.json" <<JSON
{"socket": {"path": "$dir/l3kvd.sock", "mode": "0600"}, "log": {"level": "warn"},
 "tiers": {"dram": {"size": "1 GiB"}}, "limits": {"max_frame": "16 MiB"}}
JSON
"$BUILD/l3kvd" -f "$dir/l3kvd.json" 2>"$dir/l3kvd.log" &
redis-server --port 0 --unixsocket "$dir/redis.sock" --save "" --appendonly no \
	--daemonize no >"$dir/redis.log" 2>&1 &
for i in $(seq 100); do [ -S "$dir/l3kvd.sock" ] && [ -S "$dir/redis.sock" ] && break; sleep 0.05; done

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# 32-byte keys as 64 hex characters, like page hashes.
keys() { for i in $(seq 0 $(($1 - 1))); do printf '%064x ' "$i"; done; }

redis_once() {	# pages conns -> requests/s of one run
	local n=$1 c=$2 k reqs
	k=$(keys "$n")
	reqs=$(( n >= 4096 ? 4000 : n >= 1024 ? 10000 : 40000 ))
	# shellcheck disable=SC2086
	redis-benchmark -s "$dir/redis.sock" -c "$c" -n "$reqs" -q EXISTS $k 2>/dev/null |
		tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($i ~ /^[0-9.]+$/) v=$i} END {print v}'
}

l3kv_once() {	# op pages conns -> "ops p50 p99" of one run
	"$BUILD/bench_control" -s "$dir/l3kvd.sock" -o "$1" -p "$2" -c "$3" -t "$SECS" |
		sed 's/[a-z0-9_\/]*=//g' | awk '{print $4, $6, $7}'
}

# rtt (64 pages only: it sends none) is the round-trip floor: a RELEASE of
# no lease, answered not_found. Ops of the admit modes are ADMIT+RELEASE pairs.
printf '%-10s %5s %5s | %12s %12s %8s %8s | %12s %12s | %6s\n' op pages conns \
	"l3kv req/s" "keys/s" "p50 us" "p99 us" "redis req/s" "keys/s" ratio
for pages in 64 1024 4096; do
	# shellcheck disable=SC2046
	printf 'SET %s 1\n' $(keys "$pages") | redis-cli -s "$dir/redis.sock" >/dev/null
	ops_list="probe admit admit-nb admit-cork"
	[ "$pages" = 64 ] && ops_list="rtt $ops_list"
	for conns in 1 8; do
		# Runs interleave Redis and every l3kv mode, so that a disturbance
		# on this shared machine hits both sides of a ratio alike.
		rm -f "$dir"/run.*
		for _ in $(seq "$RUNS"); do
			redis_once "$pages" "$conns" >>"$dir/run.redis"
			for op in $ops_list; do
				l3kv_once "$op" "$pages" "$conns" >>"$dir/run.$op"
			done
		done
		rr=$(median <"$dir/run.redis")
		for op in $ops_list; do
			read -r ops p50 p99 < <(sort -g "$dir/run.$op" | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}')
			ratio=$(awk -v a="$ops" -v b="$rr" 'BEGIN {printf "%.2f", a / b}')
			printf '%-10s %5s %5s | %12.0f %12.0f %8s %8s | %12.0f %12.0f | %6s\n' "$op" \
			    "$pages" "$conns" "$ops" "$(awk -v a="$ops" -v p="$pages" 'BEGIN {print a*p}')" \
			    "$p50" "$p99" "$rr" "$(awk -v a="$rr" -v p="$pages" 'BEGIN {print a*p}')" "$ratio"
		done
	done
done
