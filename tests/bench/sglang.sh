#!/bin/sh
# SGLang HiCache L3 throughput: l3kv.sglang.L3kvStorage against HiCacheFile (bench_sglang.py).
# tests/bench/sglang.sh [BUILD [args...]]: BUILD defaults to build; the interpreter is
# $L3KV_SGLANG_PYTHON (as for the python_sglang suite), else BUILD/venv-sglang/bin/python
# (make check makes it). Exits 77 without one.
BUILD=${1:-build}
[ $# -gt 0 ] && shift
PY=${L3KV_SGLANG_PYTHON:-$BUILD/venv-sglang/bin/python}
if [ ! -x "$PY" ]; then
	echo "SKIP: no SGLang interpreter at $PY (make check builds $BUILD/venv-sglang)"
	exit 77
fi
L3KV_BUILD=$BUILD exec "$PY" "$(dirname "$0")/bench_sglang.py" "$@"
