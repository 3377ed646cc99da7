"""l3kv.sglang.L3kvStorage without SGLang or torch (standard library only).

The backend called the way SGLang 0.5.23's controller calls it, on a
stand-in host pool (a memfd and the attributes L3kvStorage reads), against
a real l3kvd: publish, admission at batch_exists, restore in batch_get_v1
into other pages (every byte), misses while the daemon is away and
recovery after, the refusals; two TP ranks in one group (a waiting ADMIT
never blocks a publish), the default group id; a Mamba pool's checkpoints
(TRAILING_PAGES, restorable_prefix_pages, every state byte). tests/python/test_sglang.py does the same
through SGLang's own stack, where its venv could be made.
"""

import mmap
import os
import sys
import threading
import time
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from l3kvd_process import BUILD, Daemon  # noqa: E402

import l3kv  # noqa: E402
import l3kv.sglang as lsg  # noqa: E402

PAGE, LAYERS, HEADS, DIM, ES = 4, 2, 2, 4, 2     # bf16-sized elements
TOKENS = 64                                       # 16 pages


class _Buf:
    """What L3kvStorage asks of the host pool's kv_buffer tensor."""

    def __init__(self, shape):
        self.shape = shape
        self.dtype = "torch.bfloat16"

    def is_contiguous(self):
        return True

    def element_size(self):
        return ES


class _StateBuf(_Buf):
    def __init__(self, shape, es):
        super().__init__(shape)
        self.es = es
        self.dtype = "torch.float32" if es == 4 else "torch.bfloat16"

    def element_size(self):
        return self.es

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class _MambaHost:
    """What L3kvStorage asks of SGLang's MambaPoolHost: a temporal and a conv
    buffer, [slots, layers, 1, *state], each in its own memfd."""

    def __init__(self, fds=True):
        self.page_size, self.size, self.layout = 1, SLOTS, "page_first"
        self.temporal_buffer = _StateBuf((SLOTS, 2, 1, 2, 4, 4), 4)     # 128 B a layer
        self.conv_buffer = [_StateBuf((SLOTS, 2, 1, 6, 3), 2)]          # 36 B a layer
        self.slot_state_buffers = []
        self.mms = []
        self.allocator = types.SimpleNamespace(fds=[])
        for b in (self.temporal_buffer, *self.conv_buffer):
            n = b.numel() * b.es
            fd = os.memfd_create("sg-mamba", os.MFD_CLOEXEC)      # unsealable, as SGLang's
            os.ftruncate(fd, n)
            self.mms.append(mmap.mmap(fd, n))
            self.mms[-1][:] = os.urandom(n)
            if fds:
                self.allocator.fds.append(fd)

    def slot(self, i):
        """Slot i's bytes in every buffer."""
        out = []
        for b, mm in zip((self.temporal_buffer, *self.conv_buffer), self.mms):
            per = len(mm) // SLOTS
            out.append(bytes(mm[i * per:(i + 1) * per]))
        return out


SLOTS = 8


class _Host:
    def __init__(self, mla=False, layout="page_first", fd=True):
        self.page_size, self.size, self.layout = PAGE, TOKENS, layout
        if mla:
            shape = (TOKENS, LAYERS, 1, HEADS * DIM)
        else:
            shape = (2, TOKENS, LAYERS, HEADS, DIM)
        n = ES
        for d in shape:
            n *= d
        self.nbytes = n
        self.fd = os.memfd_create("sg-host", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING) if fd else None
        if fd:
            os.ftruncate(self.fd, n)
            self.mm = mmap.mmap(self.fd, n)
        self.kv_buffer = _Buf(shape)


def _config(sock, tp_rank=0, tp_size=1, **extra):
    e = {"interface_v1": 1, "socket": sock, "reconnect_ms": 20, "reconnect_max_ms": 50}
    e.update(extra)
    return types.SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                 attn_cp_rank=0,
                                 attn_cp_size=1, is_mla_model=False, is_storage_writer=True,
                                 is_page_first_layout=True, model_name="alone", dp_rank=0,
                                 dcp_size=1, dcp_rank=0, logical_page_size=None,
                                 extra_config=e)


def _keys(n, tag):
    import hashlib
    return [hashlib.sha256(b"%s-%d" % (tag, i)).hexdigest() for i in range(n)]


def _indices(pages):
    return [p * PAGE + t for p in pages for t in range(PAGE)]


class Alone(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(BUILD, {"tiers": {"dram": {"size": "16 MiB"}},
                                    "copy_engine": "host"}, "l3kv-sga-")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def backend(self, host, tp_rank=0, tp_size=1, **extra):
        b = lsg.L3kvStorage(_config(self.daemon.sock, tp_rank, tp_size, **extra), {})
        b.register_mem_pool_host(host)
        b.register_mem_host_pool_v2(host, "kv")
        b.on_host_pools_registered()
        self.addCleanup(b.close)
        return b

    def test_published_pages_come_back_into_other_pages_bitwise(self):
        for mla in (False, True):
            with self.subTest(mla=mla):
                host = _Host(mla=mla)
                host.mm[:] = os.urandom(host.nbytes)
                b = self.backend(host, group="alone-rt-%d" % mla)
                keys = _keys(4, b"rt%d" % mla)
                self.assertEqual(b.batch_set_v1(keys, _indices([0, 1, 2, 3])), [True] * 4)
                self.assertEqual(b.batch_exists(keys + _keys(2, b"none")), 4)
                before = bytes(host.mm)
                self.assertEqual(b.batch_get_v1(keys, _indices([8, 9, 10, 11])), [True] * 4)
                after = bytes(host.mm)
                halves = (1,) if mla else (0, 1)
                half = host.nbytes // len(halves)
                page = half // (TOKENS // PAGE)
                for h in range(len(halves)):
                    for i, (src, dst) in enumerate(zip([0, 1, 2, 3], [8, 9, 10, 11])):
                        s = h * half + src * page
                        d = h * half + dst * page
                        self.assertEqual(after[d:d + page], before[s:s + page],
                                         "half %d page %d" % (h, i))
                self.assertEqual(after[:8 * page], before[:8 * page])
                self.assertEqual(b.get_stats()["leases"], 0)

    def test_v2_calls_move_the_kv_pool_and_miss_other_pools(self):
        from types import SimpleNamespace as T
        host = _Host(mla=True)
        host.mm[:] = os.urandom(host.nbytes)
        b = self.backend(host, group="alone-v2")
        keys = _keys(2, b"v2")
        put = b.batch_set_v2([T(name="kv", keys=keys, host_indices=_indices([0, 1])),
                              T(name="mamba", keys=keys, host_indices=_indices([0, 1]))])
        self.assertEqual(put, {"kv": [True, True], "mamba": [False, False]})
        before = bytes(host.mm)
        got = b.batch_get_v2([T(name="kv", keys=keys, host_indices=_indices([4, 5])),
                              T(name="mamba", keys=keys, host_indices=None)])
        self.assertEqual(got, {"kv": [True, True], "mamba": [False, False]})
        page = host.nbytes // (TOKENS // PAGE)
        after = bytes(host.mm)
        for src, dst in ((0, 4), (1, 5)):
            self.assertEqual(after[dst * page:(dst + 1) * page],
                             before[src * page:(src + 1) * page])
        self.assertEqual(b.get_stats()["leases"], 0)

    def test_a_daemon_away_is_a_miss_and_recovery_follows(self):
        host = _Host()
        b = lsg.L3kvStorage(_config(os.path.join(self.daemon.dir, "nobody.sock")), {})
        b.register_mem_pool_host(host)
        b.on_host_pools_registered()        # down at registration: a warning, not an error
        self.addCleanup(b.close)
        keys = _keys(2, b"away")
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_get_v1(keys, _indices([0, 1])), [False, False])
        self.assertEqual(b.batch_set_v1(keys, _indices([0, 1])), [False, False])
        self.assertFalse(b.exists(keys[0]))
        r = b.batch_exists_v2(keys)
        self.assertEqual(r.kv_hit_pages, 0)
        b.socket = self.daemon.sock         # the daemon appears
        time.sleep(0.1)
        self.assertEqual(b.batch_set_v1(keys, _indices([0, 1])), [True, True])
        self.assertEqual(b.batch_exists(keys), 2)
        self.assertGreaterEqual(b.get_stats()["reconnects"], 1)

    def test_refusals_say_what_to_change(self):
        sock = self.daemon.sock
        with self.assertRaisesRegex(lsg.RefusedError, "interface_v1"):
            lsg.L3kvStorage(_config(sock, interface_v1=0), {})
        for host, text in ((_Host(layout="layer_first"), "page_first"),
                           (_Host(fd=False), "shm")):
            b = lsg.L3kvStorage(_config(sock), {})
            b.register_mem_pool_host(host)
            with self.assertRaisesRegex(lsg.RefusedError, text):
                b.on_host_pools_registered()
        b = lsg.L3kvStorage(_config(sock), {})
        with self.assertRaisesRegex(lsg.RefusedError, "swa"):
            b.register_mem_host_pool_v2(_Host(), "swa")

    def test_a_waiting_admit_never_blocks_a_publish(self):
        """TP 2: rank 0's prefetch ADMIT waits at the group's barrier for
        rank 1; meanwhile rank 0's storage writer publishes (the ADMIT is in
        flight, no lock held). Then rank 1 asks, both are admitted, both
        restore their own shard's bytes."""
        hosts = [_Host(), _Host()]
        for h in hosts:
            h.mm[:] = os.urandom(h.nbytes)
        b = [self.backend(hosts[r], tp_rank=r, tp_size=2, group="alone-tp2") for r in (0, 1)]
        keys = _keys(3, b"tp2")
        for r in (0, 1):
            self.assertEqual(b[r].batch_set_v1(keys, _indices([0, 1, 2])), [True] * 3)
        got = {}
        base = _stats(self.daemon.sock)["cache"]["admits"]
        t = threading.Thread(target=lambda: got.setdefault(0, b[0].batch_exists(keys)))
        t.start()
        deadline = time.monotonic() + 5
        while _stats(self.daemon.sock)["cache"]["admits"] == base and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(t.is_alive(), "rank 0's ADMIT must wait for rank 1")
        more = _keys(2, b"tp2-more")
        self.assertEqual(b[0].batch_set_v1(more, _indices([4, 5])), [True, True])
        self.assertTrue(t.is_alive(), "the publish went through while the ADMIT waited")
        self.assertEqual(b[1].batch_exists(keys), 3)
        t.join(5)
        self.assertEqual(got.get(0), 3)
        before = [bytes(h.mm) for h in hosts]
        res = {}
        ts = [threading.Thread(target=lambda r=r: res.setdefault(
            r, b[r].batch_get_v1(keys, _indices([8, 9, 10])))) for r in (0, 1)]
        for x in ts:
            x.start()
        for x in ts:
            x.join(10)
        self.assertEqual(res, {0: [True] * 3, 1: [True] * 3})
        page = hosts[0].nbytes // 2 // (TOKENS // PAGE)
        for r in (0, 1):
            after = bytes(hosts[r].mm)
            for half in (0, hosts[r].nbytes // 2):
                for src, dst in ((0, 8), (1, 9), (2, 10)):
                    self.assertEqual(after[half + dst * page:half + (dst + 1) * page],
                                     before[r][half + src * page:half + (src + 1) * page],
                                     "rank %d page %d" % (r, src))
            self.assertEqual(b[r].get_stats()["leases"], 0)

    def test_default_group_is_the_instances(self):
        """Two instances of one model differ; the ranks of one agree."""
        a0 = lsg.L3kvStorage(_config(self.daemon.sock, 0, 2), {})
        a1 = lsg.L3kvStorage(_config(self.daemon.sock, 1, 2), {})
        self.assertEqual(a0.group, a1.group)
        self.assertTrue(a0.group.startswith("sglang-alone-"), a0.group)
        self.assertNotEqual(lsg.default_group("m", "127.0.0.1:29500"),
                            lsg.default_group("m", "127.0.0.1:29501"))
        self.assertEqual(lsg.default_group("m", "h:1"), lsg.default_group("m", "h:1"))
        self.assertLessEqual(len(lsg.default_group("x" * 200, "h:1")) + 10, 63)
        g = lsg.L3kvStorage(_config(self.daemon.sock, group="mine"), {}).group
        self.assertEqual(g, "mine-pp0-dp0")

    def test_mamba_checkpoints_trailing_pages(self):
        """A Mamba pool beside kv: the checkpoint (temporal and conv state)
        after page 3 published from slot 1 and restored into slot 5 byte
        for byte; restorable_prefix_pages holds the lengths with their
        checkpoint only; no checkpoint, no hit, nothing left pinned."""
        from types import SimpleNamespace as T
        host, mamba = _Host(), _MambaHost()
        host.mm[:] = os.urandom(host.nbytes)
        b = lsg.L3kvStorage(_config(self.daemon.sock, group="alone-mamba"), {})
        b.register_mem_pool_host(host)
        b.register_mem_host_pool_v2(host, "kv")
        b.register_mem_host_pool_v2(mamba, "mamba")
        b.on_host_pools_registered()
        self.addCleanup(b.close)
        st = _stats(self.daemon.sock)
        self.assertEqual(st["memory"]["regions_mapped"], 4)
        keys = _keys(5, b"mamba")
        put = b.batch_set_v2([T(name="kv", keys=keys, host_indices=_indices(range(5))),
                              T(name="mamba", keys=[keys[2]], host_indices=[1])])
        self.assertEqual(put, {"kv": [True] * 5, "mamba": [True]})
        want = mamba.slot(1)
        ask = [T(name="mamba", keys=["__placeholder__"], hit_policy="trailing_pages",
                 host_indices=None)]
        r = b.batch_exists_v2(keys, ask)
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (3, [3]))
        self.assertEqual(r.extra_pool_hit_pages, {"kv": 5, "mamba": 3})
        self.assertEqual(b.batch_get_v1(keys[:3], _indices([8, 9, 10])), [True] * 3)
        got = b.batch_get_v2([T(name="mamba", keys=[keys[2]], host_indices=[5])])
        self.assertEqual(got, {"mamba": [True]})
        self.assertEqual(mamba.slot(5), want)
        self.assertEqual(b.get_stats()["leases"], 0)
        # KV for five pages, no checkpoint at any of them: no hit.
        other = _keys(2, b"mamba-none")
        b.batch_set_v1(other, _indices([12, 13]))
        r = b.batch_exists_v2(other, ask)
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (0, []))
        self.assertEqual(b.get_stats()["leases"], 0)
        st = _stats(self.daemon.sock)
        self.assertEqual((st["cache"]["leases_open"], st["dram"]["pins"]), (0, 0))
        # An SWA window (two trailing keys) is not stored: a miss, not an error.
        r = b.batch_exists_v2(keys, [T(name="mamba", keys=["a", "b"],
                                       hit_policy="trailing_pages", host_indices=None)])
        self.assertEqual(r.kv_hit_pages, 0)

    def test_mamba_without_fds_is_refused(self):
        host = _Host()
        b = lsg.L3kvStorage(_config(self.daemon.sock, group="alone-mamba-nofd"), {})
        b.register_mem_pool_host(host)
        b.register_mem_host_pool_v2(_MambaHost(fds=False), "mamba")
        with self.assertRaisesRegex(lsg.RefusedError, "shm"):
            b.on_host_pools_registered()
        self.assertEqual(_stats(self.daemon.sock)["attach"]["sessions"], 0)

    def test_counters_back_to_zero(self):
        host = _Host()
        b = self.backend(host, group="alone-zero")
        keys = _keys(3, b"zero")
        b.batch_set_v1(keys, _indices([0, 1, 2]))
        self.assertEqual(b.batch_exists(keys), 3)     # admitted, never fetched
        b.close()
        with l3kv.Client(self.daemon.sock) as c:
            st = c.stats()
        self.assertEqual((st["cache"]["leases_open"], st["dram"]["pins"]), (0, 0))


def _stats(sock):
    with l3kv.Client(sock) as c:
        return c.stats()


if __name__ == "__main__":
    unittest.main(verbosity=2)
