#!/bin/sh
# Makes the virtual environment the python_sglang suite runs in:
#   tests/python/sglang_venv.sh VENV [PYTHON]
# SGLang 0.5.23 and torch 2.14.1 (the torch it pins), from PyPI, each
# package at the exact version tests/python/sglang-requirements.txt gives,
# installed with --no-deps: that list is the minimal set SGLang's
# mem_cache modules (its kv-only stack builder, host pools, storage
# threads, native page hash) need to import on a CPU-only host, not the
# 11 GB of `pip install sglang`. Wheels are cached in VENV/../pip-cache,
# so a second build of the venv downloads nothing.
#
# Where the venv cannot be made (no network, no `python3 -m venv`), the
# reason goes to VENV/SKIPPED and the script exits 0: the runner lists
# the suite as skipped with it, never as passed. VENV/.made marks a
# finished venv (remade when the requirements change).
set -u
venv=$1
py=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)
reqs=$here/sglang-requirements.txt
cache=$(dirname "$venv")/pip-cache

if [ -f "$venv/.made" ] && [ ! "$reqs" -nt "$venv/.made" ]; then
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
echo "  venv    $venv: sglang==0.5.23, torch==2.14.1 and what they import (cache $cache)"
"$py" -m venv "$venv" > /dev/null 2>&1 || skip "$py -m venv failed (Debian: apt-get install python3-venv)"
log=$venv/pip.log
PIP_CACHE_DIR=$cache "$venv/bin/pip" install --disable-pip-version-check --no-deps \
	--progress-bar off -r "$reqs" > "$log" 2>&1 ||
	skip "pip install failed: $(grep -v '^ ' "$log" | tail -1)"
"$venv/bin/python" -c "import sglang, torch" >> "$log" 2>&1 ||
	skip "the venv does not import sglang and torch: $(tail -1 "$log")"
end=$(date +%s)
echo "  venv    made in $((end - start)) s, $(du -sh "$venv" | cut -f1) installed," \
	"$(du -sh "$cache" 2>/dev/null | cut -f1) of wheels cached"
rm -f "$venv/SKIPPED"
touch "$venv/.made"
