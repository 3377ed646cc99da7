#!/usr/bin/env python3
"""A Python engine with torch against a real l3kvd with copy_engine cuda.

The engine keeps its KV cache in a CUDA tensor, a slice of a larger one
(so the registration's offset is not 0 and pages of the larger tensor lie
around it), registers it through l3kv.torch as legacy CUDA IPC, and
drives the daemon through l3kv.Client:

  - publish, probe, admit, restore into other pages: every byte of the
    larger tensor checked with torch (restored pages, sources, the rest);
  - a restore while torch keeps the GPU busy with matmuls on a side stream;
  - a restore that waits on a CUDA IPC event: the engine queues a long
    kernel and then a sentinel write into the destination pages on a
    stream, records the event behind them, and restores with wait_event;
    the restored bytes must win (a first restore without the wait shows
    the late sentinel winning);
  - a large restore cancelled at once: the device memory does not change
    after CANCEL is answered, and exactly the landed pages were written;
  - the device claim by UUID: STATS and HEALTH list the tensor's GPU by
    its UUID, the registration l3kv.torch builds claims the daemon's index
    of it and is served there, and a claim of a device the daemon does not
    have (region device= or attach(device=)) is refused wrong_device.
After every test no lease or DRAM pin is left; the daemon exits 0 on
SIGTERM.

Exits 77 with the reason when torch is missing or finds no CUDA device;
`--probe` only says whether it could run (0) or not (77). Random bytes
come from L3KV_SEED when set, else a fresh seed; it is printed.

Run from the repository root:  python3 tests/python/test_gpu_torch.py
"""

import errno
import hashlib
import os
import re
import sys
import time
import unittest

SKIP = 77       # automake's "skipped"; tests/check_python.c reports it as a skip

from l3kvd_process import BUILD, Daemon  # first: it points sys.path and L3KV_LIB at the build

import l3kv  # noqa: E402
import l3kv.torch as lt  # noqa: E402
from l3kv import Attention, Decline, L3kvError, Layout, Pool, Status  # noqa: E402

try:
    import torch
except ImportError as e:
    torch = None
    _torch_error = str(e)

# The region: layer_first, pages of 64 tokens x 16 layers x 1 KiB (512
# bf16), so 1 MiB objects that the GPU scatters on restore and gathers on
# publish; PAD pages of the larger tensor before and after the slice.
TOKENS = 64
LAYERS = 16
TOKEN_ELEMS = 512
TOKEN_BYTES = 2 * TOKEN_ELEMS
OBJ = TOKENS * LAYERS * TOKEN_BYTES
PAD = 2
SENTINEL = 0xA5
BUSY_S = 4.0        # the busy matmuls' length
SLEEP_S = 1.5       # the engine's kernels before the sentinel write

_groups = iter(range(1, 1 << 30))


def skip_reason():
    """Why this cannot run here, or None."""
    if torch is None:
        return "torch is not installed (%s)" % _torch_error
    if not torch.cuda.is_available():
        return "torch %s finds no CUDA device (torch.cuda.is_available() is False)" % \
            torch.__version__
    return None


def note(msg):
    """A line for the C runner to echo: tests/check_python.c prints these."""
    # unittest's "test_x ... " may be waiting for its "ok" on the same stream: a
    # newline first, so that the runner finds the note at the start of a line
    print("\npython_gpu: " + msg, flush=True)


def page_hash(prefix, i):
    return hashlib.sha256(b"l3kv-gpu-torch %d %d" % (prefix, i)).digest()


class Engine:
    """One rank: `pages` KV pages (region 0) in the middle of a larger
    tensor, optionally a CUDA IPC event (region 1). device: the region's
    device claim (None: l3kv finds it by UUID)."""

    def __init__(self, sock, pages, gen, event=False, device=None):
        self.pages = pages
        self.backing = torch.empty(LAYERS, PAD + pages + PAD, TOKENS, TOKEN_ELEMS,
                                   dtype=torch.bfloat16, device="cuda")
        # Bytes of every page, the pads included; random, never zero.
        self.all_u8 = self.backing.view(torch.uint8)
        self.all_u8.copy_(torch.randint(1, 256, self.all_u8.shape, dtype=torch.uint8,
                                        device="cuda", generator=gen))
        self.kv = self.backing[:, PAD:PAD + pages]
        self.region = lt.cuda_ipc_region(self.kv, pool=0, layout="layer_first",
                                         token_bytes=TOKEN_BYTES, device=device)
        regions = [self.region]
        self.event = None
        if event:
            self.event = lt.ipc_event()
            regions.append(lt.event_region(self.event))
        layout = Layout(model="py-gpu-torch", kv_dtype="bf16", page_tokens=TOKENS,
                        attention=Attention.MLA)
        pools = [Pool("kv", OBJ, layers=LAYERS, schema="latent:512:bf16")]
        self.client = l3kv.Client(sock, 10000)
        self.client.set_timeout(60000)
        self.info = self.client.attach(layout, pools, regions, group="pygpu-%d" % next(_groups))
        torch.cuda.synchronize()

    def snapshot(self):
        """Every byte of the larger tensor, pads included, as of now."""
        snap = self.all_u8.clone()
        torch.cuda.synchronize()
        return snap

    def expect(self, before, src, dst, n=None):
        """before, with region pages src[:n] copied to dst[:n]."""
        n = len(src) if n is None else n
        want = before.clone()
        if n:
            s = torch.tensor([PAD + p for p in src[:n]], device="cuda")
            d = torch.tensor([PAD + p for p in dst[:n]], device="cuda")
            want[:, d] = before[:, s]
        return want

    def close(self):
        self.client.close()


class GpuTorchTest(unittest.TestCase):
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.seed = int(os.environ.get("L3KV_SEED") or (time.time_ns() & 0xFFFFFFFF))
        note("seed %d (L3KV_SEED=%d repeats it); torch %s on %s" % (
            cls.seed, cls.seed, torch.__version__, torch.cuda.get_device_name()))
        cls.gen = torch.Generator(device="cuda")
        cls.gen.manual_seed(cls.seed)
        cls.daemon = Daemon(BUILD, {"tiers": {"dram": {"size": "1 GiB"}},
                                    "copy_engine": "cuda"}, "l3kv-pygpu-",
                            start_s=30, stop_s=30)     # the cuda engine's start takes a while
        cls.dir, cls.sock = cls.daemon.dir, cls.daemon.sock
        try:
            with l3kv.Client(cls.sock, 5000) as c:
                if not c.server_info.caps & l3kv.Caps.CUDA_COPY:
                    raise RuntimeError("l3kvd with copy_engine cuda has no CUDA copy engine "
                                       "(caps %r)" % c.server_info.caps)
        except BaseException:
            cls.daemon.fail_start()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            # Every session gone: the daemon has closed its IPC mappings.
            st = cls.stats_when(lambda s: s["memory"]["regions_mapped"] == 0)
            mapped = st["memory"]["regions_mapped"]
        finally:
            rc = cls.daemon.stop()
            log = cls.daemon.log()
            cls.daemon.cleanup()
        if rc != 0 or mapped != 0:
            raise AssertionError("l3kvd: %d regions still mapped, exit %r on SIGTERM; its "
                                 "log:\n%s" % (mapped, rc, log))

    @classmethod
    def stats_when(cls, ok, seconds=5):
        """STATS, once ok(stats) holds or the time is up."""
        deadline = time.monotonic() + seconds
        with l3kv.Client(cls.sock, 5000) as c:
            while True:
                st = c.stats()
                if ok(st) or time.monotonic() > deadline:
                    return st
                time.sleep(0.02)

    def setUp(self):
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        self.engines = []
        st = self.stats_when(lambda s: (s["cache"]["leases_open"], s["dram"]["pins"],
                                        s["attach"]["sessions"]) == (0, 0, 0))
        self.assertEqual(st["cache"]["leases_open"], 0, "leases left open")
        self.assertEqual(st["dram"]["pins"], 0, "DRAM pins left")
        self.assertEqual(st["attach"]["sessions"], 0, "sessions left")

    def engine(self, pages, **kw):
        e = Engine(self.sock, pages, self.gen, **kw)
        self.engines.append(e)
        return e

    def assert_bytes(self, e, want, what):
        """Every byte of e's larger tensor is as want says; names the pages that differ."""
        torch.cuda.synchronize()
        if torch.equal(e.all_u8, want):
            return
        bad = (e.all_u8 != want).reshape(LAYERS, e.all_u8.shape[1], -1).any(2).any(0)
        pages = [p - PAD for p in bad.nonzero().flatten().tolist()]
        self.fail("%s: %d pages differ (region page numbers; negative or >= %d are the pads "
                  "around the region): %s" % (what, len(pages), e.pages, pages[:20]))

    def publish(self, e, prefix, src):
        hashes = [page_hash(prefix, i) for i in range(len(src))]
        r = e.client.publish(0, list(zip(hashes, src)))
        self.assertEqual((r.stored, r.present, r.bytes), (len(src), 0, len(src) * OBJ))
        return hashes

    def admit(self, e, request_id, hashes):
        a = e.client.admit(request_id, hashes, reserved_pages=len(hashes), timeout_ms=30000)
        self.assertEqual((a.admitted_pages, a.decline), (len(hashes), Decline.NONE))
        return a.lease

    def test_1_round_trip_every_byte(self):
        n = 32
        e = self.engine(2 * n)
        # The slice starts PAD pages into its storage.
        self.assertGreaterEqual(e.region.offset, PAD * TOKENS * TOKEN_BYTES)
        self.assertEqual((e.region.num_pages, e.region.layers, e.region.page_stride,
                          e.region.layer_stride), (2 * n, LAYERS, TOKENS * TOKEN_BYTES,
                                                   (PAD + 2 * n + PAD) * TOKENS * TOKEN_BYTES))
        src = list(range(n))
        dst = [2 * n - 1 - i for i in range(n)]
        before = e.snapshot()
        hashes = self.publish(e, 1, src)
        self.assert_bytes(e, before, "PUBLISH changed the engine's memory")
        self.assertEqual(tuple(e.client.probe(hashes + [page_hash(1, 999)])), (n, ()))
        self.assertEqual(e.client.probe(hashes[:5]).hit_pages, 5)
        lease = self.admit(e, 1, hashes)
        # with release=True the lease ends with the RESTORE's ok (issue 16)
        r = e.client.restore(lease, 0, dst, timeout_ms=60000, release=True)
        self.assertEqual((r.pages, r.partial, r.bytes), (n, False, n * OBJ))
        self.assert_bytes(e, e.expect(before, src, dst), "after RESTORE")
        with self.assertRaises(L3kvError) as cm:
            e.client.release(lease)
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        again = e.client.publish(0, list(zip(hashes, src)))
        self.assertEqual((again.stored, again.present), (0, n))

    def test_2_restore_beside_a_busy_gpu(self):
        n = 32
        e = self.engine(2 * n)
        src, dst = list(range(n)), [n + i for i in range(n)]
        hashes = self.publish(e, 2, src)
        lease = self.admit(e, 2, hashes)
        before = e.snapshot()

        # Square bf16 matmuls on a side stream, enough of them for BUSY_S; large
        # ones, so that their count stays below CUDA's queue of pending launches
        # (about 1000), past which queueing them would block this thread.
        side = torch.cuda.Stream()
        a = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda", generator=self.gen)
        b = torch.randn(16384, 16384, dtype=torch.bfloat16, device="cuda", generator=self.gen)
        c = torch.empty_like(a)
        torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        one = (time.perf_counter() - t) / 10
        count = max(1, int(BUSY_S / one))
        side.wait_stream(torch.cuda.current_stream())
        busy_done = torch.cuda.Event()
        with torch.cuda.stream(side):
            for _ in range(count):
                torch.mm(a, b, out=c)
            busy_done.record(side)
        t0 = time.perf_counter()
        r = e.client.restore(lease, 0, dst, timeout_ms=60000)
        took = time.perf_counter() - t0
        still_busy = not busy_done.query()
        side.synchronize()
        busy = time.perf_counter() - t0
        note("restore of %d MiB beside %d busy matmuls (%.1f ms each): %.1f ms; the busy work "
             "ended %.2f s after the restore began" % (n * OBJ >> 20, count, one * 1e3,
                                                       took * 1e3, busy))
        self.assertEqual((r.pages, r.bytes), (n, n * OBJ))
        self.assertTrue(still_busy, "the busy matmuls had ended when RESTORE answered "
                        "(%.2f s): it waited for them" % took)
        self.assert_bytes(e, e.expect(before, src, dst), "after a RESTORE beside a busy GPU")
        e.client.release(lease)

    def late_sentinel(self, e, stream, dst, seconds, event):
        """On stream: about `seconds` of matmuls, then SENTINEL into the dst pages (a
        contiguous run, a plain slice), then event."""
        lo, hi = PAD + dst[0], PAD + dst[-1] + 1
        self.assertEqual(list(dst), list(range(dst[0], dst[-1] + 1)))
        if not hasattr(self, "mm"):
            a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda", generator=self.gen)
            b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda", generator=self.gen)
            c = torch.empty_like(a)
            torch.mm(a, b, out=c)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(20):
                torch.mm(a, b, out=c)
            torch.cuda.synchronize()
            self.mm = (a, b, c, (time.perf_counter() - t) / 20)
        a, b, c, one = self.mm
        # The fill kernel once beforehand, on scratch memory of the same shape: CUDA
        # loads kernels lazily, and loading one waits for the work in flight, which
        # would make the sentinel write below wait for the matmuls on the host.
        scratch = torch.empty_like(e.all_u8)
        scratch[:, lo:hi] = SENTINEL
        torch.cuda.synchronize()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(max(1, min(900, int(seconds / one)))):
                torch.mm(a, b, out=c)
            e.all_u8[:, lo:hi] = SENTINEL
            event.record(stream)
        self.assertFalse(event.query(), "the late kernels ended as soon as they were queued")

    def test_3_restore_waits_for_an_ipc_event(self):
        n = 16
        e = self.engine(2 * n, event=True)
        ev_region = 1
        src, dst = list(range(n)), [n + i for i in range(n)]
        hashes = self.publish(e, 3, src)
        stream = torch.cuda.Stream()

        # Without the wait: the restore lands first, the late sentinel over it.
        before = e.snapshot()
        lease = self.admit(e, 31, hashes)
        done = torch.cuda.Event()
        self.late_sentinel(e, stream, dst, SLEEP_S, done)
        e.client.restore(lease, 0, dst, timeout_ms=60000)
        raced = not done.query()
        stream.synchronize()
        e.client.release(lease)
        # As test_2 shows, the daemon's copies run beside the engine's kernels: the
        # unwaited restore answers while they still run, and the sentinel lands on top.
        self.assertTrue(raced, "the late kernels had ended when the unwaited RESTORE "
                        "answered: this run cannot show what wait_event does")
        want = before.clone()
        want[:, PAD + dst[0]:PAD + dst[-1] + 1] = SENTINEL
        self.assert_bytes(e, want, "without wait_event the late sentinel wins")

        # With the wait: the daemon's copies start after the event, so they win.
        before = e.snapshot()
        lease = self.admit(e, 32, hashes)
        self.late_sentinel(e, stream, dst, SLEEP_S, e.event)
        t0 = time.perf_counter()
        r = e.client.restore(lease, 0, dst, timeout_ms=60000, wait_event=ev_region)
        took = time.perf_counter() - t0
        self.assertTrue(e.event.query(), "RESTORE with wait_event answered %.3f s in, before "
                        "the event it waits on completed" % took)
        note("RESTORE with wait_event behind %.1f s of the engine's kernels answered after "
             "%.2f s; without the wait it answered before them and was overwritten"
             % (SLEEP_S, took))
        self.assertEqual((r.pages, r.bytes), (n, n * OBJ))
        stream.synchronize()
        self.assert_bytes(e, e.expect(before, src, dst), "with wait_event the restore wins")
        e.client.release(lease)

        # Submitted the same way, through the completion path.
        before = e.snapshot()
        lease = self.admit(e, 33, hashes)
        self.late_sentinel(e, stream, dst, SLEEP_S / 4, e.event)
        ticket = e.client.submit_restore(lease, 0, dst, wait_event=ev_region)
        r = e.client.wait(ticket, 60).result()
        self.assertTrue(e.event.query(), "submitted RESTORE answered before its event")
        self.assertEqual(r.pages, n)
        stream.synchronize()
        self.assert_bytes(e, e.expect(before, src, dst), "submitted with wait_event")
        e.client.release(lease)

    def test_4_cancel_leaves_memory_still(self):
        n = 256
        e = self.engine(2 * n)
        src, dst = list(range(n)), [2 * n - 1 - i for i in range(n)]
        hashes = self.publish(e, 4, src)
        lease = self.admit(e, 4, hashes)
        before = e.snapshot()
        ticket = e.client.submit_restore(lease, 0, dst)
        landed = e.client.cancel(lease)
        # Answered once nothing can land: the memory must not change any more.
        after = e.snapshot()
        time.sleep(0.3)
        self.assert_bytes(e, after, "device memory changed after CANCEL was answered "
                          "(%d pages landed)" % landed)
        done = e.client.wait(ticket, 60)
        note("CANCEL behind a %d-page restore: %d pages landed, restore %s" % (
            n, landed, "ok" if done.ok else errno.errorcode.get(done.errno, done.errno)))
        if done.ok:
            self.assertEqual(landed, n, "RESTORE succeeded after CANCEL with %d of %d landed"
                             % (landed, n))
        else:
            self.assertEqual(done.errno, errno.ECANCELED, done.message)
        self.assertLessEqual(landed, n)
        self.assert_bytes(e, e.expect(before, src, dst, landed),
                          "after CANCEL with %d pages landed" % landed)
        e.client.release(lease)
        with self.assertRaises(L3kvError) as cm:
            e.client.release(lease)
        self.assertEqual(cm.exception.errno, errno.ENOENT)


    def test_5_device_claimed_by_uuid(self):
        uuid = lt.device_uuid(torch.cuda.current_device())
        self.assertRegex(uuid, r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                         r"[0-9a-f]{12}$", "torch's UUID of the current device")
        st = self.stats_when(lambda s: True)
        devs = st["copy"]["devices"]
        uuids = [d.get("uuid") for d in devs]
        note("this process's cuda:%d is %s; the daemon's devices: %s" % (
            torch.cuda.current_device(), uuid, uuids))
        for u in uuids:
            self.assertRegex(u or "", r"^GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}$",
                             "STATS copy.devices[].uuid as nvidia-smi prints it")
        self.assertIn(uuid, uuids, "STATS copy.devices does not list the tensor's GPU")
        want = uuids.index(uuid)
        with l3kv.Client(self.sock, 5000) as c:
            self.assertEqual(c.health()["device_uuids"], uuids)
            self.assertEqual(c.device_uuids(), tuple(uuids))
            self.assertEqual(c.device_for(uuid), want)

        # The registration l3kv.torch builds names the GPU by UUID; attach claims its index.
        e = self.engine(4)
        self.assertEqual((e.region.gpu_uuid, e.region.device), (uuid, None))
        self.assertEqual(e.info.device, want)
        st = self.stats_when(lambda s: s["copy"]["devices"][want]["regions"] >= 1)
        self.assertTrue(st["copy"]["devices"][want]["started"])
        self.assertGreaterEqual(st["copy"]["devices"][want]["regions"], 1)
        pub = st["copy"]["devices"][want]["publishes"]
        self.publish(e, 5, [0, 1])
        st = self.stats_when(lambda s: s["copy"]["devices"][want]["publishes"] > pub)
        self.assertEqual(st["copy"]["devices"][want]["publishes"], pub + 1,
                         "the publish ran on the claimed device's engine")

        # A device the daemon does not have: refused, by the region's claim or attach's.
        missing = len(devs)
        with self.assertRaises(L3kvError) as cm:
            self.engine(4, device=missing)
        self.assertEqual((cm.exception.errno, cm.exception.status),
                         (errno.ENXIO, Status.WRONG_DEVICE), cm.exception.message)
        self.assertIn("device %d is claimed" % missing, cm.exception.message)
        kv = torch.empty(LAYERS, 2, TOKENS, TOKEN_ELEMS, dtype=torch.bfloat16, device="cuda")
        with l3kv.Client(self.sock, 10000) as c:
            with self.assertRaises(L3kvError) as cm:
                c.attach(Layout(model="py-gpu-torch", kv_dtype="bf16", page_tokens=TOKENS,
                                attention=Attention.MLA),
                         [Pool("kv", OBJ, layers=LAYERS, schema="latent:512:bf16")],
                         [lt.cuda_ipc_region(kv, layout="layer_first", token_bytes=TOKEN_BYTES)],
                         group="pygpu-claim", device=missing)
            self.assertEqual(cm.exception.status, Status.WRONG_DEVICE, cm.exception.message)
            self.assertTrue(re.search(r"regions\[0\]: device \d+ is claimed",
                                      cm.exception.message), cm.exception.message)
        del kv


def main():
    why = skip_reason()
    if why is not None:
        print("SKIP: " + why, flush=True)
        return SKIP
    if sys.argv[1:] == ["--probe"]:
        print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name()), flush=True)
        return 0
    prog = unittest.main(verbosity=2, exit=False)
    for test, reason in prog.result.skipped:
        note("SKIPPED %s: %s" % (test.id().rsplit(".", 1)[-1], reason))
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
