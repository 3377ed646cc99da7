"""l3kv.Client: one connection to l3kvd, every call through libl3kv
(l3kv.clib), blocking or submitted with completions read from fileno()."""

import collections
import ctypes
import errno as _errno
import json
import os
import select
import struct
import threading
import time
from typing import Iterator, Optional, Sequence, Tuple

from .clib import (_CAdmitArgs, _CAdmitResult, _CAttachArgs, _CAttachInfo, _CCompletion,
                   _CLayout, _CPool, _CPublishResult, _CRegion, _CRestoreResult,
                   _CServerInfo, _CStateDest, _P, _address, _fileno, _hash32, _hashes, _load,
                   _pages, _probe_decode, _publish_pages, _restore_args, _state_dest, _text,
                   _uint, default_socket, library_path, strerror)
from .values import *  # noqa: F401,F403

def _uuid_key(uuid) -> str:
    """A GPU UUID compared as its 32 hex digits: "GPU-"/"MIG-" prefix,
    dashes and case aside (torch prints it bare, nvidia-smi with GPU-)."""
    s = str(uuid).strip().lower()
    for p in ("gpu-", "mig-"):
        if s.startswith(p):
            s = s[len(p):]
    return s.replace("-", "")


def _device_index(device, what: str) -> int:
    """A daemon device index: an int 0..65534 (l3kv_set_device's range)."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise ValueError("%s: %r is not a device index (an int; the daemon's numbering, "
                         "HEALTH device_uuids)" % (what, device))
    if not 0 <= device <= 65534:
        raise ValueError("%s: %d is not a device index (0..65534)" % (what, device))
    return device


class Client:
    """One connection to l3kvd. Blocking calls wait at most the connection's
    timeout (ADMIT and RESTORE: their own); the submit_*() calls return a
    ticket at once, and poll_completions() hands back what finished.

    Calls are serialised by a lock, so threads may share a Client; the C
    library itself is not thread-safe."""

    def __init__(self, socket: Optional[str] = None, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self._lib = _load()
        self._lock = threading.RLock()
        self._stash = collections.deque()   # completions wait() set aside
        self._reading = False               # a wait() reads the socket (outside the lock)
        self._read_done = threading.Condition(self._lock)
        self._forgotten = set()             # tickets whose completions are dropped
        self._device_uuids = None           # HEALTH's device_uuids, asked once
        self._k = None
        k = ctypes.c_void_p()
        path = None if socket is None else os.fsencode(socket)
        rc = self._lib.l3kv_connect(path, int(timeout_ms), ctypes.byref(k))
        if rc != 0:
            where = socket if socket is not None else default_socket()
            raise L3kvError(-rc, 0, "connect %s: %s" % (where, strerror(rc)))
        self._k = k
        self.socket = socket if socket is not None else default_socket()

    # Plumbing.

    def _handle(self):
        if self._k is None:
            raise L3kvError(_errno.ENOTCONN, 0, "l3kv: the client is closed")
        return self._k

    def _error(self, rc: int) -> L3kvError:
        """The failure of the call that just returned rc; under the lock."""
        status = self._lib.l3kv_last_status(self._k) if self._k is not None else 0
        text = self._lib.l3kv_last_error(self._k) if self._k is not None else b""
        text = text.decode(errors="replace") if text else ""
        return L3kvError(-rc, status, text or strerror(rc))

    def _check(self, rc: int):
        if rc != 0:
            raise self._error(rc)

    # Connection.

    def close(self):
        """Closes the connection; in-flight requests are dropped. Idempotent."""
        with self._lock:
            if self._k is not None:
                self._lib.l3kv_close(self._k)
                self._k = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if getattr(self, "_k", None) is not None:
                self._lib.l3kv_close(self._k)
                self._k = None
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        return self._k is None

    def set_timeout(self, timeout_ms: int):
        """The default timeout of blocking calls; TIMEOUT_INFINITE waits forever."""
        with self._lock:
            self._check(self._lib.l3kv_set_timeout(self._handle(), int(timeout_ms)))

    def set_spin(self, spin_us: int):
        """Blocking calls poll without sleeping for up to spin_us microseconds
        before they sleep (l3kv_set_spin; 0: they sleep at once). SPIN_AUTO,
        the default: they sleep until shortly before a reply is due, then spin
        (at most 300 us a call; a RESTORE is due as long after as the last ones
        took)."""
        with self._lock:
            self._check(self._lib.l3kv_set_spin(self._handle(), _uint(spin_us, 32, "spin_us")))

    @property
    def server_info(self) -> ServerInfo:
        with self._lock:
            i = _CServerInfo()
            self._check(self._lib.l3kv_server_info(self._handle(), ctypes.byref(i)))
        return ServerInfo(i.protocol, Caps(i.caps), i.max_frame, i.lease_ttl_ms,
                          i.server.decode(errors="replace"), i.role.decode(errors="replace"))

    # GPU devices: the daemon's numbering, found by UUID.

    def device_uuids(self) -> Tuple[Optional[str], ...]:
        """The GPU UUID of each of the daemon's devices ("GPU-...", as
        nvidia-smi prints it; None where the daemon does not know it): entry
        i is device i, what a region claims. () without a GPU, or from a
        daemon that does not say. Asked (HEALTH) once per client."""
        with self._lock:
            if self._device_uuids is None:
                got = self.health().get("device_uuids")
                self._device_uuids = tuple(u if isinstance(u, str) else None
                                           for u in got) if isinstance(got, list) else ()
            return self._device_uuids

    def device_for(self, uuid: str) -> Optional[int]:
        """The daemon's index of the GPU whose UUID this is (with or without
        its "GPU-" prefix, any case), or None where the daemon lists no such
        GPU: the engine's device ordinals may differ from the daemon's
        (another CUDA_VISIBLE_DEVICES), its UUIDs do not."""
        want = _uuid_key(uuid)
        if not want:
            return None
        for i, u in enumerate(self.device_uuids()):
            if u is not None and _uuid_key(u) == want:
                return i
        return None

    def _device_claim(self, regions: Sequence[Region], device: Optional[int]) -> Optional[int]:
        """The device attach() claims for the GPU regions: device when given,
        else the regions' own (Region.device, else their gpu_uuid found in
        the daemon's list), else None (no claim). ValueError when two
        regions name different devices: one session's memory is on one."""
        gpu = [(i, r) for i, r in enumerate(regions)
               if int(r.kind) in (MemKind.CUDA_IPC, MemKind.CUMEM_FD)]
        if device is not None:
            return _device_index(device, "device")
        claim = None
        for i, r in gpu:
            if r.device is not None:
                c, how = _device_index(r.device, "regions[%d].device" % i), "claims"
            elif r.gpu_uuid:
                c, how = self.device_for(r.gpu_uuid), "is on %s, the daemon's" % r.gpu_uuid
            else:
                continue
            if c is None:
                continue
            if claim is not None and c != claim[0]:
                raise ValueError("regions[%d] %s device %d, but regions[%d] %s device %d: one "
                                 "session's GPU memory is on one device" % (
                                     i, how, c, claim[1], claim[2], claim[0]))
            if claim is None:
                claim = (c, i, how)
        return None if claim is None else claim[0]

    # ATTACH, DETACH, administration.

    def attach(self, layout: Layout, pools: Sequence[Pool], regions: Sequence[Region] = (),
               live_slots: Sequence[int] = (), group: str = "", group_size: int = 1,
               group_rank: int = 0, tp_rank: int = 0,
               prefetch: Prefetch = Prefetch.WAIT_COMPLETE, write: Write = Write.THROUGH,
               prefetch_timeout_ms: int = 0, timeout_ms: int = TIMEOUT_DEFAULT,
               device: Optional[int] = None) -> AttachInfo:
        """Registers this rank: layout, pools, memory and policies. The
        regions' fds are sent with the request and stay the caller's.

        GPU memory claims a device of the daemon (its index, as HEALTH's
        device_uuids lists them): device when given, else each region's
        Region.device, else the index of the GPU whose UUID is the region's
        gpu_uuid (l3kv.torch fills it in), else none: the daemon then takes
        the device the memory is on. A claim the memory contradicts is
        refused (L3kvError ENXIO, status WRONG_DEVICE)."""
        keep = []
        claim = self._device_claim(list(regions), device)

        def cstr(s, what):
            b = _text(s, what)
            keep.append(b)
            return b

        a = _CAttachArgs()
        lo = a.layout
        lo.model = cstr(layout.model, "layout.model")
        lo.kv_dtype = cstr(layout.kv_dtype, "layout.kv_dtype")
        lo.hash_scheme = cstr(layout.hash_scheme, "layout.hash_scheme")
        lo.hash_len = _uint(layout.hash_len, 32, "layout.hash_len")
        lo.tp_size = _uint(layout.tp_size, 32, "layout.tp_size")
        lo.dcp_size = _uint(layout.dcp_size, 32, "layout.dcp_size")
        lo.pp_size = _uint(layout.pp_size, 32, "layout.pp_size")
        lo.cp_size = _uint(layout.cp_size, 32, "layout.cp_size")
        lo.dcp_rank = _uint(layout.dcp_rank, 32, "layout.dcp_rank")
        lo.pp_rank = _uint(layout.pp_rank, 32, "layout.pp_rank")
        lo.host_layout = int(layout.host_layout)
        lo.attention = int(layout.attention)
        lo.page_tokens = _uint(layout.page_tokens, 32, "layout.page_tokens")
        lpt = layout.page_tokens if layout.logical_page_tokens is None \
            else layout.logical_page_tokens
        lo.logical_page_tokens = _uint(lpt, 32, "layout.logical_page_tokens")
        lo.seed = _uint(layout.seed, 64, "layout.seed")

        pools = list(pools)
        if pools:
            parr = (_CPool * len(pools))()
            for i, p in enumerate(pools):
                parr[i].name = cstr(p.name, "pools[%d].name" % i)
                parr[i].kind = int(p.kind)
                parr[i].hit_policy = int(p.hit_policy)
                parr[i].trailing = _uint(p.trailing, 32, "pools[%d].trailing" % i)
                parr[i].layers = _uint(p.layers, 32, "pools[%d].layers" % i)
                parr[i].object_bytes = _uint(p.object_bytes, 64, "pools[%d].object_bytes" % i)
                parr[i].schema = cstr(p.schema, "pools[%d].schema" % i)
            a.pools = parr
            keep.append(parr)
        a.npools = len(pools)

        regions = list(regions)
        if regions:
            rarr = (_CRegion * len(regions))()
            for i, r in enumerate(regions):
                w = rarr[i]
                w.pool = _uint(r.pool, 32, "regions[%d].pool" % i)
                w.kind = int(r.kind)
                w.layout = int(r.layout)
                w.fd = _fileno(r.fd)
                w.offset = _uint(r.offset, 64, "regions[%d].offset" % i)
                w.size = _uint(r.size, 64, "regions[%d].size" % i)
                w.num_pages = _uint(r.num_pages, 32, "regions[%d].num_pages" % i)
                w.page_tokens = _uint(r.page_tokens, 32, "regions[%d].page_tokens" % i)
                w.layers = _uint(r.layers, 32, "regions[%d].layers" % i)
                w.token_bytes = _uint(r.token_bytes, 32, "regions[%d].token_bytes" % i)
                w.page_stride = _uint(r.page_stride, 64, "regions[%d].page_stride" % i)
                w.layer_stride = _uint(r.layer_stride, 64, "regions[%d].layer_stride" % i)
                w.token_stride = _uint(r.token_stride, 64, "regions[%d].token_stride" % i)
                if r.handle:
                    h = bytes(r.handle)
                    if len(h) > HANDLE_LEN:
                        raise ValueError("regions[%d].handle: %d bytes (at most %d)"
                                         % (i, len(h), HANDLE_LEN))
                    w.handle[:len(h)] = h
            a.regions = rarr
            keep.append(rarr)
        a.nregions = len(regions)

        live, nlive, live_keep = _pages(live_slots, "live_slots")
        if nlive:
            a.live_slots = ctypes.cast(live, _P(ctypes.c_uint32))
        a.nlive = nlive
        keep.append(live_keep)
        a.group = cstr(group, "group")
        a.group_size = _uint(group_size, 32, "group_size")
        a.group_rank = _uint(group_rank, 32, "group_rank")
        a.tp_rank = _uint(tp_rank, 32, "tp_rank")
        a.prefetch = int(prefetch)
        a.prefetch_timeout_ms = _uint(prefetch_timeout_ms, 32, "prefetch_timeout_ms")
        a.write = int(write)
        a.timeout_ms = int(timeout_ms)

        info = _CAttachInfo()
        set_device = getattr(self._lib, "l3kv_set_device", None)
        if claim is not None and set_device is None:
            raise L3kvError(_errno.ENOSYS, 0, "a device claim: this libl3kv (%s) has no "
                            "l3kv_set_device" % library_path())
        with self._lock:
            # The claim is the connection's: set it (or clear an earlier one) each time.
            if set_device is not None:
                self._check(set_device(self._handle(), DEVICE_ANY if claim is None else claim))
            self._check(self._lib.l3kv_attach(self._handle(), ctypes.byref(a),
                                              ctypes.byref(info)))
        gpu = any(int(r.kind) in (MemKind.CUDA_IPC, MemKind.CUMEM_FD) for r in regions)
        return AttachInfo(bytes(info.fingerprint), info.ns.decode(errors="replace"),
                          info.session, info.lease_ttl_ms, info.group_members,
                          claim if gpu else None)

    def detach(self):
        """Leaves; the daemon keeps the stored data."""
        with self._lock:
            self._check(self._lib.l3kv_detach(self._handle()))

    def _json(self, fn, *args) -> dict:
        p = ctypes.c_void_p()
        with self._lock:
            self._check(fn(self._handle(), *args, ctypes.byref(p)))
        try:
            text = ctypes.string_at(p.value).decode() if p.value else ""
        finally:
            self._lib.l3kv_free(p)
        return json.loads(text) if text else {}

    def stats(self) -> dict:
        """The daemon's counters (STATS), as a dict."""
        return self._json(self._lib.l3kv_stats)

    def health(self) -> dict:
        """The daemon's short health document (HEALTH), as a dict."""
        return self._json(self._lib.l3kv_health)

    def reload(self) -> dict:
        """Makes the daemon re-read its config file (RELOAD; root and the
        daemon's uid only): {"file", "applied": [...], "refused": [...]}.
        A bad file raises L3kvError (EINVAL) naming the key and changes
        nothing."""
        return self._json(self._lib.l3kv_reload)

    def list(self, what, max: int = 0) -> dict:
        """The daemon's namespaces, groups or leases (LIST; a ListWhat or its
        name): {what: [...], "count", "total", "truncated"}, at most max
        entries (0: the daemon's cap, 1024)."""
        if isinstance(what, str):
            what = ListWhat[what.upper()]
        return self._json(self._lib.l3kv_list, int(ListWhat(what)), int(max))

    # The cache operations, blocking.

    def probe(self, hashes) -> ProbeResult:
        """How long a prefix of these pages could the group restore now:
        (hit_pages, stops). Changes nothing on the daemon."""
        buf, n, _keep = _hashes(hashes)
        hit = ctypes.c_uint32()
        nstops = ctypes.c_uint32()
        # A stop point is a page count in 1..n: n of them at most.
        stops = (ctypes.c_uint32 * max(n, 1))()
        with self._lock:
            self._check(self._lib.l3kv_probe_stops(self._handle(), buf, n, ctypes.byref(hit),
                                                   stops, n, ctypes.byref(nstops)))
        return ProbeResult(hit.value, tuple(stops[:min(nstops.value, n)]))

    @staticmethod
    def _admit_args(request_id, hashes, reserved_pages, state_slot, timeout_ms):
        buf, n, keep = _hashes(hashes)
        a = _CAdmitArgs()
        a.request_id = _uint(request_id, 64, "request_id")
        a.hashes = _address(buf)
        a.npages = n
        a.reserved_pages = _uint(reserved_pages, 32, "reserved_pages")
        a.state_slot = SLOT_NONE if state_slot is None else _uint(state_slot, 32, "state_slot")
        a.timeout_ms = int(timeout_ms)
        return a, keep

    @staticmethod
    def _admit_value(r: _CAdmitResult) -> AdmitResult:
        try:
            decline = Decline(r.decline)
        except ValueError:
            decline = r.decline
        return AdmitResult(r.lease, r.admitted_pages, decline, r.ttl_ms, r.group_hit)

    def admit(self, request_id: int, hashes, reserved_pages: int,
              state_slot: Optional[int] = None, timeout_ms: int = TIMEOUT_DEFAULT) -> AdmitResult:
        """ADMIT: a group barrier on request_id; pins the promised prefix.
        A declined admission returns lease 0 and the reason in .decline."""
        a, _keep = self._admit_args(request_id, hashes, reserved_pages, state_slot, timeout_ms)
        r = _CAdmitResult()
        with self._lock:
            self._check(self._lib.l3kv_admit(self._handle(), ctypes.byref(a), ctypes.byref(r)))
        return self._admit_value(r)

    def _restore_with(self, name: str):
        fn = getattr(self._lib, name, None)
        if fn is None:
            raise L3kvError(_errno.ENOSYS, 0, "RESTORE with wait_event: this libl3kv (%s) has "
                            "no %s" % (library_path(), name))
        return fn

    def restore(self, lease: int, region: int, dst_pages, state=None,
                timeout_ms: int = TIMEOUT_DEFAULT,
                wait_event: Optional[int] = None, release: bool = False) -> RestoreResult:
        """RESTORE: the lease's admitted pages, in order, into dst_pages of
        region (exactly the admitted count). state: a StateDest or
        (region, slot) for a layout with recurrent state. wait_event: the
        index of a CUDA_EVENT region; the daemon's copies then wait on the
        GPU for that event's last record before the call (record it on the
        stream whose work must land first, then call). Needs
        l3kv_restore_with() in libl3kv (has_restore_with()), else ENOSYS.
        release: the lease ends when the RESTORE succeeds, as if release()
        followed at once (one round trip less); after a failure it stays,
        to be released as usual. Needs l3kv_restore_with() too."""
        dst, n, _keep = _pages(dst_pages, "dst_pages")
        r = _CRestoreResult()
        if wait_event is None and not release:
            sd = _state_dest(state)
            with self._lock:
                self._check(self._lib.l3kv_restore_state(
                    self._handle(), _uint(lease, 64, "lease"), _uint(region, 32, "region"),
                    dst, n, sd, int(timeout_ms), ctypes.byref(r)))
        else:
            a = _restore_args(lease, region, dst, n, state, wait_event, release)
            fn = self._restore_with("l3kv_restore_with")
            with self._lock:
                self._check(fn(self._handle(), ctypes.byref(a), int(timeout_ms),
                               ctypes.byref(r)))
        return RestoreResult(r.pages, bool(r.partial), r.bytes)

    def cancel(self, lease: int) -> int:
        """CANCEL: stops the lease's restore; returns the pages it landed."""
        landed = ctypes.c_uint32()
        with self._lock:
            self._check(self._lib.l3kv_cancel(self._handle(), _uint(lease, 64, "lease"),
                                              ctypes.byref(landed)))
        return landed.value

    def release(self, lease: int):
        """RELEASE: ends the lease and drops its pins."""
        with self._lock:
            self._check(self._lib.l3kv_release(self._handle(), _uint(lease, 64, "lease")))

    def publish(self, region: int, pages) -> PublishResult:
        """PUBLISH: pages is a sequence of (hash, src_page). From a state-slot
        region, src_page is the slot and hash the hash of the page the
        checkpoint ends on. All or nothing."""
        arr, n = _publish_pages(pages)
        r = _CPublishResult()
        with self._lock:
            self._check(self._lib.l3kv_publish(self._handle(), _uint(region, 32, "region"),
                                               arr, n, ctypes.byref(r)))
        return PublishResult(r.stored, r.present, r.bytes)

    def set_policy(self, prefetch: Prefetch, write: Write, prefetch_timeout_ms: int = 0):
        """SET_POLICY: the group's policies. Guards first (EPERM); EBUSY
        while the group has admissions or leases; the same policy is a no-op."""
        with self._lock:
            self._check(self._lib.l3kv_set_policy(self._handle(), int(prefetch), int(write),
                                                  _uint(prefetch_timeout_ms, 32,
                                                        "prefetch_timeout_ms")))

    def debug(self, op: DebugOp, pool: int, hash):
        """DEBUG (tests only; the daemon needs testing.debug_ops): drops or
        corrupts this rank's object (pool index, hash)."""
        h = _hash32(hash)
        with self._lock:
            self._check(self._lib.l3kv_debug(self._handle(), int(op), _uint(pool, 32, "pool"),
                                             h))

    # The non-blocking path.

    def fileno(self) -> int:
        """The pollable fd: readable while poll_completions() has work."""
        with self._lock:
            return self._lib.l3kv_fd(self._handle())

    def _ticket(self, fn, *args) -> int:
        t = ctypes.c_uint64()
        with self._lock:
            self._check(fn(self._handle(), *args, ctypes.byref(t)))
        return t.value

    def submit_stats(self) -> int:
        return self._ticket(self._lib.l3kv_submit_stats)

    def submit_health(self) -> int:
        return self._ticket(self._lib.l3kv_submit_health)

    def submit_probe(self, hashes) -> int:
        buf, n, _keep = _hashes(hashes)
        return self._ticket(self._lib.l3kv_submit_probe, buf, n)

    def submit_admit(self, request_id: int, hashes, reserved_pages: int,
                     state_slot: Optional[int] = None) -> int:
        a, _keep = self._admit_args(request_id, hashes, reserved_pages, state_slot, 0)
        return self._ticket(self._lib.l3kv_submit_admit, ctypes.byref(a))

    def submit_restore(self, lease: int, region: int, dst_pages, state=None,
                       wait_event: Optional[int] = None, release: bool = False) -> int:
        """RESTORE without waiting; as restore(). The page list is copied
        into the request before this returns."""
        dst, n, _keep = _pages(dst_pages, "dst_pages")
        if wait_event is None and not release:
            return self._ticket(self._lib.l3kv_submit_restore_state, _uint(lease, 64, "lease"),
                                _uint(region, 32, "region"), dst, n, _state_dest(state))
        a = _restore_args(lease, region, dst, n, state, wait_event, release)
        return self._ticket(self._restore_with("l3kv_submit_restore_with"), ctypes.byref(a))

    def submit_cancel(self, lease: int) -> int:
        return self._ticket(self._lib.l3kv_submit_cancel, _uint(lease, 64, "lease"))

    def submit_release(self, lease: int) -> int:
        return self._ticket(self._lib.l3kv_submit_release, _uint(lease, 64, "lease"))

    def submit_publish(self, region: int, pages) -> int:
        arr, n = _publish_pages(pages)
        return self._ticket(self._lib.l3kv_submit_publish, _uint(region, 32, "region"), arr, n)

    def _decode(self, c: _CCompletion) -> Completion:
        try:
            op = Op(c.op)
        except ValueError:
            op = c.op
        payload = ctypes.string_at(c.payload, c.len) if c.payload and c.len else b""
        if c.status != 0:
            text = payload.decode(errors="replace") or strerror(c.status)
            return Completion(c.ticket, op, -c.status, c.proto_status, None, text)
        ref = ctypes.byref(c)
        if op == Op.PROBE:
            value = _probe_decode(payload)
        elif op == Op.ADMIT:
            r = _CAdmitResult()
            self._check(self._lib.l3kv_admit_result(ref, ctypes.byref(r)))
            value = self._admit_value(r)
        elif op == Op.RESTORE:
            r = _CRestoreResult()
            self._check(self._lib.l3kv_restore_result(ref, ctypes.byref(r)))
            value = RestoreResult(r.pages, bool(r.partial), r.bytes)
        elif op == Op.CANCEL:
            n = ctypes.c_uint32()
            self._check(self._lib.l3kv_cancel_result(ref, ctypes.byref(n)))
            value = n.value
        elif op == Op.PUBLISH:
            r = _CPublishResult()
            self._check(self._lib.l3kv_publish_result(ref, ctypes.byref(r)))
            value = PublishResult(r.stored, r.present, r.bytes)
        elif op in (Op.STATS, Op.HEALTH):
            value = json.loads(payload.decode()) if payload else {}
        else:
            value = None
        return Completion(c.ticket, op, 0, c.proto_status, value, "")

    def poll_completions(self, timeout: Optional[float] = 0) -> Iterator[Completion]:
        """Yields every completion ready now, in the order the replies came
        (first any that wait() set aside). With timeout (seconds; None:
        forever) it first waits that long for fileno() to become readable.
        Ends quietly once the connection is broken and every ticket has
        been handed back."""
        if timeout != 0 and not self._stash:
            select.select([self.fileno()], [], [], timeout)
        while self._stash:
            yield self._stash.popleft()
        while True:
            c = _CCompletion()
            with self._lock:
                rc = self._lib.l3kv_poll_completion(self._handle(), ctypes.byref(c))
                if rc == -_errno.EAGAIN or rc == -_errno.ENOTCONN:
                    return
                self._check(rc)
                try:
                    if c.ticket in self._forgotten:
                        self._forgotten.discard(c.ticket)
                        continue
                    done = self._decode(c)
                finally:
                    self._lib.l3kv_completion_release(ctypes.byref(c))
            yield done

    def forget(self, ticket: int):
        """Drops ticket's completion when it comes (a caller that stopped
        waiting for it), instead of keeping it for poll_completions()."""
        with self._lock:
            for i, c in enumerate(self._stash):
                if c.ticket == ticket:
                    del self._stash[i]
                    return
            self._forgotten.add(ticket)

    def wait(self, ticket: int, timeout: Optional[float] = None) -> Completion:
        """Waits for one ticket's completion (at most timeout seconds; None:
        forever). Others that arrive meanwhile are kept for
        poll_completions() or for the thread that waits on them: several
        threads may wait on one Client at once (one of them reads the
        socket at a time, the others sleep until it has read)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                for i, c in enumerate(self._stash):
                    if c.ticket == ticket:
                        del self._stash[i]
                        return c
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise L3kvError(_errno.ETIMEDOUT, 0, "no completion of ticket %d in time"
                                    % ticket)
                if self._reading:
                    # Another thread reads the socket: it wakes us when it has.
                    self._read_done.wait(left)
                    continue
                fd = self.fileno()
                self._reading = True
                try:
                    self._lock.release()
                    try:
                        # In slices: a close() from another thread ends the wait.
                        select.select([fd], [], [], 0.5 if left is None else min(left, 0.5))
                    finally:
                        self._lock.acquire()
                    while True:
                        c = _CCompletion()
                        rc = self._lib.l3kv_poll_completion(self._handle(), ctypes.byref(c))
                        if rc == -_errno.EAGAIN:
                            break
                        if rc == -_errno.ENOTCONN:
                            raise L3kvError(_errno.ENOTCONN, 0, "the connection broke before "
                                            "ticket %d completed" % ticket)
                        self._check(rc)
                        try:
                            if c.ticket in self._forgotten:
                                self._forgotten.discard(c.ticket)
                            else:
                                self._stash.append(self._decode(c))
                        finally:
                            self._lib.l3kv_completion_release(ctypes.byref(c))
                finally:
                    self._reading = False
                    self._read_done.notify_all()
