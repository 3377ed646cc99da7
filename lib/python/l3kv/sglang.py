"""l3kv.sglang: SGLang HiCache's L3 on l3kvd, as a `dynamic` storage backend.

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "l3kv",
        "module_path": "l3kv.sglang", "class_name": "L3kvStorage",
        "interface_v1": 1, "allocator": "shm", "socket": "/run/l3kvd/l3kvd.sock"}'

SGLang's host (L2) pool lives in memfds (the shm allocator); L3kvStorage
registers them with l3kvd once (ATTACH, in on_host_pools_registered) and
from then on bytes move between l3kvd's tiers and the host pool in place,
by page index: nothing is copied through Python.

The contract through SGLang's calls. SGLang asks batch_exists(keys) in its
prefetch thread, rank-reduces the answer (MIN), allocates host pages and
later calls batch_get_v1(keys, host_indices) in another thread; it passes
no request id and never cancels. So batch_exists answers with an ADMIT
(the pages pinned under a lease, the count the group agreed), and
batch_get_v1 restores under that lease and releases it: a hit reported is
a hit restored. A lease SGLang never comes back for (the prefetch revoked
below its threshold, terminated) expires by the daemon's lease TTL; this
side forgets it at the same time. Where batch_get_v1 finds no lease that
covers its keys (a restart, an expired TTL, fewer pages than admitted
after the rank reduction) it admits them afresh and restores what that
promises.

Never break SGLang: a daemon that is down, slow, restarting or refusing
is a miss (0, [False] * n, an empty PoolTransferResult); nothing raises
after registration, nothing returns None. Every call has a deadline (the
connection's timeout_ms; ADMIT and RESTORE their own); a lost connection
is rebuilt on the next call after a backoff that doubles from
reconnect_ms to reconnect_max_ms, and re-attached with the same
registrations. Only SGLang's storage writers (is_storage_writer) publish.

Ranks and groups. The ranks SGLang rank-reduces prefetch hits over (the
attention TP ranks times the attention CP ranks of one DP replica and one
PP stage) are one daemon group: group id "<group>-pp<pp_rank>-dp<dp_rank>"
(group defaults to "sglang-<model>"), group_size tp_size * attn_cp_size,
group_rank attn_cp_rank * tp_size + tp_rank, tp_rank tp_rank. The daemon
answers every ADMIT with the group's common prefix, so the ranks agree
before SGLang's all-reduce, and each rank stores its own shard (its TP
slice for MHA; MLA's replicated KV is one object per DCP shard). The
ADMIT's request id is derived from the batch's keys, identical on every
rank. DCP: SGLang 0.5.23 refuses a dynamic backend under DCP before this
class is built (attach_storage_backend: "requires file or Mooncake
storage"); where it gets here, l3kvd's guards decide (wait_complete is
the only prefetch policy used).

Layouts. MHA page_first: one memfd holding K then V, [2, tokens, layers,
heads, head_dim]; the K half is pool "kv" and the V half the sidecar pool
"v" (all_pages), two regions on the one memfd, so one page is two
objects. MLA page_first: [tokens, layers, 1, kv_cache_dim], one pool, one
region. Refused at registration, with what to change: another host
layout (layer_first, page_first_direct, page_head), a pool without an fd
(no shm allocator), interface_v1 unset, sidecar pools (Mamba, SWA,
indexer: not stored here yet).

Supported: SGLang 0.5.23 (HiCacheStorage with register_mem_host_pool_v2,
on_host_pools_registered, batch_exists_v2 / PoolTransferResult). SGLang's
types are imported defensively: without SGLang the module imports, and
L3kvStorage stands on a plain base class, so it can be tested alone.
"""

import hashlib
import logging
import os
import threading
import time

from . import (Attention, HitPolicy, L3kvError, Layout, Pool, PoolKind, Prefetch, Region,
               Write)
from .client import Client

logger = logging.getLogger("l3kv.sglang")

SUPPORTED_SGLANG = ("0.5.23",)

try:  # SGLang's types move between releases: take what is there.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001 -- any import failure: stand alone
    _Base = object
try:
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult as _PoolTransferResult
except Exception:  # noqa: BLE001
    _PoolTransferResult = None
try:
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy as _PoolHitPolicy
except Exception:  # noqa: BLE001
    _PoolHitPolicy = None

POOL_KV = "kv"
_LEASES_MAX = 4096      # leases remembered at once; the oldest is released beyond
try:
    from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE as _BATCH
except Exception:  # noqa: BLE001
    _BATCH = 128        # SGLang 0.5.23's pages per batched storage call


class _Transfer:
    """A PoolTransferResult where SGLang's is not importable."""

    def __init__(self, kv_hit_pages, extra_pool_hit_pages, restorable_prefix_pages=None):
        self.kv_hit_pages = kv_hit_pages
        self.extra_pool_hit_pages = extra_pool_hit_pages
        self.restorable_prefix_pages = restorable_prefix_pages


def _transfer_result(kv, extra, restorable):
    cls = _PoolTransferResult or _Transfer
    return cls(kv, extra, restorable)


def _hash32(key) -> bytes:
    """SGLang's page key (a sha256 hex digest) as the 32 bytes it encodes."""
    if isinstance(key, (bytes, bytearray)) and len(key) == 32:
        return bytes(key)
    s = str(key)
    if len(s) == 64:
        try:
            return bytes.fromhex(s)
        except ValueError:
            pass
    return hashlib.sha256(s.encode()).digest()


def _request_id(hashes) -> int:
    """The ADMIT's request id: from the batch's keys, the same on every rank."""
    d = hashlib.sha256(b"l3kv.sglang/admit\0" + b"".join(hashes)).digest()
    return int.from_bytes(d[:8], "little") | 1


class RefusedError(ValueError):
    """A configuration L3kvStorage cannot serve; the text says what to change."""


def _cfg(extra, name, default):
    v = extra.get(name, default) if extra else default
    return default if v is None else v


class _Lease:
    __slots__ = ("hashes", "lease", "pages", "expires")

    def __init__(self, hashes, lease, pages, expires):
        self.hashes = hashes
        self.lease = lease
        self.pages = pages
        self.expires = expires


class L3kvStorage(_Base):
    """HiCacheStorage on l3kvd. Built by SGLang's backend factory as
    L3kvStorage(storage_config, kwargs); the options are keys of the
    storage config's extra_config (--hicache-storage-backend-extra-config):

    socket           l3kvd's socket (default $L3KV_SOCKET, else ./run/l3kvd.sock)
    group            the engine instance's group id prefix (default sglang-<model>)
    timeout_ms       deadline of each call (default 5000)
    admit_timeout_ms ADMIT's (default timeout_ms)
    restore_timeout_ms RESTORE's (default 30000)
    reconnect_ms, reconnect_max_ms  the backoff after a lost daemon (100, 5000)
    kv_dtype         the KV dtype's name as the layout has it (default the
                     host pool's torch dtype, e.g. "bfloat16")
    seed             the namespace seed (default 0)
    """

    def __init__(self, storage_config, kwargs=None, **more):
        self.config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.extra = extra
        if not extra.get("interface_v1"):
            raise RefusedError(
                "l3kv: L3kvStorage moves pages in place and needs SGLang's zero-copy calls: "
                "add \"interface_v1\": 1 to --hicache-storage-backend-extra-config")
        if getattr(storage_config, "is_page_first_layout", True) is False:
            raise RefusedError(
                "l3kv: the host layout is not page_first: start SGLang with "
                "--hicache-mem-layout page_first")
        self.socket = _cfg(extra, "socket", None)
        self.timeout_ms = int(_cfg(extra, "timeout_ms", 5000))
        self.admit_timeout_ms = int(_cfg(extra, "admit_timeout_ms", self.timeout_ms))
        self.restore_timeout_ms = int(_cfg(extra, "restore_timeout_ms", 30000))
        self.reconnect_s = int(_cfg(extra, "reconnect_ms", 100)) / 1000.0
        self.reconnect_max_s = int(_cfg(extra, "reconnect_max_ms", 5000)) / 1000.0
        model = getattr(storage_config, "model_name", None) or "model"
        self.model = model
        g = str(_cfg(extra, "group", "sglang-" + "-".join(str(model).split("/"))))
        pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        dp_rank = int(getattr(storage_config, "dp_rank", 0) or 0)
        self.group = ("%s-pp%d-dp%d" % (g, pp_rank, dp_rank))[:63]
        tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        cp_rank = int(getattr(storage_config, "attn_cp_rank", 0) or 0)
        cp_size = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.group_size = tp_size * cp_size
        self.group_rank = cp_rank * tp_size + tp_rank
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.writer = bool(getattr(storage_config, "is_storage_writer", True))
        self.mem_pool_host = None
        self.registered_pools = {}
        self._lock = threading.Lock()       # the fields below
        self._client = None
        self._attach = None                 # (layout, pools, regions): what ATTACH sends
        self._down_until = 0.0
        self._backoff = self.reconnect_s
        self._leases = {}                   # first hash -> [_Lease]
        self._nleases = 0
        self._closed = False
        self.stats = {"exists_calls": 0, "admitted_pages": 0, "restored_pages": 0,
                      "published_pages": 0, "present_pages": 0, "misses_down": 0,
                      "errors": 0, "reconnects": 0, "leases_expired": 0}

    # Registration.

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        name = str(getattr(host_pool_name, "value", host_pool_name))
        self.registered_pools[name] = host_pool
        if name != POOL_KV and host_pool is not self.mem_pool_host:
            raise RefusedError(
                "l3kv: the %r host pool (a sidecar: Mamba, SWA, indexer) is not stored by "
                "l3kv.sglang yet; run without it, or use another storage backend" % name)

    def on_host_pools_registered(self):
        """Computes the registrations from the kv pool's memfd and geometry
        and attaches; a daemon that is not there yet is retried later."""
        host = self.mem_pool_host or self.registered_pools.get(POOL_KV)
        if host is None:
            raise RefusedError("l3kv: no kv host pool was registered")
        self._attach = self._registrations(host)
        self.page_size = int(host.page_size)
        with self._lock:
            try:
                self._connect_locked(first=True)
            except RefusedError:
                raise
            except Exception as e:  # noqa: BLE001 -- down at start: misses until it is up
                logger.warning("l3kv: l3kvd not reachable at registration (%s); "
                               "every lookup is a miss until it is", e)
                self._mark_down_locked()

    def _registrations(self, host):
        layout = str(getattr(host, "layout", ""))
        if layout != "page_first":
            raise RefusedError(
                "l3kv: host layout %r is not supported: start SGLang with "
                "--hicache-mem-layout page_first" % layout)
        fd = getattr(host, "fd", None)
        if fd is None or int(fd) < 0:
            raise RefusedError(
                "l3kv: the host pool has no memory fd: add \"allocator\": \"shm\" to "
                "--hicache-storage-backend-extra-config (SGLang's shm allocator keeps the "
                "host pool in a memfd l3kvd can map)")
        buf = host.kv_buffer
        if isinstance(buf, (list, tuple)) or not buf.is_contiguous():
            raise RefusedError("l3kv: the host kv buffer is not one contiguous tensor")
        es = buf.element_size()
        shape = tuple(buf.shape)
        ps = int(host.page_size)
        size = int(host.size)
        if size % ps != 0:
            raise RefusedError("l3kv: host pool of %d tokens is not whole %d-token pages"
                               % (size, ps))
        npages = size // ps
        dtype = str(_cfg(self.extra, "kv_dtype", str(buf.dtype).replace("torch.", "")))
        mla = self.is_mla or len(shape) == 4
        if mla:
            if len(shape) != 4 or shape[0] != size:
                raise RefusedError("l3kv: MLA host buffer of shape %s is not "
                                   "[tokens, layers, 1, dim]" % (shape,))
            layers = shape[1]
            tb = shape[2] * shape[3] * es
            page = ps * layers * tb
            pools = [Pool(POOL_KV, page, layers=layers, schema="mla:%s" % (shape[2:],))]
            regions = [Region.page_first(0, fd, npages, ps, layers, tb, 0)]
        else:
            if len(shape) != 5 or shape[0] != 2 or shape[1] != size:
                raise RefusedError("l3kv: MHA host buffer of shape %s is not "
                                   "[2, tokens, layers, heads, head_dim]" % (shape,))
            layers = shape[2]
            tb = shape[3] * shape[4] * es
            page = ps * layers * tb
            half = size * layers * tb
            # K then V in one memfd: the K half is the kv pool, the V half a sidecar
            # every page must have too (all_pages), so a page is two objects.
            pools = [Pool(POOL_KV, page, layers=layers, schema="mha-k:%s" % (shape[3:],)),
                     Pool("v", page, kind=PoolKind.SIDECAR, layers=layers,
                          hit_policy=HitPolicy.ALL_PAGES, schema="mha-v:%s" % (shape[3:],))]
            regions = [Region.page_first(0, fd, npages, ps, layers, tb, 0),
                       Region.page_first(1, fd, npages, ps, layers, tb, half)]
        lay = Layout(model=str(self.model), kv_dtype=dtype, page_tokens=ps,
                     tp_size=self.tp_size,
                     pp_size=int(getattr(self.config, "pp_size", 1) or 1),
                     pp_rank=int(getattr(self.config, "pp_rank", 0) or 0),
                     cp_size=int(getattr(self.config, "attn_cp_size", 1) or 1),
                     dcp_size=int(getattr(self.config, "dcp_size", 1) or 1),
                     dcp_rank=int(getattr(self.config, "dcp_rank", 0) or 0),
                     attention=Attention.MLA if mla else Attention.MHA,
                     logical_page_tokens=getattr(self.config, "logical_page_size", None),
                     seed=int(_cfg(self.extra, "seed", 0)))
        self.npages = npages
        return lay, pools, regions

    # The connection.

    def _connect_locked(self, first=False):
        c = Client(self.socket, timeout_ms=self.timeout_ms)
        layout, pools, regions = self._attach
        try:
            c.attach(layout, pools, regions=regions, group=self.group,
                     group_size=self.group_size, group_rank=self.group_rank,
                     tp_rank=self.tp_rank, prefetch=Prefetch.WAIT_COMPLETE, write=Write.THROUGH)
        except L3kvError as e:
            c.close()
            if first and e.status != 0:
                raise RefusedError("l3kv: l3kvd refused the registration: %s" % e) from e
            raise
        self._client = c
        self._leases.clear()
        self._nleases = 0
        self._backoff = self.reconnect_s

    def _mark_down_locked(self):
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
        self._client = None
        self._leases.clear()
        self._nleases = 0
        self._down_until = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.reconnect_max_s)

    def _client_locked(self):
        """The connection, rebuilt when it is time to try; None: a miss."""
        if self._closed or self._attach is None:
            return None
        if self._client is None:
            if time.monotonic() < self._down_until:
                return None
            try:
                self._connect_locked()
                self.stats["reconnects"] += 1
                logger.info("l3kv: attached to l3kvd again")
            except Exception as e:  # noqa: BLE001
                logger.debug("l3kv: reconnect failed: %s", e)
                self._mark_down_locked()
                return None
        return self._client

    def _failed_locked(self, what, e):
        """A call failed: a lost connection is rebuilt later; any failure is a miss."""
        self.stats["errors"] += 1
        lost = not isinstance(e, L3kvError) or e.status == 0
        logger.warning("l3kv: %s failed (%s)%s", what, e,
                       "; reconnecting with backoff" if lost else "")
        if lost:
            self._mark_down_locked()

    # Leases.

    def _lease_forget_locked(self, le):
        lst = self._leases.get(le.hashes[0])
        if lst and le in lst:
            lst.remove(le)
            self._nleases -= 1
            if not lst:
                del self._leases[le.hashes[0]]

    def _lease_release_locked(self, c, le):
        self._lease_forget_locked(le)
        try:
            c.release(le.lease)
        except L3kvError as e:
            if e.status == 0:
                self._failed_locked("RELEASE", e)

    def _lease_prune_locked(self, c):
        """Forgets leases past their TTL (the daemon dropped them) and,
        beyond _LEASES_MAX, releases the oldest."""
        now = time.monotonic()
        for h in list(self._leases):
            for le in list(self._leases.get(h, ())):
                if le.expires <= now:
                    self._lease_forget_locked(le)
                    self.stats["leases_expired"] += 1
        while self._nleases > _LEASES_MAX:
            oldest = min((le for lst in self._leases.values() for le in lst),
                         key=lambda x: x.expires)
            self._lease_release_locked(c, oldest)

    def _lease_find_locked(self, hashes):
        now = time.monotonic()
        for le in self._leases.get(hashes[0], ()):
            if le.expires > now and le.hashes[:len(hashes)] == hashes:
                return le
        return None

    def _admit_locked(self, c, hashes):
        """ADMITs hashes: the _Lease (0 pages when declined)."""
        adm = c.admit(_request_id(hashes), b"".join(hashes), reserved_pages=len(hashes),
                      timeout_ms=self.admit_timeout_ms)
        if not adm.admitted:
            return _Lease(hashes, 0, 0, 0.0)
        # Forgotten a little before the daemon's TTL drops it.
        ttl = max(adm.ttl_ms, 1) / 1000.0
        le = _Lease(tuple(hashes[:adm.admitted_pages]), adm.lease, adm.admitted_pages,
                    time.monotonic() + ttl * 0.9)
        self._leases.setdefault(le.hashes[0], []).append(le)
        self._nleases += 1
        self.stats["admitted_pages"] += le.pages
        return le

    # Existence: the admission.

    def batch_exists(self, keys, extra_info=None) -> int:
        """The leading run of keys l3kvd holds, admitted (pinned under a lease)
        so that batch_get_v1 finds them; 0 on any failure."""
        if not keys:
            return 0
        hashes = tuple(_hash32(k) for k in keys)
        with self._lock:
            self.stats["exists_calls"] += 1
            c = self._client_locked()
            if c is None:
                self.stats["misses_down"] += 1
                return 0
            try:
                self._lease_prune_locked(c)
                old = self._lease_find_locked(hashes)
                if old is not None and old.hashes == hashes[:old.pages]:
                    # Asked again before it was restored: the new answer replaces it.
                    self._lease_release_locked(c, old)
                # One lease per SGLang load batch (STORAGE_BATCH_SIZE pages): a
                # restore is exactly its lease's promise, and batch_get_v1 comes
                # back batch by batch.
                total = 0
                for i in range(0, len(hashes), _BATCH):
                    part = hashes[i:i + _BATCH]
                    got = self._admit_locked(c, part).pages
                    total += got
                    if got < len(part):
                        break
                return total
            except Exception as e:  # noqa: BLE001
                self._failed_locked("ADMIT", e)
                return 0

    def exists(self, key) -> bool:
        """Whether l3kvd holds key's page (a PROBE: nothing is pinned)."""
        with self._lock:
            c = self._client_locked()
            if c is None:
                return False
            try:
                return c.probe(_hash32(key)).hit_pages == 1
            except Exception as e:  # noqa: BLE001
                self._failed_locked("PROBE", e)
                return False

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The kv pool's admitted leading run; pools this backend does not
        store (none is registered) are misses, which make the hit 0."""
        for t in pool_transfers or ():
            name = str(getattr(t.name, "value", t.name))
            if name != POOL_KV:
                return _transfer_result(0, {}, [])
        n = self.batch_exists(keys, extra_info)
        return _transfer_result(n, {POOL_KV: n} if n else {}, list(range(1, n + 1)))

    # Restore.

    def _dst_pages(self, keys, host_indices):
        ps = self.page_size
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) < len(keys) * ps:
            raise ValueError("%d host indices for %d pages of %d tokens"
                             % (len(idx), len(keys), ps))
        pages = []
        for i in range(len(keys)):
            t = int(idx[i * ps])
            if t % ps != 0:
                raise ValueError("host index %d is not at a page boundary" % t)
            pages.append(t // ps)
        return pages

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Restores keys' pages into the host pool at host_indices, under the
        lease batch_exists took (or a fresh one): [True] * restored + [False] * rest."""
        n = len(keys)
        if n == 0:
            return []
        miss = [False] * n
        try:
            dst = self._dst_pages(keys, host_indices)
        except Exception as e:  # noqa: BLE001
            logger.error("l3kv: batch_get_v1: %s", e)
            return miss
        hashes = tuple(_hash32(k) for k in keys)
        with self._lock:
            c = self._client_locked()
            if c is None:
                self.stats["misses_down"] += 1
                return miss
            try:
                le = self._lease_find_locked(hashes)
                if le is not None and le.pages != n:
                    # The ranks agreed on fewer pages than this one admitted: a
                    # restore is exactly its promise, so promise what is asked.
                    self._lease_release_locked(c, le)
                    le = None
                if le is None:
                    le = self._admit_locked(c, hashes)
                    if le.pages == 0:
                        return miss
                self._lease_forget_locked(le)
                try:
                    r = c.restore(le.lease, 0, dst[:le.pages], timeout_ms=self.restore_timeout_ms)
                finally:
                    try:
                        c.release(le.lease)
                    except L3kvError:
                        pass
                got = min(r.pages, le.pages)
                self.stats["restored_pages"] += got
                return [True] * got + [False] * (n - got)
            except Exception as e:  # noqa: BLE001
                self._failed_locked("RESTORE", e)
                return miss

    # Publish.

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Publishes keys' pages from the host pool (storage writers only;
        the others answer True: their writer stores the page)."""
        n = len(keys)
        if n == 0:
            return []
        if not self.writer:
            return [True] * n
        try:
            src = self._dst_pages(keys, host_indices)
        except Exception as e:  # noqa: BLE001
            logger.error("l3kv: batch_set_v1: %s", e)
            return [False] * n
        items = list(zip((_hash32(k) for k in keys), src))
        with self._lock:
            c = self._client_locked()
            if c is None:
                self.stats["misses_down"] += 1
                return [False] * n
            try:
                # Sidecars first: once the kv object is visible, the page is whole.
                nregions = len(self._attach[2])
                for region in range(nregions - 1, -1, -1):
                    r = c.publish(region, items)
                self.stats["published_pages"] += r.stored
                self.stats["present_pages"] += r.present
                ok = r.stored + r.present
                return [True] * min(ok, n) + [False] * (n - min(ok, n))
            except Exception as e:  # noqa: BLE001
                self._failed_locked("PUBLISH", e)
                return [False] * n

    # The v2 calls: the kv pool through v1, other pools are not stored.

    def _v2(self, v1, transfers, extra_info):
        """Each pool's transfer: the kv pool through the v1 call, the others misses."""
        out = {}
        for t in transfers:
            name = str(getattr(t.name, "value", t.name))
            keys = list(t.keys or [])
            if name == POOL_KV and t.host_indices is not None:
                out[t.name] = v1(keys, t.host_indices, extra_info)
            else:
                out[t.name] = [False] * len(keys)
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        return self._v2(self.batch_get_v1, transfers, extra_info)

    def batch_set_v2(self, transfers, extra_info=None):
        return self._v2(self.batch_set_v1, transfers, extra_info)

    # The copying interface (SGLang without interface_v1): refused at __init__.

    def get(self, key, target_location=None, target_sizes=None):
        return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        return [None] * len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        return False

    # The rest.

    def clear(self):
        """l3kvd's objects outlive engines and are shared by the group: clear
        drops this side's leases only (l3kvctl manages the daemon's tiers)."""
        with self._lock:
            c = self._client
            for lst in list(self._leases.values()):
                for le in list(lst):
                    if c is not None:
                        self._lease_release_locked(c, le)
            self._leases.clear()
            self._nleases = 0
        return True

    def get_stats(self):
        """This backend's counters (a dict); SGLang's storage metrics come from
        its own controller."""
        with self._lock:
            d = dict(self.stats)
            d["connected"] = self._client is not None
            d["leases"] = self._nleases
        return d

    def close(self):
        """Releases the leases, DETACHes and closes (idempotent): the daemon
        unmaps the host pool."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            c, self._client = self._client, None
            if c is not None:
                for lst in list(self._leases.values()):
                    for le in list(lst):
                        try:
                            c.release(le.lease)
                        except Exception:  # noqa: BLE001
                            pass
                try:
                    c.detach()
                except Exception:  # noqa: BLE001
                    pass
                c.close()
            self._leases.clear()
            self._nleases = 0


__all__ = ["L3kvStorage", "RefusedError", "SUPPORTED_SGLANG"]
