#!/bin/bash
# What /metrics costs the engine socket: PROBE and ADMIT+RELEASE rates of an
# l3kvd without metrics.listen (the baseline) against one serving it and
# scraped SCRAPE_HZ times a second (and one scraped back to back), same
# daemon build, runs interleaved, the median of RUNS runs each; and the time
# of one scrape (curl's time_total, median).
#   tests/bench/metrics.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
RUNS=${RUNS:-5}
SECS=${SECS:-2}
SCRAPE_HZ=${SCRAPE_HZ:-10}
CONNS=${CONNS:-8}
dir=$(mktemp -d "${TMPDIR:-/tmp}/l3kv-bench-XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for d in off on; do
	mkdir -p "$dir/$d"
	listen=""
	[ "$d" = on ] && listen="127.0.0.1:$port"
	cat > "$dir/$d/l3kvd.json" <<JSON
{"socket": {"path": "$dir/$d/l3kvd.sock", "mode": "0600"}, "log": {"level": "warn"},
 "tiers": {"dram": {"size": "1 GiB"}}, "metrics": {"listen": "$listen"}}
JSON
	"$BUILD/l3kvd" -f "$dir/$d/l3kvd.json" 2>"$dir/$d/l3kvd.log" &
done
for i in $(seq 100); do [ -S "$dir/off/l3kvd.sock" ] && [ -S "$dir/on/l3kvd.sock" ] && break; sleep 0.05; done

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

once() {	# sock op -> ops/s of one run
	"$BUILD/bench_control" -s "$1" -o "$2" -p 64 -c "$CONNS" -t "$SECS" |
		sed 's/[a-z0-9_\/]*=//g' | awk '{print $4}'
}

scraper() {	# hz (0: back to back) until killed
	while :; do
		curl -s -o /dev/null "http://127.0.0.1:$port/metrics" || true
		[ "$1" = 0 ] || sleep "$(awk -v h="$1" 'BEGIN {print 1 / h}')"
	done
}

run_mode() {	# mode op -> appends one run's ops/s to run.MODE
	case $1 in
	off)	once "$dir/off/l3kvd.sock" "$2" >>"$dir/run.off" ;;
	idle)	once "$dir/on/l3kvd.sock" "$2" >>"$dir/run.idle" ;;
	hz)	scraper "$SCRAPE_HZ" & s=$!
		once "$dir/on/l3kvd.sock" "$2" >>"$dir/run.hz"
		kill $s; wait $s 2>/dev/null || true ;;
	b2b)	scraper 0 & s=$!
		once "$dir/on/l3kvd.sock" "$2" >>"$dir/run.b2b"
		kill $s; wait $s 2>/dev/null || true ;;
	esac
}

# off: no metrics.listen (the baseline); idle: serving, not scraped; hz:
# scraped SCRAPE_HZ times a second; b2b: scraped back to back by one curl.
# Each round runs the modes in a rotated order, so that neither daemon
# always runs first after the other's scraper.
printf '%-6s | %10s | %10s %6s | %10s %6s | %10s %6s\n' op "off req/s" "idle" ratio \
	"${SCRAPE_HZ}/s" ratio "b2b" ratio
for op in probe admit; do
	rm -f "$dir"/run.*
	modes=(off idle hz b2b)
	for r in $(seq "$RUNS"); do
		for k in 0 1 2 3; do
			run_mode "${modes[$(( (k + r) % 4 ))]}" "$op"
		done
	done
	off=$(median <"$dir/run.off")
	line=$(printf '%-6s | %10.0f' "$op" "$off")
	for m in idle hz b2b; do
		v=$(median <"$dir/run.$m")
		line="$line | $(printf '%10.0f %6.2f' "$v" "$(awk -v a="$v" -v b="$off" 'BEGIN {print a / b}')")"
	done
	echo "$line"
done
for _ in $(seq 21); do
	curl -s -o /dev/null -w '%{time_total} %{size_download}\n' "http://127.0.0.1:$port/metrics"
done >"$dir/scrapes"
printf 'one scrape: %s s (median of 21), %s bytes\n' "$(awk '{print $1}' "$dir/scrapes" | median)" \
	"$(awk '{print $2}' "$dir/scrapes" | median)"
