#!/bin/sh
# tests/netns.sh: N network namespaces joined by veth pairs to a bridge, for
# tests and benchmarks that need daemons on separate "nodes" (issue 14).
# Needs root and iproute2. Nothing is created in the caller's namespace: the
# bridge lives in a namespace of its own (PREFIX-hub), and every address is
# inside the namespaces, so the host's interfaces and routes are untouched.
#
#   tests/netns.sh check              0 if namespaces can be made here; else
#                                     prints why and exits 77
#   tests/netns.sh prefix [PID]       prints a fresh prefix: l3kvt<PID>x<random>,
#                                     PID the owner (default: the caller);
#                                     `clean` deletes sets whose owner is gone,
#                                     so name the process that lives as long
#                                     as the set (a test passes its own pid)
#   tests/netns.sh up PREFIX N        namespaces PREFIX-1 .. PREFIX-N, each with
#                                     lo up and eth0 = 10.77.0.K/24, joined by
#                                     the bridge br0 in PREFIX-hub (first
#                                     removes stale sets, see clean)
#   tests/netns.sh addr K             prints node K's address (10.77.0.K)
#   tests/netns.sh exec PREFIX K CMD [ARG...]
#                                     runs CMD in node K (ip netns exec); a
#                                     C test may setns(2) into
#                                     /run/netns/PREFIX-K instead
#                                     (test_netns_enter, tests/util.c)
#   tests/netns.sh link PREFIX K down|up
#                                     cuts node K off the bridge (its hub-side
#                                     veth; eth0 loses carrier) or restores it
#   tests/netns.sh down PREFIX        deletes the set (its veths go with it)
#   tests/netns.sh clean              deletes every set l3kvt<pid>x... whose
#                                     pid is no longer running (a crashed test)
#
# Example, three daemons on three nodes:
#   p=$(tests/netns.sh prefix); tests/netns.sh up $p 3
#   tests/netns.sh exec $p 1 build/l3kvd -f node1.json &   # listens on 10.77.0.1
#   ...; tests/netns.sh link $p 2 down; ...; tests/netns.sh down $p
#
# Exit status: 0, 1 on a failure (with a message on stderr), 2 on bad usage,
# 77 from check when namespaces cannot be made here.
set -u

SUBNET=10.77.0

die() {
	echo "netns.sh: $*" >&2
	exit 1
}

usage() {
	echo "usage: netns.sh check | prefix | up PREFIX N | addr K | exec PREFIX K CMD... |" \
	    "link PREFIX K down|up | down PREFIX | clean" >&2
	exit 2
}

valid_prefix() {
	case "$1" in
	l3kvt[0-9]*x[0-9a-z]*) ;;
	*) die "bad prefix '$1' (use: netns.sh prefix)" ;;
	esac
	# Interface names are not made from it, but keep namespace names short and plain.
	[ ${#1} -le 40 ] || die "prefix '$1' is too long"
	case "$1" in
	*[!0-9a-z]*) die "bad prefix '$1'" ;;
	esac
}

valid_k() {
	case "$1" in
	''|*[!0-9]*) die "bad node number '$1'" ;;
	esac
	[ "$1" -ge 1 ] && [ "$1" -le 250 ] || die "node number $1 is out of range [1, 250]"
}

# Namespaces of a set (PREFIX-hub included).
members() {
	ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(hub|[0-9]+)\$"
}

down() {
	valid_prefix "$1"
	for ns in $(members "$1"); do
		ip netns delete "$ns" 2>/dev/null || true
	done
	[ -z "$(members "$1")" ] || die "could not delete every namespace of $1"
}

clean() {
	for p in $(ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^\(l3kvt[0-9]*x[0-9a-z]*\)-.*/\1/p' |
	    sort -u); do
		pid=$(echo "$p" | sed 's/^l3kvt\([0-9]*\)x.*/\1/')
		if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
			down "$p"
		fi
	done
}

up() {
	valid_prefix "$1"
	case "$2" in
	''|*[!0-9]*) die "bad node count '$2'" ;;
	esac
	[ "$2" -ge 1 ] && [ "$2" -le 250 ] || die "node count $2 is out of range [1, 250]"
	clean
	[ -z "$(members "$1")" ] || die "set $1 already exists"
	hub="$1-hub"
	ip netns add "$hub" || die "ip netns add $hub failed"
	ip -n "$hub" link set lo up &&
	    ip -n "$hub" link add br0 type bridge &&
	    ip -n "$hub" link set br0 up || { down "$1"; die "bridge in $hub failed"; }
	k=1
	while [ "$k" -le "$2" ]; do
		ns="$1-$k"
		ip netns add "$ns" &&
		    ip -n "$hub" link add "v$k" type veth peer name eth0 netns "$ns" &&
		    ip -n "$hub" link set "v$k" master br0 &&
		    ip -n "$hub" link set "v$k" up &&
		    ip -n "$ns" link set lo up &&
		    ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0 &&
		    ip -n "$ns" link set eth0 up || { down "$1"; die "node $k of $1 failed"; }
		k=$((k + 1))
	done
	# The bridge forwards once its ports leave the learning states; wait for each node's link.
	k=1
	while [ "$k" -le "$2" ]; do
		n=0
		until ip -n "$1-$k" -o link show eth0 | grep -q 'state UP'; do
			n=$((n + 1))
			[ "$n" -le 100 ] || { down "$1"; die "node $k's eth0 never came up"; }
			sleep 0.05
		done
		k=$((k + 1))
	done
}

link() {
	valid_prefix "$1"
	valid_k "$2"
	case "$3" in
	down|up) ip -n "$1-hub" link set "v$2" "$3" || die "link $2 $3 failed" ;;
	*) usage ;;
	esac
}

check() {
	if [ "$(id -u)" != 0 ]; then
		echo "network namespaces need root"
		exit 77
	fi
	command -v ip >/dev/null 2>&1 || { echo "no ip (iproute2)"; exit 77; }
	p="l3kvt$$x0probe"
	if ! out=$(ip netns add "$p-hub" 2>&1); then
		echo "ip netns add failed: $out"
		exit 77
	fi
	if ! out=$(ip -n "$p-hub" link add br0 type bridge 2>&1); then
		ip netns delete "$p-hub"
		echo "no bridge device in a namespace: $out"
		exit 77
	fi
	if ! out=$(ip -n "$p-hub" link add v1 type veth peer name eth0 2>&1); then
		ip netns delete "$p-hub"
		echo "no veth pair in a namespace: $out"
		exit 77
	fi
	ip netns delete "$p-hub"
	exit 0
}

[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
check) check ;;
prefix) [ $# -le 1 ] || usage; echo "l3kvt${1:-$PPID}x$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')" ;;
up) [ $# -eq 2 ] || usage; up "$1" "$2" ;;
addr) [ $# -eq 1 ] || usage; valid_k "$1"; echo "$SUBNET.$1" ;;
exec) [ $# -ge 3 ] || usage; valid_prefix "$1"; valid_k "$2"; ns="$1-$2"; shift 2
	exec ip netns exec "$ns" "$@" ;;
link) [ $# -eq 3 ] || usage; link "$1" "$2" "$3" ;;
down) [ $# -eq 1 ] || usage; down "$1" ;;
clean) [ $# -eq 0 ] || usage; clean ;;
*) usage ;;
esac
