#!/usr/bin/env python3
"""The 4096- and 1024-token MLA FP8 restore of bench_e2e, from a torch engine
through the Python client (issue 16): where Python adds time to the C path.

A real l3kvd (copy_engine cuda, 4 GiB DRAM tier); the engine's KV cache is
one torch uint8 CUDA tensor, layer_first [61 layers, 256 pages, 64 tokens,
576 B], registered through l3kv.torch (legacy CUDA IPC); pages 0..63 are
published from it (PUBLISH from device memory), then each run admits the
first N pages and restores them into N shuffled pages among 64..255.

Timed per run, with time.perf_counter() in this process:
  end-to-end   Client.admit + Client.restore + Client.release (a list of
               hashes and a Python list of destination pages, as an engine
               has them);
  RESTORE      Client.restore alone;
  + release    Client.admit + Client.restore(release=True);
  ctypes floor l3kv_restore_with called directly through ctypes with the
               arguments built before the clock (what the C path costs from
               Python: the call itself, the GIL released around it);
  copy         one pinned host tensor copied into a device tensor
               (Tensor.copy_, then torch.cuda.synchronize): the same
               cudaMemcpy as bench_e2e's baseline.
The last run of each row is checked byte for byte with torch. Median and
p90 of RUNS runs after WARM warm-ups, printed as a markdown table.

  bench_e2e_torch.py [-n RUNS] [-w WARM]     (L3KV_BUILD: the build, as the tests)

Exits 77 without torch or a CUDA device, 1 on a failure.
"""

import argparse
import ctypes
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))
from l3kvd_process import BUILD, Daemon  # noqa: E402  (points sys.path at lib/python)

import l3kv  # noqa: E402
import l3kv.torch as lt  # noqa: E402
from l3kv import Attention, Layout, Pool  # noqa: E402

TOKENS, LAYERS, TBYTES = 64, 61, 576
OBJ = TOKENS * LAYERS * TBYTES
POOL_PAGES, SRC = 256, 64


def p90(v):
    s = sorted(v)
    return s[max(0, (len(s) * 9 + 9) // 10 - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("-w", type=int, default=3)
    ap.add_argument("-S", type=int, default=0, help="Client.set_spin(us)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print("bench_e2e_torch: skipped: torch is not installed (%s)" % e)
        return 77
    if not torch.cuda.is_available():
        print("bench_e2e_torch: skipped: torch finds no CUDA device")
        return 77
    d = Daemon(BUILD, {"tiers": {"dram": {"size": "4 GiB"}}, "copy_engine": "cuda"},
               "l3kv-bench-torch-", start_s=60, stop_s=30)
    try:
        return run(torch, d, args)
    finally:
        rc = d.stop()
        if rc != 0:
            print("bench_e2e_torch: l3kvd exit %r; log:\n%s" % (rc, d.log()), file=sys.stderr)
        d.cleanup()


def run(torch, d, args):
    rng = random.Random(os.getpid() ^ time.time_ns())
    kv = torch.randint(0, 256, (LAYERS, POOL_PAGES, TOKENS, TBYTES), dtype=torch.uint8,
                       device="cuda")
    src_copy = kv.clone()
    region = lt.cuda_ipc_region(kv, pool=0, layout="layer_first")
    layout = Layout(model="bench-e2e-torch", kv_dtype="fp8_e4m3", page_tokens=TOKENS,
                    attention=Attention.MLA)
    c = l3kv.Client(d.sock, 10000)
    c.set_timeout(20000)
    c.set_spin(args.S)
    c.attach(layout, [Pool("kv", OBJ, layers=LAYERS, schema="latent:576:fp8_e4m3")], [region],
             group="bench-e2e-torch")
    torch.cuda.synchronize()
    hashes = [bytes(rng.getrandbits(8) | 1 for _ in range(32)) for _ in range(SRC)]
    r = c.publish(0, list(zip(hashes, range(SRC))))
    assert (r.stored, r.bytes) == (SRC, SRC * OBJ), r
    scratch = torch.empty(SRC * OBJ, dtype=torch.uint8, device="cuda")
    host = torch.empty(SRC * OBJ, dtype=torch.uint8, pin_memory=True)
    host.copy_(kv[:, :SRC].contiguous().view(-1))
    lib = l3kv._load()
    request = [0]

    def pick(n):
        return rng.sample(range(SRC, POOL_PAGES), n)

    def once(n, mode):
        request[0] += 1
        dst = pick(n)
        t0 = time.perf_counter()
        a = c.admit(request[0], hashes[:n], reserved_pages=n)
        t1 = time.perf_counter()
        if mode == "floor":
            # the C call alone: arguments built before the clock
            arr = (ctypes.c_uint32 * n)(*dst)
            ra = l3kv._restore_args(a.lease, 0, arr, n, None, None)
            res = l3kv._CRestoreResult()
            h = c._handle()
            t1 = time.perf_counter()
            rc = lib.l3kv_restore_with(h, ctypes.byref(ra), 20000, ctypes.byref(res))
            t2 = time.perf_counter()
            assert rc == 0 and res.pages == n, (rc, res.pages)
            c.release(a.lease)
        else:
            res = c.restore(a.lease, 0, dst, timeout_ms=20000, release=mode == "release")
            t2 = time.perf_counter()
            assert res.pages == n and not res.partial, res
            if mode != "release":
                c.release(a.lease)
        t3 = time.perf_counter()
        return t3 - t0, t2 - t1, dst

    rows = []
    for n in (SRC, SRC // 4):
        for mode in ("plain", "release", "floor"):
            for _ in range(args.w):
                once(n, mode)
            tot, rst = [], []
            for _ in range(args.n):
                t, r_, dst = once(n, mode)
                tot.append(t)
                rst.append(r_)
            torch.cuda.synchronize()
            # the last run's destinations hold the published pages; the sources are intact
            if not (torch.equal(kv[:, dst], src_copy[:, :n]) and
                    torch.equal(kv[:, :SRC], src_copy[:, :SRC])):
                print("bench_e2e_torch: %d pages (%s): the region differs from what the "
                      "restore should have made" % (n, mode), file=sys.stderr)
                return 1
            cp = []
            for i in range(-args.w, args.n):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                scratch[:n * OBJ].copy_(host[:n * OBJ])
                torch.cuda.synchronize()
                if i >= 0:
                    cp.append(time.perf_counter() - t0)
            rows.append((n, mode, tot, rst, cp))
    st = c.stats()
    if st["cache"]["leases_open"] != 0 or st["dram"]["pins"] != 0:
        print("bench_e2e_torch: leases %d, pins %d left" % (st["cache"]["leases_open"],
                                                           st["dram"]["pins"]), file=sys.stderr)
        return 1
    c.close()

    what = {"plain": "admit + restore + release", "release": "admit + restore(release=True)",
            "floor": "ctypes l3kv_restore_with, args prebuilt (RESTORE only)"}
    print("## End-to-end MLA FP8 restore from a torch engine through the Python client, %s\n"
          % torch.cuda.get_device_name())
    print("torch %s; pages of %d tokens x %d layers x %d B (%.2f MB), published from and "
          "restored into one uint8 CUDA tensor (layer_first, legacy CUDA IPC through "
          "l3kv.torch), destinations shuffled among %d pages; median and p90 of %d runs "
          "after %d warm-ups, ms; copy: pinned host tensor -> device tensor, Tensor.copy_ "
          "+ synchronize; the client spins %d us before it sleeps (Client.set_spin). The "
          "last run of each row checked byte for byte.\n"
          % (torch.__version__, TOKENS, LAYERS, TBYTES, OBJ / 1e6, POOL_PAGES - SRC, args.n,
             args.w, args.S))
    print("| restore | calls | end-to-end ms (p50) | p90 | RESTORE ms (p50) | p90 | copy ms "
          "(p50) | end-to-end / copy | RESTORE / copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, mode, tot, rst, cp in rows:
        t, r_, k = (statistics.median(x) * 1e3 for x in (tot, rst, cp))
        print("| %d tokens (%d pages) | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3fx | %.3fx |"
              % (n * TOKENS, n, what[mode], t, p90(tot) * 1e3, r_, p90(rst) * 1e3, k, t / k,
                 r_ / k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
