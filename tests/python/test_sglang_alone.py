"""l3kv.sglang.L3kvStorage without SGLang or torch (standard library only).

The backend called the way SGLang 0.5.23's controller calls it, on a
stand-in host pool (a memfd and the attributes L3kvStorage reads), against
a real l3kvd: publish, admission at batch_exists, restore in batch_get_v1
into other pages (every byte), misses while the daemon is away and
recovery after, the refusals. tests/python/test_sglang.py does the same
through SGLang's own stack, where its venv could be made.
"""

import mmap
import os
import sys
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


def _config(sock, **extra):
    e = {"interface_v1": 1, "socket": sock, "reconnect_ms": 20, "reconnect_max_ms": 50}
    e.update(extra)
    return types.SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
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

    def backend(self, host, **extra):
        b = lsg.L3kvStorage(_config(self.daemon.sock, **extra), {})
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
        with self.assertRaisesRegex(lsg.RefusedError, "mamba"):
            b.register_mem_host_pool_v2(_Host(), "mamba")

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
