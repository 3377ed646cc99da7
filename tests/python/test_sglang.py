"""SGLang's own HiCache stack around l3kv.sglang.L3kvStorage and a live l3kvd.

Runs under the interpreter of the SGLang virtual environment that `make
check` builds (build/venv-sglang: sglang==0.5.23, torch==2.14.1, CPU
only). SGLang's code runs unmodified: its kv-only stack builder
(build_kv_only_stack: the HybridCacheController 0.5.23 builds even for
plain MHA and MLA), the backend factory's `dynamic` loader, the shm host
allocator (memfds), the four storage threads and their gloo all-reduces,
the native page-hash chain (get_hash_str). The test plays the scheduler:
it queues backups (write_storage) and prefetches (prefetch), allocates
the host pages a storage hit needs and reads the acks, as
unified_radix_cache does. Also SGLang's hybrid Mamba stack
(build_hybrid_mamba_stack), and TP 2 as two processes of this script
(--tp-worker) in a gloo world of two. The one stand-in: where there is no
CUDA, SGLang's cudaHostRegister of the host pool is a no-op.

Exits 77 with "SKIP: reason" where SGLang cannot be imported; --probe
only asks that.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import unittest
from queue import Empty

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l3kvd_process import BUILD, Daemon, _set_pdeathsig  # noqa: E402


def _skip_reason():
    try:
        import sglang  # noqa: F401
        import torch  # noqa: F401
        from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (  # noqa: F401
            build_kv_only_stack)
    except Exception as e:  # noqa: BLE001
        return "SGLang's HiCache stack cannot be imported here (%s: %s)" % (
            type(e).__name__, e)
    return None


if __name__ == "__main__":
    why = _skip_reason()
    if why is not None:
        print("SKIP: " + why)
        sys.exit(77)
    if "--probe" in sys.argv:
        sys.exit(0)

# SGLang's native page hash is a torch cpp_extension built on first use: keep it in the venv.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch-extensions"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import l3kv  # noqa: E402
import l3kv.sglang  # noqa: E402

PAGE = 16           # tokens per page
LAYERS = 3
HOST_TOKENS = 512   # device pool tokens; the host pool is hicache_ratio (2) times it
WAIT_S = 20

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))

_CUDA = torch.cuda.is_available()
if not _CUDA:
    # The one stand-in: no CUDA, no cudaHostRegister of the host pool.
    import sglang.srt.mem_cache.pool_host.common as _phc
    _phc._cuda_host_register = lambda buffer, registration_granularity_bytes=None: None

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.configs.mamba_utils import (Mamba2CacheParams, Mamba2StateDType,  # noqa: E402
                                            Mamba2StateShape)
from sglang.srt.mem_cache.hicache_storage import (PoolHitPolicy, PoolName,  # noqa: E402
                                                  PoolTransfer)
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (  # noqa: E402
    build_hybrid_mamba_stack, build_kv_only_stack)
from sglang.srt.mem_cache.memory_pool import (HybridLinearKVPool,  # noqa: E402
                                              HybridReqToTokenPool, MHATokenToKVPool,
                                              MLATokenToKVPool)
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_context, get_parallel  # noqa: E402


class Daemon2(Daemon):
    """A Daemon that can be killed and started again on the same socket."""

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def restart(self):
        self.proc = subprocess.Popen([os.path.join(BUILD, "l3kvd"), "-f",
                                      os.path.join(self.dir, "l3kvd.json")],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=_set_pdeathsig)
        self._wait_socket(5)


def _extra(sock, **more):
    d = {"backend_name": "l3kv", "module_path": "l3kv.sglang", "class_name": "L3kvStorage",
         "interface_v1": 1, "allocator": "shm", "socket": sock,
         "reconnect_ms": 50, "reconnect_max_ms": 200}
    d.update(more)
    return d


class Stack:
    """SGLang's kv-only HiCache stack (device pool on the CPU, host pool in
    memfds, HybridCacheController with the dynamic l3kv backend attached)."""

    def __init__(self, sock, mla=False, layout="page_first", extra=None, model="l3kv-test"):
        extra = dict(extra if extra is not None else _extra(sock))
        self.ov = get_context().override_server_args(
            enable_hierarchical_cache=True, hicache_mem_layout=layout,
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(extra),
            hicache_ratio=2.0, hicache_write_policy="write_through",
            hicache_io_backend="direct", page_size=PAGE, device="cpu")
        self.ov.install()
        try:
            if mla:
                self.kv = MLATokenToKVPool(size=HOST_TOKENS, page_size=PAGE,
                                           dtype=torch.bfloat16, kv_lora_rank=32,
                                           qk_rope_head_dim=8, layer_num=LAYERS, device="cpu",
                                           enable_memory_saver=False)
            else:
                self.kv = MHATokenToKVPool(size=HOST_TOKENS, page_size=PAGE,
                                           dtype=torch.bfloat16, head_num=2, head_dim=8,
                                           layer_num=LAYERS, device="cpu",
                                           enable_memory_saver=False)
            alloc = PagedTokenToKVPoolAllocator(HOST_TOKENS, PAGE, torch.bfloat16, "cpu",
                                                self.kv, need_sort=False)
            params = CacheInitParams(disable=False, req_to_token_pool=None,
                                     token_to_kv_pool_allocator=alloc, page_size=PAGE,
                                     tp_cache_group=dist.group.WORLD)
            self.group, self.ctl = build_kv_only_stack(
                params=params, kv_pool=self.kv,
                full_layer_mapping={i: i for i in range(LAYERS)},
                load_cache_event=threading.Event(), storage_backend="dynamic", use_mla=mla,
                model_name=model, storage_backend_extra_config=extra)
        except BaseException:
            self.ov.restore()
            raise
        self.host = self.ctl.mem_pool_host
        self.pool = self.group.anchor_entry.host_pool

    @property
    def backend(self):
        return self.ctl.storage_backend

    def close(self):
        try:
            if self.ctl.enable_storage:
                self.ctl.detach_storage_backend()
        finally:
            self.ov.restore()

    def threads_alive(self):
        c = self.ctl
        return all(t.is_alive() for t in (c.prefetch_thread, c.prefetch_io_aux_thread,
                                          c.prefetch_sync_thread, c.backup_thread))

    # Pages and bytes.

    def fill(self, npages, seed):
        """npages of fresh host pages filled with seeded random bytes: (host_indices, tokens)."""
        idx = self.host.alloc(npages * PAGE)
        assert idx is not None, "host pool full"
        g = torch.Generator().manual_seed(seed)
        for p in range(npages):
            t = int(idx[p * PAGE])
            page = self.pool.get_data_page(t, flat=False)
            page.copy_(torch.randint(-1000, 1000, page.shape, generator=g).to(page.dtype))
        tokens = [random.Random(seed).randrange(50000) for _ in range(npages * PAGE)]
        return idx, tokens

    def page_bytes(self, idx, npages):
        out = []
        for p in range(npages):
            page = self.pool.get_data_page(int(idx[p * PAGE]), flat=True)
            out.append(page.view(torch.uint8).clone())
        return out

    # What the scheduler does.

    def backup(self, idx, tokens, hashes=None):
        hashes = hashes or get_hash_str(tokens, None, page_size=PAGE)
        op_id = self.ctl.write_storage(idx, tokens, hash_value=hashes)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                op = self.ctl.ack_backup_queue.get(timeout=0.5)
            except Empty:
                continue
            if op.id == op_id:
                return op.completed_tokens // PAGE
        raise AssertionError("no backup ack in %d s" % WAIT_S)

    def prefetch(self, tokens, before_get=None):
        """A prefetch through SGLang's threads: (pages hit, pages loaded,
        host indices). before_get runs between the hit and the load."""
        rid = "req-%d" % random.randrange(1 << 30)
        op = self.ctl.prefetch(CacheRequestHandle(rid, 0), tokens, None, None)
        deadline = time.monotonic() + WAIT_S
        got = None
        while time.monotonic() < deadline:
            try:
                got = self.ctl.prefetch_hit_queue.get(timeout=0.5)
                break
            except Empty:
                continue
        assert got is op, "no prefetch hit in %d s" % WAIT_S
        hit = op.storage_hit_count // PAGE
        if hit == 0:
            return 0, 0, None
        if before_get is not None:
            before_get()
        idx = self.host.alloc(hit * PAGE)
        op.host_indices = idx
        op.hash_value = op.hash_value[:hit]
        self.ctl.prefetch_buffer.put(op)
        loaded = None
        while time.monotonic() < deadline:
            try:
                ack = self.ctl.ack_prefetch_queue.get(timeout=0.5)
            except Empty:
                continue
            if ack.rid != rid:
                continue
            if ack.completed_tokens is not None:
                loaded = ack.completed_tokens // PAGE
            if getattr(ack, "completed_req", False):
                return hit, loaded or 0, idx
        raise AssertionError("prefetch %s did not complete in %d s" % (rid, WAIT_S))


class HybridStack(Stack):
    """SGLang's hybrid Mamba stack (build_hybrid_mamba_stack, what its
    _MambaStrategy builds for a Mamba model): full-attention layers 0 and 2
    in a HybridLinearKVPool, Mamba2 layers 1 and 3 in the MambaPool of a
    HybridReqToTokenPool, each with its host pool (MHA page_first; the
    MambaPoolHost's temporal and conv buffers, each a memfd), one
    HybridCacheController with the dynamic l3kv backend."""

    def __init__(self, sock, model="l3kv-mamba"):
        extra = _extra(sock)
        self.ov = get_context().override_server_args(
            enable_hierarchical_cache=True, hicache_mem_layout="page_first",
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(extra),
            hicache_ratio=2.0, hicache_write_policy="write_through",
            hicache_io_backend="direct", page_size=PAGE, device="cpu")
        self.ov.install()
        try:
            shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1,
                                            num_heads=2, head_dim=8, state_size=4,
                                            conv_kernel=4)
            cache = Mamba2CacheParams(shape=shape, layers=[1, 3], dtype=Mamba2StateDType(
                conv=torch.bfloat16, temporal=torch.float32))
            self.rtp = HybridReqToTokenPool(size=8, mamba_size=8, mamba_spec_state_size=8,
                                            max_context_len=1024, device="cpu",
                                            enable_memory_saver=False, cache_params=cache,
                                            mamba_layer_ids=[1, 3],
                                            enable_mamba_extra_buffer=False)
            self.kv = HybridLinearKVPool(size=HOST_TOKENS, dtype=torch.bfloat16, page_size=PAGE,
                                         head_num=2, head_dim=8, full_attention_layer_ids=[0, 2],
                                         device="cpu", mamba_pool=self.rtp.mamba_pool)
            alloc = PagedTokenToKVPoolAllocator(HOST_TOKENS, PAGE, torch.bfloat16, "cpu",
                                                self.kv, need_sort=False)
            params = CacheInitParams(disable=False, req_to_token_pool=self.rtp,
                                     token_to_kv_pool_allocator=alloc, page_size=PAGE,
                                     tp_cache_group=dist.group.WORLD)
            self.group, self.ctl, _ = build_hybrid_mamba_stack(
                params=params, decls=self.kv.host_pool_decls(),
                mamba_pool=self.rtp.mamba_pool, full_layer_mapping={0: 0, 2: 1}, start_layer=0,
                load_cache_event=threading.Event(), storage_backend="dynamic", use_mla=False,
                model_name=model, storage_backend_extra_config=extra)
        except BaseException:
            self.ov.restore()
            raise
        self.host = self.ctl.mem_pool_host
        self.pool = self.group.get_pool(PoolName.KV)
        self.mamba = self.group.get_pool(PoolName.MAMBA)

    def fill_state(self, seed):
        """A fresh Mamba host slot with seeded random temporal and conv state."""
        slot = self.host.alloc(1, pool=PoolName.MAMBA)
        assert slot is not None, "mamba host pool full"
        g = torch.Generator().manual_seed(seed)
        for b in (self.mamba.temporal_buffer, *self.mamba.conv_buffer):
            x = b[int(slot[0])]
            x.copy_(torch.randn(x.shape, generator=g).to(x.dtype))
        return slot

    def state_bytes(self, slot):
        return [b[int(slot[0])].contiguous().view(torch.uint8).clone()
                for b in (self.mamba.temporal_buffer, *self.mamba.conv_buffer)]

    def backup_with_state(self, idx, tokens, hashes, slot):
        """A backup of the pages and the checkpoint after the last of them."""
        t = PoolTransfer(name=PoolName.MAMBA, host_indices=slot, keys=[hashes[-1]],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES)
        op_id = self.ctl.write_storage(idx, tokens, hash_value=hashes, extra_pools=[t])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                op = self.ctl.ack_backup_queue.get(timeout=0.5)
            except Empty:
                continue
            if op.id == op_id:
                return op.completed_tokens // PAGE, op.pool_storage_result.extra_pool_hit_pages
        raise AssertionError("no backup ack in %d s" % WAIT_S)

    def prefetch_with_state(self, tokens):
        """A prefetch asking for the trailing Mamba state, as the unified
        radix cache does (a placeholder key; a host slot once the hit is
        known): (pages hit, pages loaded, the state's pool hits, KV host
        indices, the state's host slot)."""
        rid = "req-%d" % random.randrange(1 << 30)
        t = PoolTransfer(name=PoolName.MAMBA, keys=["__placeholder__"],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES)
        op = self.ctl.prefetch(CacheRequestHandle(rid, 0), tokens, None, None,
                               extra_pools=[t])
        deadline = time.monotonic() + WAIT_S
        got = None
        while time.monotonic() < deadline:
            try:
                got = self.ctl.prefetch_hit_queue.get(timeout=0.5)
                break
            except Empty:
                continue
        assert got is op, "no prefetch hit in %d s" % WAIT_S
        hit = op.storage_hit_count // PAGE
        if hit == 0:
            return 0, 0, {}, None, None
        idx = self.host.alloc(hit * PAGE)
        slot = self.host.alloc(1, pool=PoolName.MAMBA)
        t.host_indices = slot
        op.host_indices = idx
        op.hash_value = op.hash_value[:hit]
        self.ctl.prefetch_buffer.put(op)
        loaded, pool_hits = 0, {}
        while time.monotonic() < deadline:
            try:
                ack = self.ctl.ack_prefetch_queue.get(timeout=0.5)
            except Empty:
                continue
            if ack.rid != rid:
                continue
            if ack.completed_tokens is not None:
                loaded = ack.completed_tokens // PAGE
            if ack.pool_hits:
                pool_hits = dict(ack.pool_hits)
            if getattr(ack, "completed_req", False):
                return hit, loaded, pool_hits, idx, slot
        raise AssertionError("prefetch %s did not complete in %d s" % (rid, WAIT_S))


def _wipe(stack, idx, npages):
    for p in range(npages):
        stack.pool.get_data_page(int(idx[p * PAGE]), flat=False).zero_()


class SGLangStack(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=0, world_size=1)
            get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                                attn_dcp_rank=0)
        cls.daemon = Daemon2(BUILD, {"tiers": {"dram": {"size": "64 MiB"}},
                                     "copy_engine": "host"}, "l3kv-sg-")
        cls.sock = cls.daemon.sock

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def setUp(self):
        self.stacks = []

    def tearDown(self):
        for s in self.stacks:
            s.close()
        # Every lease released (or expired), every pin dropped, every mapping gone.
        deadline = time.monotonic() + 5
        while True:
            st = _stats(self.sock)
            left = (st["cache"]["leases_open"], st["dram"]["pins"], st["attach"]["sessions"],
                    st["memory"]["regions_mapped"])
            if left == (0, 0, 0, 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(left, (0, 0, 0, 0), "leases, pins, sessions, regions left")

    def stack(self, **kw):
        s = Stack(self.sock, **kw)
        self.stacks.append(s)
        return s

    def round_trip(self, mla, seed):
        s = self.stack(mla=mla, model="rt-%s-%d" % ("mla" if mla else "mha", seed))
        self.assertIsInstance(s.backend, l3kv.sglang.L3kvStorage)
        n = 6
        idx, tokens = s.fill(n, seed)
        want = s.page_bytes(idx, n)
        self.assertEqual(s.backup(idx, tokens), n)
        hit, loaded, dst = s.prefetch(tokens)
        self.assertEqual((hit, loaded), (n, n))
        self.assertTrue(all(int(a) != int(b) for a, b in zip(dst[::PAGE], idx[::PAGE])),
                        "the prefetch must land in other host pages")
        got = s.page_bytes(dst, n)
        for p in range(n):
            self.assertTrue(torch.equal(got[p], want[p]), "page %d differs" % p)
        st = s.backend.get_stats()
        self.assertEqual(st["restored_pages"], n)
        self.assertEqual(st["leases"], 0)
        return s

    def test_mha_round_trip_is_bitwise(self):
        self.round_trip(False, 1)

    def test_mla_round_trip_is_bitwise(self):
        self.round_trip(True, 2)

    def test_a_gap_gives_the_leading_run(self):
        s = self.stack(model="gap")
        n = 8
        idx, tokens = s.fill(n, 3)
        hashes = get_hash_str(tokens, None, page_size=PAGE)
        want = s.page_bytes(idx, n)
        self.assertEqual(s.backup(idx[:4 * PAGE], tokens[:4 * PAGE], hashes[:4]), 4)
        self.assertEqual(s.backup(idx[5 * PAGE:], tokens[5 * PAGE:], hashes[5:]), 3)
        hit, loaded, dst = s.prefetch(tokens)
        self.assertEqual((hit, loaded), (4, 4))
        got = s.page_bytes(dst, 4)
        for p in range(4):
            self.assertTrue(torch.equal(got[p], want[p]), "page %d differs" % p)

    def test_a_repeated_write_is_present_not_rewritten(self):
        s = self.stack(model="again")
        idx, tokens = s.fill(4, 4)
        self.assertEqual(s.backup(idx, tokens), 4)
        self.assertEqual(s.backup(idx, tokens), 4)
        st = s.backend.get_stats()
        self.assertEqual((st["published_pages"], st["present_pages"]), (4, 4))

    def test_a_killed_daemon_is_a_miss_then_recovers(self):
        s = self.stack(model="restart")
        n = 4
        idx, tokens = s.fill(n, 5)
        want = s.page_bytes(idx, n)
        self.assertEqual(s.backup(idx, tokens), n)
        # Killed between the hit (admitted) and the load: the load is a miss.
        hit, loaded, dst = s.prefetch(tokens, before_get=self.daemon.kill)
        self.assertEqual((hit, loaded), (n, 0))
        self.assertTrue(s.threads_alive())
        # Down: lookups are misses, backups fail, nothing raises.
        self.assertEqual(s.prefetch(tokens)[:2], (0, 0))
        self.assertEqual(s.backup(idx, tokens), 0)
        self.assertTrue(s.threads_alive())
        self.daemon.restart()
        time.sleep(0.3)     # past the backoff
        # The restarted daemon's DRAM is empty: a miss, then the backup goes in again.
        self.assertEqual(s.prefetch(tokens)[:2], (0, 0))
        self.assertEqual(s.backup(idx, tokens), n)
        hit, loaded, dst = s.prefetch(tokens)
        self.assertEqual((hit, loaded), (n, n))
        got = s.page_bytes(dst, n)
        for p in range(n):
            self.assertTrue(torch.equal(got[p], want[p]), "page %d differs" % p)
        self.assertGreaterEqual(s.backend.get_stats()["reconnects"], 1)
        self.assertTrue(s.threads_alive())

    def test_detach_then_attach_releases_the_mapping(self):
        s = self.stack(model="detach")
        idx, tokens = s.fill(2, 6)
        self.assertEqual(s.backup(idx, tokens), 2)
        before = _stats(self.sock)
        self.assertEqual(before["attach"]["sessions"], 1)
        self.assertEqual(before["memory"]["regions_mapped"], 2)     # K and V halves
        s.ctl.detach_storage_backend()
        self.assertFalse(s.ctl.enable_storage)
        after = _stats(self.sock)
        self.assertEqual((after["attach"]["sessions"], after["memory"]["regions_mapped"],
                          after["cache"]["leases_open"]), (0, 0, 0))
        s.ctl.attach_storage_backend("dynamic", model_name="detach",
                                     storage_backend_extra_config=_extra(self.sock),
                                     host_pools=getattr(s.group, "entries", None))
        hit, loaded, _ = s.prefetch(tokens)
        self.assertEqual((hit, loaded), (2, 2))

    def test_mamba_hybrid_trailing_state_round_trips(self):
        """SGLang's hybrid Mamba stack: KV pages and Mamba checkpoints
        (temporal and conv state) go through the v2 calls; batch_exists_v2
        answers TRAILING_PAGES with restorable_prefix_pages, and a prefix
        whose last page has no checkpoint is not restorable."""
        s = self.stack_hybrid(model="mamba")
        self.assertIsInstance(s.backend, l3kv.sglang.L3kvStorage)
        st = _stats(self.sock)
        self.assertEqual(st["attach"]["sessions"], 2)           # kv and mamba
        self.assertEqual(st["memory"]["regions_mapped"], 4)     # K, V, temporal, conv
        n = 6
        idx, tokens = s.fill(n, 21)
        hashes = get_hash_str(tokens, None, page_size=PAGE)
        want = s.page_bytes(idx, n)
        at3, at6 = s.fill_state(31), s.fill_state(32)
        want3, want6 = s.state_bytes(at3), s.state_bytes(at6)
        # Checkpoints after page 3 and page 6.
        self.assertEqual(s.backup_with_state(idx[:3 * PAGE], tokens[:3 * PAGE], hashes[:3],
                                             at3), (3, {"mamba": 1}))
        self.assertEqual(s.backup_with_state(idx, tokens, hashes, at6), (n, {"mamba": 1}))
        # The backend's own answer: both lengths restorable, each pinned.
        r = s.backend.batch_exists_v2(hashes, [PoolTransfer(
            name=PoolName.MAMBA, keys=["__placeholder__"],
            hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (6, [3, 6]))
        self.assertEqual(r.extra_pool_hit_pages, {"kv": 6, "mamba": 6})
        s.backend.clear()
        # Through SGLang's prefetch: 6 pages and the state after page 6.
        hit, loaded, pool_hits, dst, slot = s.prefetch_with_state(tokens)
        self.assertEqual((hit, loaded, pool_hits.get("mamba")), (n, n, 1))
        self.assertNotEqual(int(slot[0]), int(at6[0]))
        got = s.page_bytes(dst, n)
        for p in range(n):
            self.assertTrue(torch.equal(got[p], want[p]), "page %d differs" % p)
        for a, b in zip(s.state_bytes(slot), want6):
            self.assertTrue(torch.equal(a, b), "the checkpoint after page 6 differs")
        # Eight pages of another request sharing pages 0-2, l3kvd holding KV
        # for all eight but a checkpoint only after page 3: 3 pages are
        # restorable (TRAILING_PAGES), not 8.
        idx8, _ = s.fill(8, 23)
        tokens8 = tokens[:3 * PAGE] + [50000 + i for i in range(5 * PAGE)]
        h8 = get_hash_str(tokens8, None, page_size=PAGE)
        self.assertEqual(h8[:3], hashes[:3])
        self.assertEqual(s.backup(idx8, tokens8, h8), 8)        # KV only
        hit, loaded, pool_hits, dst, slot = s.prefetch_with_state(tokens8)
        self.assertEqual((hit, loaded, pool_hits.get("mamba")), (3, 3, 1))
        for a, b in zip(s.state_bytes(slot), want3):
            self.assertTrue(torch.equal(a, b), "the checkpoint after page 3 differs")
        # No checkpoint at any length: no hit at all (recomputed, never KV
        # without its state).
        idx9, tok9 = s.fill(2, 24)
        self.assertEqual(s.backup(idx9, tok9), 2)
        self.assertEqual(s.prefetch_with_state(tok9)[:3], (0, 0, {}))
        self.assertEqual(s.backend.get_stats()["leases"], 0)
        self.assertTrue(s.threads_alive())

    def stack_hybrid(self, **kw):
        s = HybridStack(self.sock, **kw)
        self.stacks.append(s)
        return s

    def test_refusals_say_what_to_change(self):
        cases = [
            (dict(layout="layer_first"), "page_first"),
            (dict(extra=_extra(self.sock, allocator=None)), "shm"),
            (dict(extra={k: v for k, v in _extra(self.sock).items() if k != "interface_v1"}),
             "interface_v1"),
        ]
        for kw, text in cases:
            with self.subTest(kw=kw):
                with self.assertRaises(Exception) as cm:
                    self.stack(**kw)
                self.assertIn(text, str(cm.exception))
                self.assertIn("l3kv", str(cm.exception))

    def test_sglang_fault_injector_never_gives_wrong_bytes(self):
        os.environ["SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE"] = "0.3"
        os.environ["SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY"] = "0.01"
        try:
            s = self.stack(model="faults")
        finally:
            del os.environ["SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE"]
            del os.environ["SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY"]
        self.assertNotIsInstance(s.backend, l3kv.sglang.L3kvStorage)   # the injector wraps it
        for seed in range(10, 16):
            idx, tokens = s.fill(3, seed)
            want = s.page_bytes(idx, 3)
            s.backup(idx, tokens)
            hit, loaded, dst = s.prefetch(tokens)
            self.assertLessEqual(loaded, hit)
            if loaded:
                got = s.page_bytes(dst, loaded)
                for p in range(loaded):
                    self.assertTrue(torch.equal(got[p], want[p]), "seed %d page %d" % (seed, p))
            s.host.free(idx)
            if dst is not None:
                s.host.free(dst)
        self.assertTrue(s.threads_alive())


def _stats(sock):
    with l3kv.Client(sock) as c:
        return c.stats()


TP_PAGES = 5


def tp_worker(rank, size, port, sock):
    """One TP rank of a two-process SGLang instance (--tp-worker): gloo
    world of `size` at 127.0.0.1:port, SGLang's stack with the default
    group id, a backup and a prefetch of TP_PAGES pages of this rank's own
    bytes, then a hybrid Mamba stack's pages and checkpoint; prints one
    JSON line, waits for a line on stdin, closes."""
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    get_parallel().override_permanently(tp_rank=rank, tp_size=size, pp_rank=0, pp_size=1,
                                        attn_dcp_rank=0)
    s = Stack(sock, model="tp")
    stacks = [s]
    out = {"rank": rank}
    try:
        idx, tokens = s.fill(TP_PAGES, 0)
        # The same tokens (one request) on both ranks, each rank its own shard's bytes.
        g = torch.Generator().manual_seed(1000 + rank)
        for p in range(TP_PAGES):
            page = s.pool.get_data_page(int(idx[p * PAGE]), flat=False)
            page.copy_(torch.randint(-1000, 1000, page.shape, generator=g).to(page.dtype))
        want = s.page_bytes(idx, TP_PAGES)
        out["backup"] = s.backup(idx, tokens)
        hit, loaded, dst = s.prefetch(tokens)
        out["hit"], out["loaded"] = hit, loaded
        got = s.page_bytes(dst, loaded) if loaded else []
        out["bytes_equal"] = [bool(torch.equal(a, b)) for a, b in zip(got, want)]
        out["other_pages"] = bool(dst is not None and all(
            int(a) != int(b) for a, b in zip(dst[::PAGE], idx[::PAGE])))
        out["group"] = s.backend.group
        out["digest"] = int(sum(int(w.sum()) for w in want))
        out["threads_alive"] = s.threads_alive()
        # A Mamba hybrid on both ranks: each rank's own state shard, the
        # checkpoint admissions paired across the ranks by the daemon.
        h = HybridStack(sock, model="tp-mamba")
        stacks.append(h)
        idx, tokens = h.fill(3, 0)
        hashes = get_hash_str(tokens, None, page_size=PAGE)
        slot = h.fill_state(2000 + rank)
        want_state = h.state_bytes(slot)
        out["m_backup"] = h.backup_with_state(idx, tokens, hashes, slot)[0]
        hit, loaded, pool_hits, _, got_slot = h.prefetch_with_state(tokens)
        out["m_hit"] = (hit, loaded, pool_hits.get("mamba"))
        out["m_state_equal"] = bool(got_slot is not None and all(
            torch.equal(a, b) for a, b in zip(h.state_bytes(got_slot), want_state)))
    except Exception as e:  # noqa: BLE001 -- reported to the test, which fails
        out["error"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    for x in stacks:
        x.close()
    print(json.dumps({"rank": rank, "closed": True}), flush=True)


def _free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


class TwoRanks(unittest.TestCase):
    """TP 2 as two processes (SGLang's TP ranks: a gloo world of 2, the
    controller's all-reduces over it), each rank's L3kvStorage on one
    l3kvd; and a second instance of the same model attached beside them
    (its default group id differs)."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon2(BUILD, {"tiers": {"dram": {"size": "64 MiB"}},
                                     "copy_engine": "host"}, "l3kv-sg2-")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def test_tp2_ranks_round_trip_their_own_shards(self):
        port = _free_port()
        env = dict(os.environ)
        env.pop("MASTER_PORT", None)
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--tp-worker",
                                   str(r), "2", str(port), self.daemon.sock],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env, preexec_fn=_set_pdeathsig) for r in (0, 1)]
        try:
            res = [json.loads(_line(p, 240)) for p in procs]
            for r in res:
                self.assertNotIn("error", r)
                self.assertEqual((r["backup"], r["hit"], r["loaded"]),
                                 (TP_PAGES, TP_PAGES, TP_PAGES), r)
                self.assertEqual(r["bytes_equal"], [True] * TP_PAGES, r)
                self.assertTrue(r["other_pages"] and r["threads_alive"], r)
                self.assertEqual((r["m_backup"], r["m_hit"], r["m_state_equal"]),
                                 (3, [3, 3, 1], True), r)
            self.assertEqual(res[0]["group"], res[1]["group"])
            self.assertNotEqual(res[0]["digest"], res[1]["digest"], "two shards' bytes")
            st = _stats(self.daemon.sock)
            self.assertEqual(st["attach"]["sessions"], 6)      # kv, then kv and mamba, a rank
            # A second instance of the same model, here (its own gloo world),
            # while the first is attached: another default group, its pages
            # round-trip. (With the old default, sglang-tp-pp0-dp0 for both,
            # its ATTACH was refused: the group has two ranks.)
            if not dist.is_initialized():
                dist.init_process_group("gloo", rank=0, world_size=1)
                get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0,
                                                    pp_size=1, attn_dcp_rank=0)
            other = Stack(self.daemon.sock, model="tp")
            try:
                self.assertNotEqual(other.backend.group, res[0]["group"])
                self.assertEqual(_stats(self.daemon.sock)["attach"]["sessions"], 7)
                idx, tokens = other.fill(3, 77)
                want = other.page_bytes(idx, 3)
                self.assertEqual(other.backup(idx, tokens), 3)
                hit, loaded, dst = other.prefetch(tokens)
                self.assertEqual((hit, loaded), (3, 3))
                got = other.page_bytes(dst, 3)
                self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)))
            finally:
                other.close()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                self.assertTrue(json.loads(_line(p, 60)).get("closed"))
                self.assertEqual(p.wait(30), 0)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                p.stdin.close()
                p.stdout.close()
        deadline = time.monotonic() + 5
        while True:
            st = _stats(self.daemon.sock)
            left = (st["cache"]["leases_open"], st["dram"]["pins"], st["attach"]["sessions"],
                    st["memory"]["regions_mapped"])
            if left == (0, 0, 0, 0) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(left, (0, 0, 0, 0))


def _line(proc, seconds):
    """One line of a worker's stdout (its JSON), within seconds."""
    import select
    deadline = time.monotonic() + seconds
    buf = ""
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 1)
        if r:
            line = proc.stdout.readline()
            if not line:
                raise AssertionError("worker exited (%s) without a result" % proc.poll())
            if line.startswith("{"):
                return line
            buf += line
    raise AssertionError("no result from a worker in %d s" % seconds)


if __name__ == "__main__":
    if "--tp-worker" in sys.argv:
        i = sys.argv.index("--tp-worker")
        rank, size, port, sock = sys.argv[i + 1:i + 5]
        tp_worker(int(rank), int(size), int(port), sock)
        sys.exit(0)
    unittest.main(argv=[sys.argv[0]], verbosity=2)
