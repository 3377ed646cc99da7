"""SGLang HiCache L3 throughput: l3kv.sglang.L3kvStorage against SGLang's HiCacheFile.

Runs under the SGLang virtual environment's interpreter (tests/bench/sglang.sh). One SGLang
kv-only HiCache stack (SGLang 0.5.23's own build_kv_only_stack, MHA, page_first, shm host pool
in memfds, device pool on the CPU) is built once; its controller's storage backend is switched
between the two backends with SGLang's own detach_storage_backend / attach_storage_backend, so
both move the same host pool and the same page bytes. Per run and backend:

  backup    write_storage(all pages) on the controller's backup thread until its ack
            (l3kv: batch_set_v1 zero-copy; file: batch_set of the pages' tensors)
  prefetch  controller.prefetch(tokens) until the last ack: the prefetch thread's page-hash
            chain and batch_exists, the host allocation the scheduler makes, then the io thread's
            batch_get_v1 (l3kv) / batch_get + set_from_flat_data_page (file), batch by batch
            (STORAGE_BATCH_SIZE pages). "load" is the part after the hit: the data movement.

Every run writes new keys (the tokens are new per run and backend; the bytes are the same):
l3kv gets a fresh l3kvd (DRAM tier, host copy engine) and the file backend a fresh directory.
HiCacheFile's prefetch is measured twice: warm (its files just written, in the page cache) and
cold (each file fdatasync'd and dropped from the page cache with posix_fadvise(DONTNEED), no
root needed). Every prefetch is checked bitwise against the source pages after its timing.
The two backends alternate; the figures are the median of the runs.

  bench_sglang.py [--pages N] [--runs R] [--layers L] [--heads H] [--head-dim D]
                  [--dram SIZE] [--no-cold]
"""

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from queue import Empty

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
from l3kvd_process import BUILD, Daemon  # noqa: E402

try:
    import torch
    import torch.distributed as dist
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_kv_only_stack
except Exception as e:  # noqa: BLE001
    print("SKIP: SGLang's HiCache stack cannot be imported here (%s: %s)" % (type(e).__name__, e))
    sys.exit(77)

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch-extensions"))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))

import l3kv.sglang  # noqa: E402

if not torch.cuda.is_available():
    # As tests/python/test_sglang.py: no CUDA, no cudaHostRegister of the host pool.
    import sglang.srt.mem_cache.pool_host.common as _phc
    _phc._cuda_host_register = lambda buffer, registration_granularity_bytes=None: None

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402

PAGE = 64
WAIT_S = 300


def l3kv_extra(sock):
    return {"backend_name": "l3kv", "module_path": "l3kv.sglang", "class_name": "L3kvStorage",
            "interface_v1": 1, "allocator": "shm", "socket": sock, "timeout_ms": 60000}


class Stack:
    def __init__(self, a, sock):
        dev_tokens = 16 * PAGE
        host_tokens = (2 * a.pages + 8) * PAGE
        extra = l3kv_extra(sock)
        self.ov = get_context().override_server_args(
            enable_hierarchical_cache=True, hicache_mem_layout="page_first",
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(extra),
            hicache_ratio=host_tokens / dev_tokens, hicache_write_policy="write_through",
            hicache_io_backend="direct", page_size=PAGE, device="cpu")
        self.ov.install()
        self.kv = MHATokenToKVPool(size=dev_tokens, page_size=PAGE, dtype=torch.bfloat16,
                                   head_num=a.heads, head_dim=a.head_dim, layer_num=a.layers,
                                   device="cpu", enable_memory_saver=False)
        alloc = PagedTokenToKVPoolAllocator(dev_tokens, PAGE, torch.bfloat16, "cpu", self.kv,
                                            need_sort=False)
        params = CacheInitParams(disable=False, req_to_token_pool=None,
                                 token_to_kv_pool_allocator=alloc, page_size=PAGE,
                                 tp_cache_group=dist.group.WORLD)
        self.group, self.ctl = build_kv_only_stack(
            params=params, kv_pool=self.kv, full_layer_mapping={i: i for i in range(a.layers)},
            load_cache_event=threading.Event(), storage_backend="dynamic", use_mla=False,
            model_name="bench", storage_backend_extra_config=extra)
        self.host = self.ctl.mem_pool_host
        self.pool = self.group.anchor_entry.host_pool
        if not torch.cuda.is_available():
            # The second stand-in: HiCacheFile's path (_generic_page_get) allocates a zeroed
            # page per get with pin_memory=host.pin_memory, which needs CUDA; unpinned here.
            for h in {id(self.pool): self.pool, id(self.host): self.host}.values():
                if getattr(h, "pin_memory", False):
                    h.pin_memory = False

    def attach(self, name, extra):
        if self.ctl.enable_storage:
            self.ctl.detach_storage_backend()
        self.ctl.attach_storage_backend(name, model_name="bench",
                                        storage_backend_extra_config=extra,
                                        host_pools=getattr(self.group, "entries", None))

    def page(self, idx, p):
        return self.pool.get_data_page(int(idx[p * PAGE]), flat=True).view(torch.uint8)

    def backup(self, idx, tokens, hashes):
        t0 = time.perf_counter()
        op_id = self.ctl.write_storage(idx, tokens, hash_value=hashes)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                op = self.ctl.ack_backup_queue.get(timeout=0.5)
            except Empty:
                continue
            if op.id == op_id:
                return op.completed_tokens // PAGE, time.perf_counter() - t0
        raise RuntimeError("no backup ack in %d s" % WAIT_S)

    def prefetch(self, tokens):
        """(pages loaded, host indices, total s, load s)."""
        rid = "req-%d" % random.randrange(1 << 30)
        t0 = time.perf_counter()
        op = self.ctl.prefetch(CacheRequestHandle(rid, 0), tokens, None, None)
        deadline = time.monotonic() + WAIT_S
        got = None
        while time.monotonic() < deadline:
            try:
                got = self.ctl.prefetch_hit_queue.get(timeout=0.05)
                break
            except Empty:
                continue
        if got is not op:
            raise RuntimeError("no prefetch hit in %d s" % WAIT_S)
        hit = op.storage_hit_count // PAGE
        if hit == 0:
            return 0, None, time.perf_counter() - t0, 0.0
        idx = self.host.alloc(hit * PAGE)
        op.host_indices = idx
        op.hash_value = op.hash_value[:hit]
        t1 = time.perf_counter()
        self.ctl.prefetch_buffer.put(op)
        loaded = 0
        while time.monotonic() < deadline:
            try:
                ack = self.ctl.ack_prefetch_queue.get(timeout=0.05)
            except Empty:
                continue
            if ack.rid != rid:
                continue
            if ack.completed_tokens is not None:
                loaded = ack.completed_tokens // PAGE
            if getattr(ack, "completed_req", False):
                t2 = time.perf_counter()
                return loaded, idx, t2 - t0, t2 - t1
        raise RuntimeError("prefetch did not complete in %d s" % WAIT_S)


def drop_cache(d):
    for name in os.listdir(d):
        if name.endswith(".bin"):
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=384)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dram", default="2 GiB")
    ap.add_argument("--no-cold", action="store_true")
    a = ap.parse_args()
    page_bytes = PAGE * a.layers * a.heads * a.head_dim * 2 * 2     # K and V, bf16
    total = page_bytes * a.pages

    dist.init_process_group("gloo", rank=0, world_size=1)
    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                        attn_dcp_rank=0)
    tmp_root = os.environ.get("TMPDIR") or "/var/tmp"
    dcfg = {"tiers": {"dram": {"size": a.dram}}, "copy_engine": "host",
            "log": {"level": "warn"}}
    daemon = Daemon(BUILD, dcfg, "l3kv-bsg-")
    stack = Stack(a, daemon.sock)
    daemon.stop()
    daemon.cleanup()

    src = stack.host.alloc(a.pages * PAGE)
    g = torch.Generator().manual_seed(1)
    for p in range(a.pages):
        pg = stack.page(src, p)
        pg.copy_(torch.randint(0, 256, pg.shape, generator=g, dtype=torch.uint8))
    want = [stack.page(src, p).clone() for p in range(a.pages)]
    print("# %d pages of %d bytes (%d tokens x %d layers x %d heads x %d dim x bf16 x K,V) = "
          "%.2f GB, %d runs, l3kvd DRAM %s host copy engine, file dir under %s, load %s"
          % (a.pages, page_bytes, PAGE, a.layers, a.heads, a.head_dim, total / 1e9, a.runs,
             a.dram, tmp_root, "%.2f %.2f %.2f" % os.getloadavg()), flush=True)

    def check(idx, n, what):
        if n != a.pages:
            raise RuntimeError("%s: %d of %d pages" % (what, n, a.pages))
        for p in range(n):
            if not torch.equal(stack.page(idx, p), want[p]):
                raise RuntimeError("%s: page %d differs" % (what, p))

    res = {k: [] for k in ("l3kv backup", "l3kv prefetch", "l3kv load", "file backup",
                           "file prefetch warm", "file load warm", "file prefetch cold",
                           "file load cold")}
    loads = []
    for run in range(a.runs):
        order = ("l3kv", "file") if run % 2 == 0 else ("file", "l3kv")
        for b in order:
            tokens = [random.Random(2 * run + (b == "file")).randrange(50000)
                      for _ in range(a.pages * PAGE)]
            hashes = get_hash_str(tokens, None, page_size=PAGE)
            if b == "l3kv":
                d = Daemon(BUILD, dcfg, "l3kv-bsg-")
                try:
                    stack.attach("dynamic", l3kv_extra(d.sock))
                    assert isinstance(stack.ctl.storage_backend, l3kv.sglang.L3kvStorage)
                    n, t = stack.backup(src, tokens, hashes)
                    if n != a.pages:
                        raise RuntimeError("l3kv backup: %d of %d pages" % (n, a.pages))
                    res["l3kv backup"].append(t)
                    n, idx, tt, tl = stack.prefetch(tokens)
                    check(idx, n, "l3kv prefetch")
                    stack.host.free(idx)
                    res["l3kv prefetch"].append(tt)
                    res["l3kv load"].append(tl)
                    stack.ctl.detach_storage_backend()
                finally:
                    d.stop()
                    d.cleanup()
            else:
                fdir = tempfile.mkdtemp(prefix="hicache-file-", dir=tmp_root)
                try:
                    stack.attach("file", {"file_storage_path": fdir})
                    n, t = stack.backup(src, tokens, hashes)
                    if n != a.pages:
                        raise RuntimeError("file backup: %d of %d pages" % (n, a.pages))
                    res["file backup"].append(t)
                    n, idx, tt, tl = stack.prefetch(tokens)
                    check(idx, n, "file prefetch warm")
                    stack.host.free(idx)
                    res["file prefetch warm"].append(tt)
                    res["file load warm"].append(tl)
                    if not a.no_cold:
                        drop_cache(fdir)
                        n, idx, tt, tl = stack.prefetch(tokens)
                        check(idx, n, "file prefetch cold")
                        stack.host.free(idx)
                        res["file prefetch cold"].append(tt)
                        res["file load cold"].append(tl)
                    stack.ctl.detach_storage_backend()
                finally:
                    shutil.rmtree(fdir, ignore_errors=True)
        loads.append(os.getloadavg()[0])
        print("# run %d: %s" % (run + 1, "  ".join(
            "%s %.3f s" % (k, v[-1]) for k, v in res.items() if v)), flush=True)

    med = {k: statistics.median(v) for k, v in res.items() if v}
    print("\n%-20s %9s %9s %9s   (median of %d; load average %.2f-%.2f)"
          % ("", "s", "GB/s", "pages/s", a.runs, min(loads), max(loads)))
    for k, t in med.items():
        print("%-20s %9.3f %9.2f %9.0f" % (k, t, total / t / 1e9, a.pages / t))
    print()
    for what, l3, fl in (("backup", "l3kv backup", "file backup"),
                         ("prefetch (warm file)", "l3kv prefetch", "file prefetch warm"),
                         ("load (warm file)", "l3kv load", "file load warm"),
                         ("prefetch (cold file)", "l3kv prefetch", "file prefetch cold"),
                         ("load (cold file)", "l3kv load", "file load cold")):
        if l3 in med and fl in med:
            ratios = sorted(f / l for l, f in zip(res[l3], res[fl]))
            print("ratio l3kv/HiCacheFile %-22s %6.2f  (per run %s)"
                  % (what, med[fl] / med[l3], " ".join("%.2f" % r for r in ratios)))
    if stack.ctl.enable_storage:
        stack.ctl.detach_storage_backend()
    stack.ov.restore()


if __name__ == "__main__":
    main()
