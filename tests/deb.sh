#!/bin/sh
# The Debian packages, built and checked: the deb suite (tests/check_deb.c) runs
# `tests/deb.sh build DIR` once, then each check on DIR; each prints what it
# found and exits non-zero on the first thing that is wrong.
#
#   build DIR     copy the tree (what git tracks, plus files it does not ignore)
#                 to DIR/src, `make deb` there into DIR/out, unpack every .deb
#                 into DIR/root. The engine is the Makefile's choice: CUDA where
#                 nvcc is (it adds seconds, not minutes), the stub elsewhere (CI);
#                 $L3KV_DEB_PROFILES, e.g. pkg.l3kv.nocuda, is passed on.
#   contents DIR  the files each package must hold, the soname, the symlink
#   control DIR   fields resolved, Depends naming every library the binaries need
#   scripts DIR   conffiles, postinst; its sysusers step run in DIR/root makes l3kv
#   lintian DIR   no error from lintian (warnings and infos are printed)
#   run DIR       the unpacked daemon, l3kvctl, C library and Python client talk
#   user DIR      (root) the daemon as the package's user, with the unit's runtime
#                 directory, and who may connect: README.Debian's access rules
set -eu

cmd=$1
dir=$(cd "$2" && pwd)
src=$dir/src
out=$dir/out
root=$dir/root
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"

fail() {
	echo "FAIL: $*"
	exit 1
}

deb_of() {
	set -- "$out"/"$1"_*.deb
	[ -f "$1" ] || fail "no .deb for package ${1##*/}"
	echo "$1"
}

ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
version=$(dpkg-parsechangelog -l "$top/debian/changelog" -S Version)

case $cmd in
build)
	for t in dpkg-buildpackage dh lintian fakeroot; do
		command -v $t >/dev/null || fail "$t is not installed: \`make deps\` installs it"
	done
	mkdir -p "$src" "$out" "$root"
	if git rev-parse --git-dir >/dev/null 2>&1; then
		git ls-files -z -co --exclude-standard | xargs -0 cp -P --parents -t "$src" 2>/dev/null ||
			git ls-files -co --exclude-standard | while read -r f; do
				[ -e "$f" ] && cp -P --parents "$f" "$src"; done
	else
		tar -cf - --exclude=./.git --exclude=./build --exclude='./build-*' --exclude=./run \
		    --exclude=./debian/build --exclude=./debian/tmp . | tar -xf - -C "$src"
	fi
	# The runner's make (jobserver, variables) stays out of the package build.
	unset MAKEFLAGS MFLAGS MAKELEVEL
	start=$(date +%s)
	make -C "$src" --no-print-directory deb DEB_OUT="$out" DEB_PROFILES="${L3KV_DEB_PROFILES:-}" DEB_JOBS=2
	echo "make deb took $(($(date +%s) - start)) s"
	for d in "$out"/*.deb; do
		case $d in *-dbgsym_*) continue ;; esac
		dpkg-deb -x "$d" "$root"
	done
	;;

contents)
	# package: paths it must hold (dpkg-deb -c names them ./PATH)
	while read -r pkg paths; do
		list=$(dpkg-deb -c "$(deb_of "$pkg")" | awk '{ print $6 }')
		for p in $paths; do
			echo "$list" | grep -qx "./$p" || fail "$pkg lacks /$p"
		done
		echo "$pkg: $(echo "$paths" | wc -w) expected paths present"
	done <<-EOF
	l3kvd usr/sbin/l3kvd usr/bin/l3kvctl lib/systemd/system/l3kvd.service etc/l3kv/l3kvd.json usr/lib/sysusers.d/l3kv.conf usr/share/man/man8/l3kvd.8.gz usr/share/man/man1/l3kvctl.1.gz usr/share/man/man5/l3kvd.json.5.gz usr/share/l3kv/grafana-l3kv.json usr/share/doc/l3kvd/README.Debian usr/share/doc/l3kvd/copyright
	libl3kv1 usr/lib/$ma/libl3kv.so.1 usr/share/doc/libl3kv1/copyright
	libl3kv-dev usr/include/l3kv.h usr/lib/$ma/libl3kv.so usr/lib/$ma/libl3kv.a usr/lib/$ma/pkgconfig/l3kv.pc usr/share/man/man3/libl3kv.3.gz
	python3-l3kv usr/lib/python3/dist-packages/l3kv/__init__.py
	EOF
	# Every module of the tree's Python package, and nothing compiled at build time.
	list=$(dpkg-deb -c "$(deb_of python3-l3kv)" | awk '{ print $6 }')
	for f in "$top"/lib/python/l3kv/*.py; do
		echo "$list" | grep -qx "./usr/lib/python3/dist-packages/l3kv/${f##*/}" ||
			fail "python3-l3kv lacks l3kv/${f##*/}"
	done
	echo "$list" | grep -q '\.pyc$' && fail "python3-l3kv ships .pyc files"
	# The development symlink points at the runtime package's file, which has the soname.
	link=$(dpkg-deb -c "$(deb_of libl3kv-dev)" | awk '$6 == "./usr/lib/'"$ma"'/libl3kv.so" { print $8 }')
	[ "$link" = libl3kv.so.1 ] || fail "libl3kv.so -> '$link', not libl3kv.so.1"
	soname=$(readelf -d "$root/usr/lib/$ma/libl3kv.so.1" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
	[ "$soname" = libl3kv.so.1 ] || fail "libl3kv.so.1 has soname '$soname'"
	for b in usr/sbin/l3kvd usr/bin/l3kvctl; do
		[ -x "$root/$b" ] || fail "/$b is not executable"
	done
	# The unit as installed: paths of the package, the service user, no placeholder left.
	unit=$root/lib/systemd/system/l3kvd.service
	for l in 'ExecStart=/usr/sbin/l3kvd -f /etc/l3kv/l3kvd.json' \
	    'ExecStartPre=/usr/sbin/l3kvd -n -f /etc/l3kv/l3kvd.json' 'User=l3kv' 'Group=l3kv' \
	    'RuntimeDirectory=l3kvd'; do
		grep -qx "$l" "$unit" || fail "l3kvd.service lacks '$l'"
	done
	grep -q @ "$unit" && fail "l3kvd.service keeps a placeholder: $(grep @ "$unit")"
	# README.Debian names the engine of this build, and the binary agrees.
	note=$(tail -1 "$root/usr/share/doc/l3kvd/README.Debian")
	echo "README.Debian: $note"
	case $note in
	"This build: "*"CUDA kernels built"*)
		grep -q libcuda.so "$root/usr/sbin/l3kvd" || fail "README.Debian says CUDA, l3kvd has no cudart" ;;
	"This build: "*"kernel stub"*)
		grep -q libcuda.so "$root/usr/sbin/l3kvd" && fail "README.Debian says stub, l3kvd has cudart" ;;
	*)	fail "README.Debian does not end with the build's engine" ;;
	esac
	# A file in two packages would make them conflict.
	dup=$(for d in "$out"/*.deb; do dpkg-deb -c "$d" | awk '!/^d/ { print $6 }'; done | sort | uniq -d)
	[ -z "$dup" ] || fail "files in two packages: $dup"
	;;

control)
	for d in "$out"/*.deb; do
		f=$(dpkg-deb -f "$d")
		echo "$f" | grep -q '\${' && fail "${d##*/}: unresolved substitution: $(echo "$f" | grep '\${')"
		[ "$(dpkg-deb -f "$d" Version)" = "$version" ] || fail "${d##*/}: version is not $version"
	done
	dep() { dpkg-deb -f "$(deb_of "$1")" Depends; }
	echo "l3kvd Depends: $(dep l3kvd)"
	echo "libl3kv1 Depends: $(dep libl3kv1)"
	echo "libl3kv-dev Depends: $(dep libl3kv-dev)"
	echo "python3-l3kv Depends: $(dep python3-l3kv)"
	# shlibs: each library a binary needs is named by the package that ships it here.
	for b in l3kvd:usr/sbin/l3kvd l3kvd:usr/bin/l3kvctl libl3kv1:usr/lib/$ma/libl3kv.so.1; do
		pkg=${b%%:*}
		for lib in $(readelf -d "$root/${b#*:}" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
			owner=$(dpkg-query -S "*/$lib" 2>/dev/null | sed -n '1s/[:,].*//p')
			[ -n "$owner" ] || fail "no installed package ships $lib (needed by /${b#*:})"
			dep "$pkg" | tr ',|' '\n\n' | sed 's/^ *//; s/[ (:].*//' | grep -qx "$owner" ||
				fail "$pkg Depends lacks $owner, which ships $lib for /${b#*:}"
		done
	done
	dep l3kvd | grep -q 'systemd-sysusers' || fail "l3kvd does not depend on a systemd-sysusers"
	dep libl3kv-dev | grep -q "libl3kv1 (= $version)" || fail "libl3kv-dev: libl3kv1 not pinned"
	dep python3-l3kv | grep -q 'libl3kv1' || fail "python3-l3kv does not depend on libl3kv1"
	dep python3-l3kv | grep -q 'python3' || fail "python3-l3kv does not depend on python3"
	[ "$(dpkg-deb -f "$(deb_of python3-l3kv)" Architecture)" = all ] || fail "python3-l3kv is not arch all"
	# The symbols file covers every exported function.
	tmp=$dir/ctl-libl3kv1
	rm -rf "$tmp"
	dpkg-deb -e "$(deb_of libl3kv1)" "$tmp"
	grep -qx 'libl3kv 1 libl3kv1 (>= [^)]*)' "$tmp/shlibs" || fail "shlibs: $(cat "$tmp/shlibs")"
	n=0
	for s in $(nm -D --defined-only "$root/usr/lib/$ma/libl3kv.so.1" | awk '$2 == "T" { print $3 }'); do
		case $s in *@@L3KV_1) ;; *) fail "$s is not versioned L3KV_1" ;; esac
		grep -q "^ ${s%%@*}@L3KV_1 " "$tmp/symbols" || fail "symbols file lacks $s"
		n=$((n + 1))
	done
	[ $n -gt 10 ] || fail "only $n exported functions in libl3kv.so.1"
	echo "symbols: $n exported functions, all versioned L3KV_1 and listed"
	;;

scripts)
	tmp=$dir/ctl-l3kvd
	rm -rf "$tmp"
	dpkg-deb -e "$(deb_of l3kvd)" "$tmp"
	grep -qx /etc/l3kv/l3kvd.json "$tmp/conffiles" || fail "l3kvd.json is not a conffile"
	grep -q "systemd-sysusers .* l3kv.conf" "$tmp/postinst" || fail "postinst does not make the user"
	grep -q "deb-systemd-helper enable 'l3kvd.service'" "$tmp/postinst" || fail "postinst does not enable l3kvd"
	grep -q "deb-systemd-helper purge 'l3kvd.service'" "$tmp/postrm" || fail "postrm does not purge the unit's state"
	# The postinst's sysusers part, run as dpkg would on configure, into the unpacked root.
	sed -n '/by dh_installsysusers/,/End automatically added/p' "$tmp/postinst" > "$dir/sysusers.sh"
	[ -s "$dir/sysusers.sh" ] || fail "no dh_installsysusers section in postinst"
	rm -f "$root/etc/passwd" "$root/etc/group" "$root/etc/shadow" "$root/etc/gshadow"
	DPKG_ROOT=$root sh -e "$dir/sysusers.sh" configure ||
		fail "the postinst's systemd-sysusers failed"
	pw=$(grep '^l3kv:' "$root/etc/passwd") || fail "no l3kv in $root/etc/passwd"
	gr=$(grep '^l3kv:' "$root/etc/group") || fail "no l3kv in $root/etc/group"
	echo "passwd: $pw"
	echo "group: $gr"
	uid=$(echo "$pw" | cut -d: -f3)
	[ "$uid" -gt 0 ] && [ "$uid" -lt 1000 ] || fail "l3kv's uid $uid is not a system uid"
	[ "$(echo "$pw" | cut -d: -f4)" = "$(echo "$gr" | cut -d: -f3)" ] || fail "l3kv's group is not l3kv"
	[ "$(echo "$pw" | cut -d: -f7)" = /usr/sbin/nologin ] || fail "l3kv has a login shell"
	;;

lintian)
	# Everything it says is printed; it exits non-zero on an error or when it cannot run.
	rc=0
	lintian --fail-on error --display-info "$out"/*.changes > "$dir/lintian.log" 2>&1 || rc=$?
	cat "$dir/lintian.log"
	[ $rc = 0 ] || fail "lintian exited $rc"
	grep -q '^E: ' "$dir/lintian.log" && fail "lintian reports errors"
	echo "lintian: 0 errors, $(grep -c '^W: ' "$dir/lintian.log") warnings," \
	    "$(grep -c '^I: ' "$dir/lintian.log") infos"
	;;

run)
	l3kvd=$root/usr/sbin/l3kvd
	"$l3kvd" -V | grep -qx "l3kvd $version (protocol [0-9]*)" || fail "l3kvd -V: $("$l3kvd" -V)"
	"$l3kvd" -n -f "$root/etc/l3kv/l3kvd.json" | grep -qx 'configuration OK' ||
		fail "the packaged config does not load"
	grep -q "^version = \"$version\"" "$top/lib/python/pyproject.toml" ||
		fail "pyproject.toml's version is not the package's $version"
	rm -rf "$dir/r" && mkdir -p "$dir/r"
	sock=$dir/r/l3kvd.sock
	python3 - "$root/etc/l3kv/l3kvd.json" "$dir/r/l3kvd.json" "$sock" <<-'EOF'
	import json, sys
	c = json.load(open(sys.argv[1]))
	c["socket"]["path"] = sys.argv[3]
	c["tiers"]["dram"]["size"] = "8 MiB"
	c["copy_engine"] = "host"
	json.dump(c, open(sys.argv[2], "w"))
	EOF
	"$l3kvd" -f "$dir/r/l3kvd.json" 2>"$dir/r/l3kvd.log" &
	pid=$!
	trap 'kill $pid 2>/dev/null || true' EXIT
	i=0
	while [ ! -S "$sock" ]; do
		i=$((i + 1))
		[ $i -lt 100 ] && kill -0 $pid 2>/dev/null || fail "l3kvd did not start: $(cat "$dir/r/l3kvd.log")"
		sleep 0.1
	done
	"$root/usr/bin/l3kvctl" -s "$sock" health > "$dir/r/health.json" || fail "l3kvctl health failed"
	grep -q '"status": "ok"' "$dir/r/health.json" || fail "l3kvctl health: $(cat "$dir/r/health.json")"
	echo "l3kvctl health: ok"
	# C, through the -dev package's pkg-config file, against the runtime package's library.
	cat > "$dir/r/hello.c" <<-'EOF'
	#include <stdio.h>
	#include <string.h>
	#include <l3kv.h>

	int
	main(int argc, char **argv)
	{
		struct l3kv	*k;
		char		*json;

		if (argc != 2 || strcmp(l3kv_version(), L3KV_LIB_VERSION) != 0)
			return 2;
		if (l3kv_connect(argv[1], 5000, &k) != 0 || l3kv_health(k, &json) != 0)
			return 1;
		printf("%s\n", json);
		l3kv_free(json);
		l3kv_close(k);
		return 0;
	}
	EOF
	export PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_LIBDIR="$root/usr/lib/$ma/pkgconfig"
	[ "$(pkg-config --modversion l3kv)" = "$version" ] || fail "l3kv.pc: version $(pkg-config --modversion l3kv)"
	flags=$(pkg-config --cflags --libs l3kv)
	echo "pkg-config --cflags --libs l3kv: $flags"
	# shellcheck disable=SC2086
	cc -o "$dir/r/hello" "$dir/r/hello.c" $flags || fail "cannot build against libl3kv-dev"
	unset PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_LIBDIR
	LD_LIBRARY_PATH=$root/usr/lib/$ma "$dir/r/hello" "$sock" > "$dir/r/hello.out" ||
		fail "the C client failed ($?)"
	grep -q '"status": *"ok"' "$dir/r/hello.out" || fail "C client: $(cat "$dir/r/hello.out")"
	LD_LIBRARY_PATH=$root/usr/lib/$ma ldd "$dir/r/hello" | grep -q "$root/usr/lib/$ma/libl3kv.so.1" ||
		fail "the C client did not link the packaged libl3kv.so.1"
	echo "C client via pkg-config: ok"
	# Python: the packaged module, loading the packaged library through the system loader.
	env -u L3KV_LIB PYTHONPATH="$root/usr/lib/python3/dist-packages" LD_LIBRARY_PATH="$root/usr/lib/$ma" \
	    python3 -I -B -c '
import sys
sys.path.insert(0, sys.argv[2])
import l3kv
assert l3kv.__file__.startswith(sys.argv[1]), l3kv.__file__
c = l3kv.Client(sys.argv[3])
assert c.health()["status"] == "ok"
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libl3kv" in l]
assert maps and all(m.startswith(sys.argv[1]) for m in maps), maps
print("python client: ok, module", l3kv.__file__, "library", maps[0])
' "$root" "$root/usr/lib/python3/dist-packages" "$sock" || fail "the Python client failed"
	kill -TERM $pid
	wait $pid || fail "l3kvd exited $? on SIGTERM"
	trap - EXIT
	;;

user)
	[ "$(id -u)" = 0 ] || fail "needs root (to switch to the package's user)"
	pw=$(grep '^l3kv:' "$root/etc/passwd") || fail "run the scripts check first: no l3kv user in $root"
	uid=$(echo "$pw" | cut -d: -f3)
	gid=$(echo "$pw" | cut -d: -f4)
	# A user with neither the uid nor the group, and one in the group but not allowed.
	other=65534
	stranger=65533
	chmod 0711 "$dir"
	rm -rf "$dir/u" && mkdir -m 0711 "$dir/u"
	# What RuntimeDirectory=l3kvd with RuntimeDirectoryMode=0750 makes, as User=/Group=.
	install -d -m 0750 -o "$uid" -g "$gid" "$dir/u/run"
	sock=$dir/u/run/l3kvd.sock
	python3 - "$root/etc/l3kv/l3kvd.json" "$dir/u/l3kvd.json" "$sock" "$other" <<-'EOF'
	import json, sys
	c = json.load(open(sys.argv[1]))
	c["socket"]["path"] = sys.argv[3]
	c["access"]["allow_uids"] = [int(sys.argv[4])]
	c["tiers"]["dram"]["size"] = "8 MiB"
	c["copy_engine"] = "host"
	json.dump(c, open(sys.argv[2], "w"))
	EOF
	chmod 0644 "$dir/u/l3kvd.json"
	# As the unit: limits first (LimitMEMLOCK=infinity), then User= and Group=. A container
	# without CAP_SYS_RESOURCE cannot raise the hard limit; the host engine does not lock memory.
	lim="prlimit --memlock=unlimited:unlimited"
	if ! $lim true 2>/dev/null; then
		echo "note: cannot raise RLIMIT_MEMLOCK here; the daemon runs with $(ulimit -l) KiB"
		lim=
	fi
	$lim setpriv --reuid="$uid" --regid="$gid" --clear-groups \
	    "$root/usr/sbin/l3kvd" -f "$dir/u/l3kvd.json" 2>"$dir/u/l3kvd.log" &
	pid=$!
	trap 'kill $pid 2>/dev/null || true' EXIT
	i=0
	while [ ! -S "$sock" ]; do
		i=$((i + 1))
		[ $i -lt 100 ] && kill -0 $pid 2>/dev/null || fail "l3kvd did not start as l3kv: $(cat "$dir/u/l3kvd.log")"
		sleep 0.1
	done
	[ "$(stat -c '%u:%g %a' "$sock")" = "$uid:$gid 660" ] ||
		fail "socket is $(stat -c '%u:%g %a' "$sock"), not $uid:$gid 660"
	[ "$(stat -c %u /proc/$pid)" = "$uid" ] || fail "l3kvd does not run as uid $uid"
	echo "l3kvd runs as l3kv ($uid:$gid); socket $uid:$gid 0660 in a 0750 directory"
	ctl=$root/usr/bin/l3kvctl
	"$ctl" -s "$sock" health >/dev/null || fail "root cannot connect"
	echo "root: allowed"
	ctl_as() { u=$1; shift; setpriv --reuid="$u" --regid="$u" "$@" "$ctl" -s "$sock" health; }
	# The kernel refuses the first (the daemon never sees it); the daemon denies the second.
	if ctl_as $other --clear-groups >"$dir/u/o1" 2>&1; then fail "uid $other outside the group connected"; fi
	grep -q "uid $other" "$dir/u/l3kvd.log" && fail "uid $other reached the daemon: $(cat "$dir/u/l3kvd.log")"
	echo "uid $other, not in group l3kv: refused by the directory's mode ($(head -1 "$dir/u/o1"))"
	if ctl_as $stranger --groups="$gid" >"$dir/u/o2" 2>&1; then fail "uid $stranger, not allowed, connected"; fi
	grep -q "denied pid [0-9]* uid $stranger " "$dir/u/l3kvd.log" ||
		fail "uid $stranger was not denied by the daemon: $(cat "$dir/u/o2" "$dir/u/l3kvd.log")"
	echo "uid $stranger, in group l3kv, not in access.allow_uids: denied by l3kvd"
	ctl_as $other --groups="$gid" >"$dir/u/o3" 2>&1 || fail "uid $other, in the group and allowed: $(cat "$dir/u/o3")"
	echo "uid $other, in group l3kv and access.allow_uids: allowed"
	kill -TERM $pid
	wait $pid || fail "l3kvd exited $? on SIGTERM"
	trap - EXIT
	;;

*)
	fail "usage: tests/deb.sh build|contents|control|scripts|lintian|run|user DIR"
	;;
esac
