#!/usr/bin/env python3
"""Mooncake's Transfer Engine (TE) against fabric.c, between two nodes of
tests/netns.sh (issue 14's benchmark (b)).

TE runs its TCP transport in P2P handshake mode (metadata server
"P2PHANDSHAKE": no etcd or HTTP metadata server; a reader names its
target as host:rpc_port). A TE owner in node 1 registers 64 MiB; a TE
reader in node 2 reads spans of it with batch_transfer_sync_read, DEPTH
spans per batch (TE runs a batch's transfers together; the batch is its
unit of submission, as in Mooncake's own transfer_engine_bench).

Each round runs, in alternating order, the TE reader over every size and
one round of build/bench_fabric -n (raw fi_read and fabric_read between
its own pair of nodes, same topology), and the figures are paired per
round: per size the median GB/s of each and the median of the per-round
ratios fabric/TE and raw/TE.

  bench_mooncake.py [--build BUILD] [--rounds N] [--depth D] [--mib M]
  bench_mooncake.py serve HOST          (internal: the TE owner)
  bench_mooncake.py worker HOST TARGET  (internal: the TE reader)

Needs root (namespaces) and the TE wheel in the venv that runs this
(tests/bench/mooncake.sh makes it). Not part of make check.
"""

import argparse
import ctypes
import json
import mmap
import os
import statistics
import subprocess
import sys
import time

SIZES = [
    ("36 KiB object", 36 << 10),
    ("256 KiB object", 256 << 10),
    ("2.25 MiB object", 2304 << 10),
    ("1 MiB coalesced", 1 << 20),
    ("8 MiB coalesced", 8 << 20),
]
BUF_LEN = 64 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
NETNS = os.path.join(HERE, "..", "netns.sh")


def te_open(host):
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    rc = te.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        sys.exit("bench_mooncake: TE initialize on %s failed: %d" % (host, rc))
    buf = mmap.mmap(-1, BUF_LEN)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    rc = te.register_memory(addr, BUF_LEN)
    if rc != 0:
        sys.exit("bench_mooncake: TE register_memory failed: %d" % rc)
    return te, buf, addr


def serve(host):
    te, buf, addr = te_open(host)
    buf[:] = b"\x5a" * BUF_LEN
    print(json.dumps({"target": "%s:%d" % (host, te.get_rpc_port()), "addr": addr}), flush=True)
    sys.stdin.read()  # until the orchestrator closes our stdin


def worker(host, target, raddr):
    """Reads `len n depth` lines; answers each with the GB/s of n reads of len."""
    te, buf, addr = te_open(host)
    # Warm up: the first contact, page faults; checked once.
    rc = te.transfer_sync_read(target, addr, raddr, 1 << 20)
    if rc != 0 or buf[12345] != 0x5a:
        sys.exit("bench_mooncake: TE warm-up read failed: %d" % rc)
    print("ready", flush=True)
    for line in sys.stdin:
        length, n, depth = (int(x) for x in line.split())
        slots = BUF_LEN // length
        t0 = time.monotonic()
        done = 0
        while done < n:
            k = min(depth, n - done)
            offs = [((done + i) % slots) * length for i in range(k)]
            rc = te.batch_transfer_sync_read(target, [addr + o for o in offs],
                                             [raddr + o for o in offs], [length] * k)
            if rc != 0:
                sys.exit("bench_mooncake: TE read failed: %d" % rc)
            done += k
        print("%.6f" % (n * length / (time.monotonic() - t0) / 1e9), flush=True)


def netns(*args):
    subprocess.run([NETNS] + list(args), check=True)


def fabric_round(build, depth, mib):
    out = subprocess.run([os.path.join(build, "bench_fabric"), "-n", "-r", "1", "-d", str(depth),
                          "-m", str(mib), "-S", NETNS], check=True, capture_output=True,
                         text=True).stdout
    raw, fab = {}, {}
    for label, _ in SIZES:
        for line in out.splitlines():
            if line.startswith(label):
                f = line[len(label):].split()
                raw[label], fab[label] = float(f[0]), float(f[1])
    if len(raw) != len(SIZES):
        sys.exit("bench_mooncake: cannot parse bench_fabric's output:\n" + out)
    head = out.splitlines()[0].replace(", 1 rounds", "")
    return raw, fab, head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--verbose", action="store_true", help="keep TE's own log on stderr")
    ap.add_argument("cmd", nargs="*")
    a = ap.parse_args()
    if a.cmd[:1] == ["serve"]:
        return serve(a.cmd[1])
    if a.cmd[:1] == ["worker"]:
        return worker(a.cmd[1], a.cmd[2], int(a.cmd[3]))
    if os.geteuid() != 0:
        print("SKIPPED bench_mooncake: network namespaces need root")
        return 77
    prefix = "l3kvt%dxte" % os.getpid()
    netns("up", prefix, "2")
    owner = reader = None
    try:
        quiet = None if a.verbose else subprocess.DEVNULL
        owner = subprocess.Popen([NETNS, "exec", prefix, "1", sys.executable, __file__, "serve",
                                  "10.77.0.1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=quiet, text=True)
        info = json.loads(owner.stdout.readline())
        reader = subprocess.Popen([NETNS, "exec", prefix, "2", sys.executable, __file__,
                                   "worker", "10.77.0.2", info["target"], str(info["addr"])],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=quiet,
                                  text=True)
        if reader.stdout.readline().strip() != "ready":
            sys.exit("bench_mooncake: the TE reader did not start (--verbose shows its log)")

        def te_round():
            r = {}
            for label, length in SIZES:
                n = max(16, (a.mib << 20) // length)
                reader.stdin.write("%d %d %d\n" % (length, n, a.depth))
                reader.stdin.flush()
                r[label] = float(reader.stdout.readline())
            return r

        te, raw, fab = [], [], []
        head = ""
        for rd in range(a.rounds):
            if rd % 2 == 0:
                te.append(te_round())
                r, f, head = fabric_round(a.build, a.depth, a.mib)
            else:
                r, f, head = fabric_round(a.build, a.depth, a.mib)
                te.append(te_round())
            raw.append(r)
            fab.append(f)
        print("bench_mooncake: Mooncake TE (mooncake-transfer-engine-non-cuda, TCP transport, "
              "P2P handshake) against %s" % head.replace("bench_fabric: ", "bench_fabric's "))
        print("%d rounds alternated, %d reads per batch / in flight, %d MiB per measurement"
              % (a.rounds, a.depth, a.mib))
        print("%-18s %9s %9s %11s %10s %9s" % ("read size", "TE GB/s", "raw GB/s",
                                              "fabric GB/s", "fabric/TE", "raw/TE"))
        for label, _ in SIZES:
            med = lambda xs: statistics.median(xs)
            print("%-18s %9.2f %9.2f %11.2f %9.2fx %8.2fx" % (
                label, med([x[label] for x in te]), med([x[label] for x in raw]),
                med([x[label] for x in fab]),
                med([f[label] / t[label] for f, t in zip(fab, te)]),
                med([r[label] / t[label] for r, t in zip(raw, te)])))
    finally:
        for p in (reader, owner):
            if p is not None:
                p.stdin.close()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        netns("down", prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
