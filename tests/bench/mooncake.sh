#!/bin/bash
# Mooncake's Transfer Engine over its TCP transport against fabric_read and
# raw fi_read, between two network namespaces (tests/bench/bench_mooncake.py).
# Makes its venv (BUILD_DIR/venv-mooncake, the one benchmark-only
# dependency: mooncake-transfer-engine-non-cuda, pinned) on first use.
#   tests/bench/mooncake.sh [BUILD_DIR]    (make bench runs it; 77: skipped)
# ROUNDS (5), DEPTH (16), MIB (256) as in tests/bench/fabric.sh; TE_PYTHON
# names a python that imports mooncake.engine already (no venv made).
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/../.."
TE_PIN=mooncake-transfer-engine-non-cuda==0.3.13.post1
if [ "$(id -u)" != 0 ]; then
	echo "SKIPPED bench_mooncake: network namespaces need root"
	exit 77
fi
venv=$BUILD/venv-mooncake
py=$venv/bin/python
if [ -n "${TE_PYTHON:-}" ]; then
	py=$TE_PYTHON
	"$py" -c 'import mooncake.engine' || { echo "SKIPPED bench_mooncake: $py cannot import mooncake.engine"; exit 77; }
elif ! "$py" -c 'import mooncake.engine' 2>/dev/null; then
	python3 -m venv "$venv"
	"$venv/bin/pip" install -q "$TE_PIN" || { echo "SKIPPED bench_mooncake: pip install $TE_PIN failed"; exit 77; }
fi
"$py" tests/bench/bench_mooncake.py --build "$BUILD" \
	--rounds "${ROUNDS:-5}" --depth "${DEPTH:-16}" --mib "${MIB:-256}"
