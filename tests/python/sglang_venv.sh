#!/bin/sh
# Makes the virtual environment the python_sglang suite runs in:
#   tests/python/sglang_venv.sh VENV [PYTHON]
# SGLang 0.5.23 and torch 2.14.1 (the torch it pins), from PyPI, each
# package at the exact version tests/python/sglang-requirements.txt gives,
# installed with --no-deps: that list is the minimal set SGLang's
# mem_cache modules (its kv-only stack builder, host pools, storage
# threads, native page hash) need to import on a CPU-only host, not the
# 11 GB of `pip install sglang`. The wheels are downloaded into
# VENV/../sglang-wheels first and installed from there, so a second build
# of the venv downloads nothing (CI may keep that folder between runs).
#
# Where the venv cannot be made (no network, no `python3 -m venv`), the
# reason goes to VENV/SKIPPED and the script exits 0: the runner lists
# the suite as skipped with it, never as passed. VENV/.made marks a
# finished venv and holds the digest of the requirements it was made from:
# the venv is remade when their content changes (not their mtime, which a
# checkout or a second worktree sets anew). Runs that share one VENV (two
# `make check`s, SG_VENV pointing at another tree's venv) take turns under
# flock on VENV.lock, so one never installs over another.
set -u
venv=$1
py=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)
reqs=$here/sglang-requirements.txt
wheels=$(dirname "$venv")/sglang-wheels

digest=$(sha256sum < "$reqs" | cut -d' ' -f1)
made() {
	[ -f "$venv/.made" ] && [ "$(cat "$venv/.made")" = "$digest" ]
}
if made; then
	exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9> "$venv.lock"
flock 9
if made; then	# another run made it while this one waited
	exit 0
fi
skip() {
	mkdir -p "$venv"
	echo "the SGLang venv could not be made: $*" > "$venv/SKIPPED"
	echo "  venv    SKIPPED: $*"
	exit 0
}
rm -rf "$venv"
start=$(date +%s)
echo "  venv    $venv: sglang==0.5.23, torch==2.14.1 and what they import (wheels in $wheels)"
"$py" -m venv "$venv" > /dev/null 2>&1 || skip "$py -m venv failed (Debian: apt-get install python3-venv)"
log=$venv/pip.log
mkdir -p "$wheels"
install() {
	"$venv/bin/pip" install --disable-pip-version-check --no-deps --no-index \
		--progress-bar off --find-links "$wheels" -r "$reqs" >> "$log" 2>&1
}
: > "$log"
got=$start
# From the kept wheels alone when they are all there (no network needed), else download first.
if ! install; then
	"$venv/bin/pip" download --disable-pip-version-check --no-deps --progress-bar off \
		-d "$wheels" -r "$reqs" >> "$log" 2>&1 ||
		skip "pip download failed: $(grep -v '^ ' "$log" | tail -1)"
	got=$(date +%s)
	install || skip "pip install failed: $(grep -v '^ ' "$log" | tail -1)"
fi
"$venv/bin/python" -c "import sglang, torch" >> "$log" 2>&1 ||
	skip "the venv does not import sglang and torch: $(tail -1 "$log")"
end=$(date +%s)
echo "  venv    made in $((end - start)) s ($((got - start)) s to download" \
	"$(du -sh "$wheels" | cut -f1) of wheels), $(du -sh "$venv" | cut -f1) installed"
rm -f "$venv/SKIPPED"
echo "$digest" > "$venv/.made"
