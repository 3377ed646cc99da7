#!/usr/bin/env python3
"""The Python client (lib/python/l3kv) against a real l3kvd.

Starts $L3KV_BUILD/l3kvd (default build/) on a socket in a mkdtemp
directory, drives it through l3kv.Client over $L3KV_BUILD/libl3kv.so with
memfd regions, checks every restored byte, the hybrid state-slot rules,
the non-blocking path and the error mapping; after every test no lease or
pin is left, and the daemon exits 0 on SIGTERM. Standard library only.

Run from the repository root:  python3 tests/python/test_client.py
"""

import array
import ctypes
import errno
import mmap
import os
import struct
import threading
import time
import unittest

from l3kvd_process import BUILD, Daemon  # first: it points sys.path and L3KV_LIB at the build

import l3kv  # noqa: E402
from l3kv import (Decline, HitPolicy, L3kvError, Layout, MemKind, Pool, PoolKind,  # noqa: E402
                  Prefetch, Region, StateDest, Status, Write)

PAGE_TOKENS = 4
LAYERS = 2
TOKEN_BYTES = 16
PAGE_BYTES = PAGE_TOKENS * LAYERS * TOKEN_BYTES
PAGES = 16
SLOTS = 4
SLOT_BYTES = 256
SENTINEL = b"\xa5" * SLOT_BYTES
SIDE_BYTES = 8      # per token of the sidecar's one layer

_groups = iter(range(1, 1 << 30))


def new_hashes(n):
    return [os.urandom(32) for _ in range(n)]


class FakeTensor:
    """What l3kv asks of a torch CPU tensor: data_ptr() and its size."""

    class device:
        type = "cpu"

    def __init__(self, raw, element_size):
        self.buf = ctypes.create_string_buffer(raw, len(raw))
        self.nbytes = len(raw)
        self._elem = element_size

    def data_ptr(self):
        return ctypes.addressof(self.buf)

    def element_size(self):
        return self._elem

    def is_contiguous(self):
        return True


class Memfd:
    """A sealable memfd, mapped shared."""

    def __init__(self, name, size):
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.size = size

    def close(self):
        self.map.close()
        os.close(self.fd)


class Engine:
    """One rank: a KV region of PAGES pages (region 0), optionally a
    state-slot region (region 1; slot 0 live, holding SENTINEL) and a
    trailing_pages(t) sidecar (region 2); attached in a group of its own
    unless one is given."""

    def __init__(self, daemon_sock, hybrid=False, trailing=None, group=None, group_size=1,
                 rank=0, **attach):
        self.kv = Memfd("l3kv-py-kv", PAGES * PAGE_BYTES)
        self.slots = self.side = None
        pools = [Pool("kv", PAGE_BYTES, PoolKind.KV, layers=LAYERS, schema="kv:test")]
        regions = [Region.page_first(0, self.kv.fd, PAGES, PAGE_TOKENS, LAYERS, TOKEN_BYTES)]
        live = []
        if hybrid:
            self.slots = Memfd("l3kv-py-state", SLOTS * SLOT_BYTES)
            self.slots.map[0:SLOT_BYTES] = SENTINEL
            pools.append(Pool("state", SLOT_BYTES, PoolKind.STATE, schema="conv:256"))
            regions.append(Region.slots(1, self.slots.fd, SLOTS, SLOT_BYTES))
            live = [0]
        if trailing is not None:
            self.side = Memfd("l3kv-py-swa", PAGES * PAGE_TOKENS * SIDE_BYTES)
            pools.append(Pool("swa", PAGE_TOKENS * SIDE_BYTES, PoolKind.SIDECAR,
                              hit_policy=HitPolicy.TRAILING, trailing=trailing))
            regions.append(Region.page_first(2, self.side.fd, PAGES, PAGE_TOKENS, 1, SIDE_BYTES))
        self.layout = Layout(model="py-test-hybrid" if hybrid else "py-test",
                             kv_dtype="bf16", page_tokens=PAGE_TOKENS, tp_size=group_size)
        self.group = group or "py-%d" % next(_groups)
        self.client = l3kv.Client(daemon_sock, 5000)
        self.info = self.client.attach(self.layout, pools, regions, live_slots=live,
                                       group=self.group, group_size=group_size,
                                       group_rank=rank, tp_rank=rank, **attach)

    def checkpoints(self, hashes, ends):
        """Publishes a checkpoint after each of these page counts, from slot 1."""
        for p in ends:
            self.slots.map[SLOT_BYTES:2 * SLOT_BYTES] = os.urandom(SLOT_BYTES)
            self.client.publish(1, [(hashes[p - 1], 1)])

    def fill(self, pages):
        """Random bytes into these KV pages; returns them by page."""
        data = {}
        for p in pages:
            data[p] = os.urandom(PAGE_BYTES)
            self.kv.map[p * PAGE_BYTES:(p + 1) * PAGE_BYTES] = data[p]
        return data

    def page(self, p):
        return bytes(self.kv.map[p * PAGE_BYTES:(p + 1) * PAGE_BYTES])

    def slot(self, s):
        return bytes(self.slots.map[s * SLOT_BYTES:(s + 1) * SLOT_BYTES])

    def close(self):
        self.client.close()
        for m in (self.kv, self.slots, self.side):
            if m is not None:
                m.close()


class ClientTest(unittest.TestCase):
    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(BUILD, {"tiers": {"dram": {"size": "64 MiB"}},
                                    "copy_engine": "host",
                                    "testing": {"debug_ops": True}}, "l3kv-py-")
        cls.dir, cls.sock = cls.daemon.dir, cls.daemon.sock

    @classmethod
    def tearDownClass(cls):
        rc = cls.daemon.stop()
        log = cls.daemon.log()
        cls.daemon.cleanup()
        if rc != 0:
            raise AssertionError("l3kvd exited %r on SIGTERM; its log:\n%s" % (rc, log))

    def setUp(self):
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        # Closing detached every rank: nothing may stay pinned or leased.
        deadline = time.monotonic() + 3
        while True:
            st = self.admin().stats()
            if (st["cache"]["leases_open"], st["dram"]["pins"]) == (0, 0) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.assertEqual(st["cache"]["leases_open"], 0)
        self.assertEqual(st["dram"]["pins"], 0)
        self.assertEqual(st["attach"]["sessions"], 0)

    def admin(self):
        c = l3kv.Client(self.sock, 5000)
        self.addCleanup(c.close)
        return c

    def engine(self, **kw):
        e = Engine(self.sock, **kw)
        self.engines.append(e)
        return e

    def publish_pages(self, e, pages, hashes):
        data = e.fill(pages)
        r = e.client.publish(0, list(zip(hashes, pages)))
        self.assertEqual((r.stored, r.present, r.bytes),
                         (len(pages), 0, len(pages) * PAGE_BYTES))
        return data

    def test_hello_health_and_stats(self):
        c = self.admin()
        info = c.server_info
        self.assertEqual(info.protocol, 1)
        self.assertTrue(info.caps & l3kv.Caps.HOST_COPY)
        self.assertTrue(info.server.startswith("l3kvd "))
        self.assertEqual(info.role, "decode")
        self.assertEqual(c.health()["status"], "ok")
        self.assertIn("cache", c.stats())
        self.assertEqual(l3kv.version(), "0.1.0")
        self.assertEqual(os.path.realpath(l3kv.library_path()),
                         os.path.realpath(os.path.join(BUILD, "libl3kv.so")))

    def test_list_and_reload(self):
        e = self.engine()
        hashes = new_hashes(4)
        self.publish_pages(e, range(4), hashes)
        adm = e.client.admit(7, hashes, reserved_pages=4)
        self.assertEqual(adm.admitted_pages, 4)
        c = self.admin()
        leases = c.list("leases")
        self.assertEqual((leases["count"], leases["total"], leases["truncated"]), (1, 1, False))
        lease = leases["leases"][0]
        self.assertEqual((lease["id"], lease["pages"], lease["state"], lease["group"]),
                         (adm.lease, 4, "admitted", e.group))
        self.assertEqual(lease["pid"], os.getpid())
        groups = c.list(l3kv.ListWhat.GROUPS)["groups"]
        self.assertIn(e.group, [g["id"] for g in groups])
        ns = c.list("namespaces", max=1)
        self.assertEqual(ns["count"], 1)
        self.assertTrue(ns["namespaces"][0]["name"].startswith("decode/py-test-"))
        with self.assertRaises(KeyError):
            c.list("nothing")
        e.client.release(adm.lease)
        # The daemon's own file, unchanged: nothing applied, nothing refused.
        r = c.reload()
        self.assertEqual((r["applied"], r["refused"]), ([], []))
        self.assertTrue(r["file"].endswith("l3kvd.json"))

    def test_publish_probe_admit_restore_every_byte(self):
        e = self.engine()
        self.assertTrue(e.info.ns.startswith("decode/py-test-"))
        self.assertEqual(e.info.group_members, 1)
        hashes = new_hashes(8)
        data = self.publish_pages(e, range(8), hashes)
        # The same pages again are present, not stored twice.
        again = e.client.publish(0, list(zip(hashes, range(8))))
        self.assertEqual((again.stored, again.present), (0, 8))

        # Hashes as a list or as one buffer; unknown pages end the prefix.
        self.assertEqual(tuple(e.client.probe(hashes + new_hashes(2))), (8, ()))
        self.assertEqual(e.client.probe(b"".join(hashes[:5])).hit_pages, 5)
        self.assertEqual(e.client.probe(new_hashes(1) + hashes).hit_pages, 0)

        # Hashes and pages as tensors (anything with data_ptr()).
        self.assertEqual(e.client.probe(FakeTensor(b"".join(hashes[:3]), 1)).hit_pages, 3)
        adm = e.client.admit(1, FakeTensor(b"".join(hashes), 1), reserved_pages=6)
        self.assertTrue(adm.admitted)
        self.assertEqual((adm.admitted_pages, adm.decline, adm.group_hit), (6, Decline.NONE, 8))
        self.assertGreater(adm.ttl_ms, 0)
        dst = [15, 9, 13, 8, 14, 10]
        r = e.client.restore(adm.lease, 0, FakeTensor(struct.pack("<6I", *dst), 4))
        self.assertEqual((r.pages, r.partial, r.bytes), (6, False, 6 * PAGE_BYTES))
        for i, p in enumerate(dst):
            self.assertEqual(e.page(p), data[i], "destination page %d" % p)
        for p in (11, 12):
            self.assertEqual(e.page(p), bytes(PAGE_BYTES), "page %d was not a destination" % p)
        for p in range(8):
            self.assertEqual(e.page(p), data[p], "source page %d" % p)
        # ADMIT is idempotent per request id while its lease lives.
        self.assertEqual(e.client.admit(1, hashes, reserved_pages=6), adm)
        e.client.release(adm.lease)

    def test_wait_event_must_name_an_event_region(self):
        # Region 0 is memory, not a CUDA event; 7 is no region: refused before
        # any byte moves, and the lease restores as before.
        e = self.engine()
        hashes = new_hashes(2)
        data = self.publish_pages(e, [0, 1], hashes)
        adm = e.client.admit(25, hashes, 2)
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(adm.lease, 0, [4, 5], wait_event=0)
        self.assertEqual((cm.exception.errno, cm.exception.status, cm.exception.message),
                         (errno.EINVAL, Status.INVALID,
                          "RESTORE: event region 0 is not an event registration"))
        done = e.client.wait(e.client.submit_restore(adm.lease, 0, [4, 5], wait_event=7), 5)
        self.assertEqual((done.errno, done.status, done.message),
                         (errno.EINVAL, Status.INVALID,
                          "RESTORE: event region 7 is not an event registration"))
        self.assertEqual((e.page(4), e.page(5)), (bytes(PAGE_BYTES), bytes(PAGE_BYTES)))
        with self.assertRaises(ValueError):
            e.client.restore(adm.lease, 0, [4, 5], wait_event=l3kv.REGION_NONE)
        r = e.client.restore(adm.lease, 0, [4, 5], wait_event=None)
        self.assertEqual(r.pages, 2)
        self.assertEqual((e.page(4), e.page(5)), (data[0], data[1]))
        e.client.release(adm.lease)
        # An event registration needs the cuda copy engine, as GPU memory does.
        c = l3kv.Client(self.sock, 5000)
        self.addCleanup(c.close)
        with self.assertRaises(L3kvError) as cm:
            c.attach(e.layout, [Pool("kv", PAGE_BYTES, layers=LAYERS)],
                     [Region.cuda_event(bytes(range(64)))], group="py-event")
        self.assertEqual((cm.exception.status, cm.exception.message), (
            Status.BAD_REGION, "regions[0]: a CUDA IPC event needs the cuda copy engine, and "
            "this daemon has none (copy_engine is host)"))

    def test_declined_admission_is_not_an_exception(self):
        e = self.engine()
        miss = e.client.admit(2, new_hashes(4), reserved_pages=4)
        self.assertFalse(miss.admitted)
        self.assertEqual((miss.lease, miss.admitted_pages, miss.decline), (0, 0, Decline.NO_HIT))
        hashes = new_hashes(2)
        self.publish_pages(e, [0, 1], hashes)
        none = e.client.admit(3, hashes, reserved_pages=0)
        self.assertEqual((none.lease, none.decline, none.group_hit),
                         (0, Decline.NO_RESERVATION, 2))

    def test_cancel_and_release(self):
        e = self.engine()
        hashes = new_hashes(4)
        self.publish_pages(e, range(4), hashes)
        # A ready lease: every page landed before the cancel.
        adm = e.client.admit(10, hashes, 4)
        e.client.restore(adm.lease, 0, [4, 5, 6, 7])
        self.assertEqual(e.client.cancel(adm.lease), 4)
        e.client.release(adm.lease)
        # An admitted lease: nothing landed, and its restore is cancelled.
        adm = e.client.admit(11, hashes, 4)
        self.assertEqual(e.client.cancel(adm.lease), 0)
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(adm.lease, 0, [8, 9, 10, 11])
        self.assertEqual((cm.exception.errno, cm.exception.status),
                         (errno.ECANCELED, Status.CANCELLED))
        self.assertEqual(e.page(8), bytes(PAGE_BYTES))
        e.client.release(adm.lease)
        with self.assertRaises(L3kvError) as cm:
            e.client.release(adm.lease)
        self.assertEqual((cm.exception.errno, cm.exception.status),
                         (errno.ENOENT, Status.NOT_FOUND))

    def test_device_claim_by_uuid(self):
        # This daemon has no GPU: no devices, no UUIDs, so no claim.
        c = self.admin()
        self.assertEqual(c.health()["device_uuids"], [])
        self.assertEqual(c.stats()["copy"]["devices"], [])
        before = c.stats()["requests"]["health"]
        self.assertEqual(c.device_uuids(), ())
        self.assertEqual(c.device_uuids(), ())      # asked once per client
        self.assertEqual(c.stats()["requests"]["health"], before + 1)
        u0, u2 = "GPU-0a1b2c3d-0000-1111-2222-333344445555", \
            "GPU-ffeeddcc-bbaa-9988-7766-554433221100"
        self.assertIsNone(c.device_for(u0))

        def gpu(uuid="", device=None):
            return Region(pool=0, num_pages=1, page_tokens=1, layers=1, token_bytes=64,
                          page_stride=64, layer_stride=64, token_stride=64, size=64,
                          kind=MemKind.CUDA_IPC, layout=l3kv.HostLayout.LAYER_FIRST,
                          handle=bytes(range(1, 65)), device=device, gpu_uuid=uuid)

        host = Region.page_first(0, 0, 1, 1, 1, 64)
        self.assertEqual(c._device_claim([gpu(u0)], None), None)     # not listed: no claim
        # A daemon whose device 0 is u0, device 2 is u2 and device 1's UUID is unknown.
        c._device_uuids = (u0, None, u2)
        self.assertEqual(c.device_for(u2), 2)
        self.assertEqual(c.device_for(u2[4:].upper()), 2)    # torch prints it bare
        self.assertIsNone(c.device_for("GPU-00000000-0000-0000-0000-000000000000"))
        self.assertIsNone(c.device_for(""))
        self.assertEqual(c._device_claim([gpu(u2)], None), 2)
        self.assertEqual(c._device_claim([gpu(u2), gpu(u2)], None), 2)
        self.assertEqual(c._device_claim([gpu(), gpu(u2)], None), 2)
        self.assertEqual(c._device_claim([gpu("GPU-dead")], None), None)
        self.assertEqual(c._device_claim([gpu(u2, device=1)], None), 1)   # the region's own
        self.assertEqual(c._device_claim([gpu(u2)], 0), 0)                 # attach(device=)
        self.assertEqual(c._device_claim([host], 3), 3)
        self.assertEqual(c._device_claim([host], None), None)
        with self.assertRaisesRegex(ValueError, r"regions\[1\] is on GPU-ffeeddcc.*device 2, "
                                    r"but regions\[0\] is on GPU-0a1b.*device 0: one "
                                    r"session's GPU memory is on one device"):
            c._device_claim([gpu(u0), gpu(u2)], None)
        for bad in (-1, 65535, "1", 1.0, True):
            with self.assertRaisesRegex(ValueError, r"^device: .* is not a device index"):
                c._device_claim([gpu(u0)], bad)
            with self.assertRaisesRegex(ValueError, r"^regions\[0\]\.device: "):
                c._device_claim([gpu(u0, device=bad)], None)
        # Without the cuda copy engine GPU memory is refused, whatever it claims; a bad
        # claim is refused before anything is sent.
        layout = Layout(model="py-device", kv_dtype="bf16", page_tokens=1)
        pools = [Pool("kv", 64, layers=1)]
        for kw in ({}, {"device": 5}):
            with self.assertRaises(L3kvError) as cm:
                c.attach(layout, pools, [gpu(u2)], group="py-device", **kw)
            self.assertEqual(cm.exception.status, Status.BAD_REGION)
        with self.assertRaises(ValueError):
            c.attach(layout, pools, [gpu(u2)], group="py-device", device=-2)
        # Host memory claims nothing (libl3kv sends the claim on GPU memory only).
        e = self.engine(device=7)
        self.assertIsNone(e.info.device)
        self.assertEqual(Status(40), Status.WRONG_DEVICE)

    def test_error_mapping(self):
        e = self.engine()
        hashes = new_hashes(2)
        data = self.publish_pages(e, [0, 1], hashes)
        adm = e.client.admit(20, hashes, 2)
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(adm.lease, 0, [2, PAGES + 3])
        err = cm.exception
        self.assertIsInstance(err, OSError)
        self.assertEqual((err.errno, err.status, err.status_name),
                         (errno.ERANGE, Status.OUT_OF_BOUNDS, "out_of_bounds"))
        self.assertEqual(err.message, "RESTORE: destination 1 is page 19 of a 16-page region")
        self.assertIn("out_of_bounds", str(err))
        # Refused before any byte moved: the lease still restores.
        self.assertEqual(e.page(2), bytes(PAGE_BYTES))
        self.assertEqual(e.client.restore(adm.lease, 0, [2, 3]).pages, 2)
        self.assertEqual(e.page(3), data[1])
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(adm.lease, 0, [2, 3])
        self.assertEqual(cm.exception.errno, errno.EISCONN)     # state: already restored
        e.client.release(adm.lease)
        # A field the daemon refuses; the connection stays usable.
        with self.assertRaises(L3kvError) as cm:
            e.client.publish(5, [(hashes[0], 0)])
        self.assertEqual((cm.exception.errno, cm.exception.status),
                         (errno.ERANGE, Status.OUT_OF_BOUNDS))
        self.assertEqual(e.client.probe(hashes).hit_pages, 2)
        # What cannot be put on the wire is refused before anything is sent.
        with self.assertRaises(ValueError):
            e.client.probe(b"\1" * 33)
        with self.assertRaises(ValueError):
            e.client.restore(1, 0, [-1])
        # Local failures carry no daemon status.
        with self.assertRaises(L3kvError) as cm:
            l3kv.Client(os.path.join(self.dir, "nobody.sock"), 1000)
        self.assertEqual((cm.exception.errno, cm.exception.status), (errno.ENOENT, 0))
        # A closed client refuses politely.
        c = self.admin()
        c.close()
        c.close()
        with self.assertRaises(L3kvError) as cm:
            c.stats()
        self.assertEqual(cm.exception.errno, errno.ENOTCONN)

    def test_restore_with_release_and_page_lists(self):
        # release=True: the lease ends with the RESTORE's ok (RELEASE then says
        # ENOENT); after a failure it stays, to be released as before. Pages as a
        # list, a tuple, a range, an array('I') and a generator land the same.
        e = self.engine()
        hashes = new_hashes(3)
        data = self.publish_pages(e, range(3), hashes)
        for i, dst in enumerate(([4, 5, 6], (7, 8, 9), range(10, 13), array.array("I", [13, 14, 15]),
                                 (p for p in [3, 11, 7]))):
            adm = e.client.admit(40 + i, hashes, 3)
            want = list(dst) if not hasattr(dst, "send") else [3, 11, 7]
            r = e.client.restore(adm.lease, 0, dst, release=True)
            self.assertEqual((r.pages, r.bytes), (3, 3 * PAGE_BYTES))
            for j, p in enumerate(want):
                self.assertEqual(e.page(p), data[j], "destination page %d" % p)
            with self.assertRaises(L3kvError) as cm:
                e.client.release(adm.lease)
            self.assertEqual(cm.exception.errno, errno.ENOENT)
        self.assertEqual(self.admin().stats()["dram"]["pins"], 0)
        # Submitted with the flag: the same.
        adm = e.client.admit(50, hashes, 3)
        done = e.client.wait(e.client.submit_restore(adm.lease, 0, [4, 5, 6], release=True), 5)
        self.assertEqual(done.result().pages, 3)
        with self.assertRaises(L3kvError):
            e.client.release(adm.lease)
        # A failed restore with the flag keeps its lease.
        adm = e.client.admit(51, hashes, 3)
        e.client.debug(l3kv.DebugOp.CORRUPT, 0, hashes[2])
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(adm.lease, 0, [4, 5, 6], release=True)
        self.assertEqual(cm.exception.errno, errno.ENODATA)
        e.client.release(adm.lease)
        # Page indices that do not fit 32 bits are refused, naming the entry.
        for bad in ([1, -1, 2], [1 << 32], [0.5, "x"]):
            with self.assertRaises((ValueError, TypeError)):
                e.client.restore(1, 0, bad)
        with self.assertRaisesRegex(ValueError, r"dst_pages\[1\]"):
            e.client.restore(1, 0, [1, -1, 2])
        # The spin setting takes microseconds up to 1 s.
        e.client.set_spin(200)
        self.assertEqual(e.client.probe(hashes[:2]).hit_pages, 2)
        e.client.set_spin(0)
        with self.assertRaises(L3kvError) as cm:
            e.client.set_spin(2000000)
        self.assertEqual(cm.exception.errno, errno.EINVAL)

    def test_lost_object_fails_the_restore(self):
        e = self.engine()
        hashes = new_hashes(3)
        self.publish_pages(e, range(3), hashes)
        adm = e.client.admit(30, hashes, 3)
        e.client.debug(l3kv.DebugOp.CORRUPT, 0, hashes[1])
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(adm.lease, 0, [5, 6, 7])
        self.assertEqual((cm.exception.errno, cm.exception.status), (errno.ENODATA, Status.LOST))
        e.client.release(adm.lease)
        self.assertEqual(e.client.probe(hashes).hit_pages, 1)

    def test_hybrid_state_slot(self):
        e = self.engine(hybrid=True)
        h = new_hashes(4)
        data = self.publish_pages(e, range(4), h)
        # Checkpoints at 2 pages (slot 1) and at 4 pages (slot 2): keyed by
        # the hash of the page they end on.
        ck2, ck4 = os.urandom(SLOT_BYTES), os.urandom(SLOT_BYTES)
        e.slots.map[1 * SLOT_BYTES:2 * SLOT_BYTES] = ck2
        e.slots.map[2 * SLOT_BYTES:3 * SLOT_BYTES] = ck4
        r = e.client.publish(1, [(h[1], 1), (h[3], 2)])
        self.assertEqual((r.stored, r.bytes), (2, 2 * SLOT_BYTES))

        self.assertEqual(tuple(e.client.probe(h)), (4, (2, 4)))
        self.assertEqual(tuple(e.client.probe(h[:3])), (2, (2,)))
        self.assertEqual(tuple(e.client.probe(h[:1])), (0, ()))

        # No usable canonical slot: none, live, outside the region.
        for slot in (None, 0, SLOTS):
            self.assertEqual(e.client.admit(40, h, 4, state_slot=slot).decline,
                             Decline.NO_SLOT, "slot %r" % slot)
        # The largest common stop point within the reservation.
        a = e.client.admit(41, h, 3, state_slot=3)
        self.assertEqual((a.admitted_pages, a.group_hit), (2, 4))
        # The slot is outstanding for that lease until its restore ends.
        self.assertEqual(e.client.admit(42, h, 4, state_slot=3).decline, Decline.SLOT_BUSY)

        with self.assertRaises(L3kvError) as cm:
            e.client.restore(a.lease, 0, [10, 11], state=(1, 0))
        self.assertEqual((cm.exception.errno, cm.exception.status),
                         (errno.EADDRINUSE, Status.SLOT))
        with self.assertRaises(L3kvError) as cm:
            e.client.restore(a.lease, 0, [10, 11], state=StateDest(0, 3))
        self.assertEqual(cm.exception.status, Status.INVALID)
        r = e.client.restore(a.lease, 0, [10, 11], state=StateDest(1, 3))
        self.assertEqual((r.pages, r.bytes), (2, 2 * PAGE_BYTES))
        self.assertEqual((e.page(10), e.page(11)), (data[0], data[1]))
        self.assertEqual(e.slot(3), ck2)
        self.assertEqual(e.slot(0), SENTINEL, "the live slot was written")

        # Restored: the slot is the engine's again.
        b = e.client.admit(43, h, 4, state_slot=3)
        self.assertEqual(b.admitted_pages, 4)
        e.client.release(a.lease)
        e.client.restore(b.lease, 0, [12, 13, 14, 15], state=(1, 3))
        self.assertEqual([e.page(p) for p in (12, 13, 14, 15)], [data[i] for i in range(4)])
        self.assertEqual(e.slot(3), ck4)
        self.assertEqual(e.slot(0), SENTINEL, "the live slot was written")
        e.client.release(b.lease)

    def test_stop_points_are_an_intersection(self):
        h = new_hashes(4)
        # One rank: checkpoints {1, 4}, a trailing_pages(1) sidecar holding
        # pages 0 and 2, so {1, 3}: only 1 is common.
        e = self.engine(hybrid=True, trailing=1)
        e.fill(range(4))
        e.client.publish(0, list(zip(h, range(4))))
        e.checkpoints(h, [1, 4])
        e.client.publish(2, [(h[0], 0), (h[2], 2)])
        self.assertEqual(tuple(e.client.probe(h)), (1, (1,)))

        # Two ranks, each in its own shard: A {2, 4} and B {3, 4} share 4.
        group = "py-%d" % next(_groups)
        a = self.engine(hybrid=True, group=group, group_size=2, rank=0)
        b = self.engine(hybrid=True, group=group, group_size=2, rank=1)
        self.assertEqual(b.info.group_members, 2)
        for r in (a, b):
            r.fill(range(4))
            r.client.publish(0, list(zip(h, range(4))))
        a.checkpoints(h, [2, 4])
        b.checkpoints(h, [3])
        # B {3}: nothing in common (not min(4, 3) = 3, which A cannot stop at).
        self.assertEqual(tuple(a.client.probe(h)), (0, ()))
        b.checkpoints(h, [4])
        self.assertEqual(tuple(a.client.probe(h)), (4, (4,)))
        self.assertEqual(tuple(b.client.probe(h)), (4, (4,)))

        # ADMIT is a barrier across both ranks, with the same promise.
        def admit_both(rid, reserved):
            ta = a.client.submit_admit(rid, h, reserved, state_slot=2)
            tb = b.client.submit_admit(rid, h, reserved, state_slot=3)
            return a.client.wait(ta, 5).result(), b.client.wait(tb, 5).result()

        ra, rb = admit_both(70, 3)      # no common stop point within 3 pages
        self.assertEqual((ra.decline, ra.group_hit, rb.decline),
                         (Decline.NO_RESERVATION, 4, Decline.NO_RESERVATION))
        ra, rb = admit_both(71, 4)
        self.assertEqual((ra.admitted_pages, rb.admitted_pages), (4, 4))
        ta = a.client.submit_restore(ra.lease, 0, [4, 5, 6, 7], state=(1, 2))
        tb = b.client.submit_restore(rb.lease, 0, [8, 9, 10, 11], state=(1, 3))
        self.assertEqual(a.client.wait(ta, 5).result().pages, 4)
        self.assertEqual(b.client.wait(tb, 5).result().pages, 4)
        self.assertEqual([a.page(p) for p in (4, 5, 6, 7)], [a.page(p) for p in range(4)])
        self.assertEqual([b.page(p) for p in (8, 9, 10, 11)], [b.page(p) for p in range(4)])
        self.assertEqual((a.slot(0), b.slot(0)), (SENTINEL, SENTINEL))
        a.client.release(ra.lease)
        b.client.release(rb.lease)

    def test_set_policy(self):
        e = self.engine()
        e.client.set_policy(Prefetch.BEST_EFFORT, Write.THROUGH, 50)
        e.client.set_policy(Prefetch.BEST_EFFORT, Write.THROUGH, 50)    # the same: no-op
        with self.assertRaises(L3kvError) as cm:
            e.client.set_policy(Prefetch.TIMEOUT, Write.THROUGH, 0)
        self.assertEqual((cm.exception.errno, cm.exception.status), (errno.EINVAL, Status.INVALID))
        hashes = new_hashes(1)
        self.publish_pages(e, [0], hashes)
        adm = e.client.admit(50, hashes, 1)
        with self.assertRaises(L3kvError) as cm:
            e.client.set_policy(Prefetch.WAIT_COMPLETE, Write.THROUGH)
        self.assertEqual((cm.exception.errno, cm.exception.status), (errno.EBUSY, Status.BUSY))
        e.client.set_policy(Prefetch.BEST_EFFORT, Write.THROUGH, 50)    # no-op, even busy
        # An ended (cancelled) lease does not keep the group busy.
        e.client.cancel(adm.lease)
        e.client.set_policy(Prefetch.WAIT_COMPLETE, Write.THROUGH)
        e.client.release(adm.lease)

    def test_nonblocking(self):
        e = self.engine(hybrid=True)
        h = new_hashes(4)
        data = e.fill(range(4))
        ck = os.urandom(SLOT_BYTES)
        e.slots.map[2 * SLOT_BYTES:3 * SLOT_BYTES] = ck
        c = e.client
        self.assertGreaterEqual(c.fileno(), 0)
        t_kv = c.submit_publish(0, list(zip(h, range(4))))
        t_ck = c.submit_publish(1, [(h[3], 2)])
        got = {}
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            for done in c.poll_completions(timeout=1):
                got[done.ticket] = done
        self.assertEqual(got[t_kv].op, l3kv.Op.PUBLISH)
        self.assertEqual(got[t_kv].result().stored, 4)
        self.assertEqual(got[t_ck].result().stored, 1)

        t_probe = c.submit_probe(h)
        t_admit = c.submit_admit(60, h, 4, state_slot=1)
        t_health = c.submit_health()
        self.assertLess(t_probe, t_admit)
        adm = c.wait(t_admit, 5).result()
        self.assertEqual(adm.admitted_pages, 4)
        # The others were kept for poll_completions(), or come later.
        rest = {}
        deadline = time.monotonic() + 5
        while len(rest) < 2 and time.monotonic() < deadline:
            rest.update((d.ticket, d) for d in c.poll_completions(timeout=1))
        self.assertEqual(tuple(rest[t_probe].result()), (4, (4,)))
        self.assertEqual(rest[t_health].result()["status"], "ok")

        t_restore = c.submit_restore(adm.lease, 0, [8, 9, 10, 11], state=(1, 1))
        r = c.wait(t_restore, 5).result()
        self.assertEqual(r.pages, 4)
        self.assertEqual([e.page(p) for p in (8, 9, 10, 11)], [data[i] for i in range(4)])
        self.assertEqual(e.slot(1), ck)
        self.assertEqual(c.wait(c.submit_cancel(adm.lease), 5).result(), 4)
        self.assertIsNone(c.wait(c.submit_release(adm.lease), 5).result())

        bad = c.wait(c.submit_release(adm.lease), 5)
        self.assertFalse(bad.ok)
        self.assertEqual((bad.errno, bad.status), (errno.ENOENT, Status.NOT_FOUND))
        self.assertTrue(bad.message.startswith("RELEASE: no lease"))
        with self.assertRaises(L3kvError):
            bad.result()
        self.assertIn("cache", c.wait(c.submit_stats(), 5).result())
        self.assertEqual(list(c.poll_completions()), [])

    def test_threads_wait_on_one_connection(self):
        """Two ranks of one group on one connection each: rank A's ADMIT
        waits at the barrier in one thread while another thread of A's
        waits for a PUBLISH on the same Client; the publish comes back
        first. A forgotten ticket's completion is dropped."""
        group = "py-%d" % next(_groups)
        a = self.engine(group=group, group_size=2, rank=0)
        b = self.engine(group=group, group_size=2, rank=1)
        h = new_hashes(2)
        for r in (a, b):
            r.fill(range(2))
            r.client.publish(0, list(zip(h, range(2))))
        got = {}
        t = threading.Thread(target=lambda: got.setdefault(
            "admit", a.client.wait(a.client.submit_admit(80, h, 2), 5).result()))
        t.start()
        time.sleep(0.05)
        pub = a.client.wait(a.client.submit_publish(0, [(new_hashes(1)[0], 3)]), 5).result()
        self.assertEqual(pub.stored, 1)
        self.assertTrue(t.is_alive())
        rb = b.client.admit(80, h, 2)
        t.join(5)
        self.assertEqual((got["admit"].admitted_pages, rb.admitted_pages), (2, 2))
        a.client.release(got["admit"].lease)
        b.client.release(rb.lease)
        ticket = a.client.submit_stats()
        a.client.forget(ticket)
        self.assertIn("cache", a.client.wait(a.client.submit_stats(), 5).result())
        self.assertEqual(list(a.client.poll_completions(timeout=0.1)), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
