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
PP stage; each TP rank a process with its own L3kvStorage and connection)
are one daemon group: group id "<group>-pp<pp_rank>-dp<dp_rank>",
group_size tp_size * attn_cp_size, group_rank attn_cp_rank * tp_size +
tp_rank, tp_rank tp_rank. group defaults to default_group(model,
instance_id()): "sglang-<model>-<8 hex digits>" of the address of
torch.distributed's default rendezvous store (SGLang's dist init address),
the same on every rank of one instance and different for two instances on
one host. The daemon answers every ADMIT with the group's common prefix,
so the ranks agree before SGLang's all-reduce, and each rank stores its
own shard (its TP slice for MHA; MLA's replicated KV is one object per DCP
shard). An ADMIT's request id is derived from the query's keys, identical
on every rank. ADMIT (a barrier), RESTORE (complete only when every rank's
copy is) and PUBLISH are submitted and waited for with no lock held, so a
prefetch waiting for a slower rank never blocks the storage writer's
publish. DCP: SGLang 0.5.23 refuses a dynamic backend under DCP before
this class is built (attach_storage_backend: "requires file or Mooncake
storage"); where it gets here, l3kvd's guards decide (wait_complete is the
only prefetch policy used).

Layouts. MHA page_first: one memfd holding K then V, [2, tokens, layers,
heads, head_dim]; the K half is pool "kv" and the V half the sidecar pool
"v" (all_pages), two regions on the one memfd, so one page is two
objects. MLA page_first: [tokens, layers, 1, kv_cache_dim], one pool, one
region. Mamba (the "mamba" host pool of SGLang's hybrid stack): one
checkpoint per host slot, a temporal and n conv buffers (and any side
states) each in its own memfd, registered on a second connection as a
state namespace of their own (page = slot, sharded by tp_rank, group
"<...>-m"); batch_exists_v2 answers TRAILING_PAGES with the prefix
lengths whose checkpoint is admitted on every rank
(restorable_prefix_pages), batch_get_v2 restores one into SGLang's slot,
batch_set_v2 publishes from every rank. Refused at registration, with
what to change: another host layout (layer_first, page_first_direct,
page_head), a pool without an fd (no shm allocator), interface_v1 unset,
other sidecar pools (SWA, indexer: not stored here). BLOCK_GROUPS: no
pool of SGLang 0.5.23 uses it; such a transfer is a miss.

Supported: SGLang 0.5.23 (HiCacheStorage with register_mem_host_pool_v2,
on_host_pools_registered, batch_exists_v2 / PoolTransferResult). SGLang's
types are imported defensively: without SGLang the module imports, and
L3kvStorage stands on a plain base class, so it can be tested alone.
"""

import hashlib
import logging
import math
import os
import socket as _socket
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

POOL_KV = "kv"
POOL_MAMBA = "mamba"
_LEASES_MAX = 4096      # leases remembered at once; the oldest is released beyond
_GROUP_MAX = 63         # bytes of a group id (the wire's 64, NUL included)
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


def _name(t):
    return str(getattr(t.name, "value", t.name))


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


def _request_id(tag, *parts) -> int:
    """An ADMIT's request id: from the query's keys, so the same on every
    rank (they all ask the same query) and different for another query."""
    h = hashlib.sha256(b"l3kv.sglang/" + tag + b"\0")
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode() + b"\0")
    return int.from_bytes(h.digest()[:8], "little") | 1


def instance_id():
    """What tells this SGLang instance from another on the host, and is the
    same on all of its ranks: the address of the rendezvous store of
    torch.distributed's default group (SGLang's dist init address,
    host:port, the port its --nccl-port picks), else None (no process
    group: a single rank, told apart by its pid)."""
    try:
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return None
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if port:
            return "%s:%d" % (host, int(port))
    except Exception:  # noqa: BLE001 -- torch absent or its internals moved
        pass
    return None


def default_group(model, instance=None):
    """The group id prefix of an instance: sglang-<model>-<8 hex digits of
    its instance id>. Two instances of one model on one daemon differ; the
    ranks of one instance agree."""
    if instance is None:
        instance = "pid%d@%s" % (os.getpid(), _socket.gethostname())
    tag = hashlib.sha256(str(instance).encode()).hexdigest()[:8]
    m = "-".join(str(model).split("/"))[:_GROUP_MAX - 30]
    return "sglang-%s-%s" % (m, tag)


class RefusedError(ValueError):
    """A configuration L3kvStorage cannot serve; the text says what to change."""


def _cfg(extra, name, default):
    v = extra.get(name, default) if extra else default
    return default if v is None else v


class _Lease:
    __slots__ = ("hashes", "lease", "pages", "expires", "gen", "siblings")

    def __init__(self, hashes, lease, pages, expires, gen):
        self.hashes = hashes
        self.lease = lease
        self.pages = pages
        self.expires = expires
        self.gen = gen
        self.siblings = None        # the other candidates of one state query


class _Session:
    """One ATTACH on its own connection: reconnect with backoff, leases.

    Long requests (ADMIT waiting at its group's barrier, RESTORE waiting
    for the group's copies, PUBLISH copying) are submitted and waited for
    without any lock held, so the storage writer's PUBLISH never waits
    behind a prefetch's ADMIT that waits for the other TP ranks; the
    daemon answers the requests of one connection in any order."""

    def __init__(self, owner, what, attach):
        self.o = owner
        self.what = what
        self.attach = attach          # dict: layout, pools, regions, group, ...
        self.lock = threading.Lock()  # the fields below
        self.client = None
        self.gen = 0                  # bumped at every connect
        self.down_until = 0.0
        self.backoff = owner.reconnect_s
        self.leases = {}              # first hash -> [_Lease]
        self.nleases = 0
        self.closed = False
        self.connecting = False       # one thread at a time rebuilds the connection

    # The connection.

    def connect(self, first=False):
        a = self.attach
        c = Client(self.o.socket, timeout_ms=self.o.timeout_ms)
        try:
            c.attach(a["layout"], a["pools"], regions=a["regions"], group=a["group"],
                     group_size=self.o.group_size, group_rank=self.o.group_rank,
                     tp_rank=self.o.tp_rank, prefetch=Prefetch.WAIT_COMPLETE,
                     write=Write.THROUGH)
        except L3kvError as e:
            c.close()
            if first and e.status != 0:
                raise RefusedError("l3kv: l3kvd refused the %s registration: %s"
                                   % (self.what, e)) from e
            raise
        with self.lock:
            old, self.client = self.client, c
            self.gen += 1
            self.leases.clear()
            self.nleases = 0
            self.backoff = self.o.reconnect_s
        if old is not None:
            old.close()

    def _mark_down_locked(self):
        if self.client is not None:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass
        self.client = None
        self.leases.clear()
        self.nleases = 0
        self.down_until = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, self.o.reconnect_max_s)

    def mark_down(self):
        with self.lock:
            self._mark_down_locked()

    def conn(self):
        """(client, gen), rebuilt when it is time to try; None: a miss."""
        with self.lock:
            if self.closed:
                return None
            if self.client is not None:
                return self.client, self.gen
            if time.monotonic() < self.down_until or self.connecting:
                return None         # another thread reconnects: a miss meanwhile
            self.connecting = True
        try:
            self.connect()
        except Exception as e:  # noqa: BLE001
            logger.debug("l3kv: reconnect (%s) failed: %s", self.what, e)
            self.mark_down()
            return None
        finally:
            with self.lock:
                self.connecting = False
        self.o.count("reconnects")
        logger.info("l3kv: attached to l3kvd again (%s)", self.what)
        with self.lock:
            if self.client is None or self.closed:
                return None
            return self.client, self.gen

    def failed(self, conn, what, e):
        """A call failed: a lost connection is rebuilt later; any failure is a miss."""
        self.o.count("errors")
        lost = not isinstance(e, L3kvError) or e.status == 0
        logger.warning("l3kv: %s failed (%s)%s", what, e,
                       "; reconnecting with backoff" if lost else "")
        if lost:
            with self.lock:
                if conn is not None and self.gen == conn[1] and self.client is conn[0]:
                    self._mark_down_locked()

    def call(self, conn, submit, timeout_ms):
        """Submits on conn's client and waits for it, no lock held."""
        c = conn[0]
        t = submit(c)
        try:
            return c.wait(t, max(timeout_ms, 1) / 1000.0 + 1.0).result()
        except L3kvError as e:
            if e.errno == 110:      # ETIMEDOUT: the reply, if it comes, is dropped
                c.forget(t)
            raise

    # Leases.

    def _forget_locked(self, le):
        lst = self.leases.get(le.hashes[0])
        if lst and le in lst:
            lst.remove(le)
            self.nleases -= 1
            if not lst:
                del self.leases[le.hashes[0]]
            return True
        return False

    def release(self, conn, le):
        """Forgets le and RELEASEs it (and the siblings of a state query)."""
        group = [le] + [s for s in (le.siblings or ()) if s is not le]
        todo = []
        with self.lock:
            for x in group:
                if self._forget_locked(x) and x.gen == self.gen:
                    todo.append(x)
        for x in todo:
            try:
                conn[0].release(x.lease)
            except L3kvError as e:
                if e.status == 0:
                    self.failed(conn, "RELEASE", e)
                    return

    def prune(self, conn):
        """Forgets leases past their TTL (the daemon dropped them) and,
        beyond _LEASES_MAX, releases the oldest."""
        now = time.monotonic()
        old = []
        with self.lock:
            for h in list(self.leases):
                for le in list(self.leases.get(h, ())):
                    if le.expires <= now:
                        self._forget_locked(le)
                        self.o.count("leases_expired")
            while self.nleases > _LEASES_MAX:
                oldest = min((le for lst in self.leases.values() for le in lst),
                             key=lambda x: x.expires)
                self._forget_locked(oldest)
                old.append(oldest)
        for le in old:
            try:
                conn[0].release(le.lease)
            except L3kvError:
                pass

    def find(self, hashes, pages=None):
        now = time.monotonic()
        with self.lock:
            for le in self.leases.get(hashes[0], ()):
                if le.expires > now and le.hashes[:len(hashes)] == hashes and \
                        (pages is None or le.pages == pages):
                    return le
        return None

    def submit_admit(self, conn, rid, hashes, reserved):
        return conn[0].submit_admit(rid, b"".join(hashes), reserved_pages=reserved)

    def admitted(self, conn, hashes, adm):
        """Keeps an admission's lease: the _Lease (0 pages when declined)."""
        if not adm.admitted:
            return _Lease(hashes, 0, 0, 0.0, conn[1])
        # Forgotten a little before the daemon's TTL drops it.
        ttl = max(adm.ttl_ms, 1) / 1000.0
        le = _Lease(tuple(hashes[:adm.admitted_pages]), adm.lease, adm.admitted_pages,
                    time.monotonic() + ttl * 0.9, conn[1])
        with self.lock:
            if conn[1] != self.gen:
                return _Lease(hashes, 0, 0, 0.0, conn[1])
            for x in self.leases.get(le.hashes[0], ()):
                if x.lease == le.lease:
                    # The same admission answered again (the same query
                    # asked twice): one entry; the second fetch admits anew.
                    return x
            self.leases.setdefault(le.hashes[0], []).append(le)
            self.nleases += 1
        return le

    def admit(self, conn, rid, hashes, reserved=None):
        """ADMITs hashes and waits (no lock held): the _Lease."""
        n = len(hashes) if reserved is None else reserved
        adm = self.call(conn, lambda c: self.submit_admit(conn, rid, hashes, n),
                        self.o.admit_timeout_ms)
        return self.admitted(conn, hashes, adm)

    def restore(self, conn, le, region, dst):
        """RESTOREs le into dst of region and RELEASEs it: pages in place."""
        with self.lock:
            self._forget_locked(le)
        try:
            r = self.call(conn, lambda c: c.submit_restore(le.lease, region, dst),
                          self.o.restore_timeout_ms)
        finally:
            try:
                conn[0].release(le.lease)
            except L3kvError:
                pass
            if le.siblings:
                self.release(conn, le)
        return min(r.pages, le.pages)

    def publish(self, conn, region, items):
        return self.call(conn, lambda c: c.submit_publish(region, items), self.o.timeout_ms)

    def drop_leases(self, release=True):
        with self.lock:
            c = self.client
            todo = [le for lst in self.leases.values() for le in lst]
            self.leases.clear()
            self.nleases = 0
        if release and c is not None:
            for le in todo:
                try:
                    c.release(le.lease)
                except Exception:  # noqa: BLE001
                    pass

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.drop_leases()
        with self.lock:
            c, self.client = self.client, None
        if c is not None:
            try:
                c.detach()
            except Exception:  # noqa: BLE001
                pass
            c.close()


def _buffers_of(pool):
    """A MambaPoolHost's host buffers in the order its allocator made them
    (temporal, conv..., side states), those with bytes only."""
    bufs = [getattr(pool, "temporal_buffer", None)]
    bufs += list(getattr(pool, "conv_buffer", None) or [])
    bufs += list(getattr(pool, "slot_state_buffers", None) or [])
    return [b for b in bufs if b is not None and b.numel() > 0]


class L3kvStorage(_Base):
    """HiCacheStorage on l3kvd. Built by SGLang's backend factory as
    L3kvStorage(storage_config, kwargs); the options are keys of the
    storage config's extra_config (--hicache-storage-backend-extra-config):

    socket           l3kvd's socket (default $L3KV_SOCKET, else ./run/l3kvd.sock)
    group            the engine instance's group id prefix (default
                     sglang-<model>-<8 hex digits of the instance id>: see
                     default_group(), instance_id())
    timeout_ms       deadline of each call (default 5000)
    admit_timeout_ms ADMIT's (default timeout_ms)
    restore_timeout_ms RESTORE's (default 30000)
    reconnect_ms, reconnect_max_ms  the backoff after a lost daemon (100, 5000)
    kv_dtype         the KV dtype's name as the layout has it (default the
                     host pool's torch dtype, e.g. "bfloat16")
    seed             the namespace seed (default 0)
    state_candidates the prefix lengths a Mamba query admits a checkpoint
                     for, longest first (default 32, at most 128)
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
        # At most 128: the daemon's admit.max_waiting by default (ADMITs of a
        # rank waiting at its group's barrier at once).
        self.state_candidates = min(128, max(1, int(_cfg(extra, "state_candidates", 32))))
        model = getattr(storage_config, "model_name", None) or "model"
        self.model = model
        g = extra.get("group")
        self.instance = None
        if g is None:
            self.instance = instance_id()
            g = default_group(model, self.instance)
        g = str(g)
        pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        dp_rank = int(getattr(storage_config, "dp_rank", 0) or 0)
        suffix = "-pp%d-dp%d" % (pp_rank, dp_rank)
        self.group = g[:_GROUP_MAX - len(suffix) - 2] + suffix
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
        self._kv = None                     # the KV pages' _Session
        self._state = None                  # the Mamba state's _Session, if any
        self._stats_lock = threading.Lock()
        self._closed = False
        self.stats = {"exists_calls": 0, "admitted_pages": 0, "restored_pages": 0,
                      "published_pages": 0, "present_pages": 0, "misses_down": 0,
                      "errors": 0, "reconnects": 0, "leases_expired": 0,
                      "state_admitted": 0, "state_restored": 0, "state_published": 0}

    def count(self, name, n=1):
        with self._stats_lock:
            self.stats[name] += n

    # Registration.

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        name = str(getattr(host_pool_name, "value", host_pool_name))
        self.registered_pools[name] = host_pool
        if name not in (POOL_KV, POOL_MAMBA) and host_pool is not self.mem_pool_host:
            raise RefusedError(
                "l3kv: the %r host pool (a sidecar: SWA, indexer, ...) is not stored by "
                "l3kv.sglang (kv and mamba are); run without it, or use another storage "
                "backend" % name)

    def on_host_pools_registered(self):
        """Computes the registrations from the pools' memfds and geometry
        and attaches; a daemon that is not there yet is retried later."""
        host = self.mem_pool_host or self.registered_pools.get(POOL_KV)
        if host is None:
            raise RefusedError("l3kv: no kv host pool was registered")
        lay, pools, regions = self._registrations(host)
        self.page_size = int(host.page_size)
        sessions = [_Session(self, "kv", dict(layout=lay, pools=pools, regions=regions,
                                              group=self.group))]
        mamba = self.registered_pools.get(POOL_MAMBA)
        if mamba is not None:
            lay, pools, regions = self._state_registrations(mamba)
            sessions.append(_Session(self, "mamba", dict(
                layout=lay, pools=pools, regions=regions,
                group=self.group[:_GROUP_MAX - 2] + "-m")))
        self._kv = sessions[0]
        self._state = sessions[1] if len(sessions) > 1 else None
        for s in sessions:
            try:
                s.connect(first=True)
            except RefusedError:
                for x in sessions:
                    x.close()
                raise
            except Exception as e:  # noqa: BLE001 -- down at start: misses until it is up
                logger.warning("l3kv: l3kvd not reachable at registration (%s); "
                               "every lookup is a miss until it is", e)
                s.mark_down()

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

    def _state_registrations(self, pool):
        """The Mamba host pool (MambaPoolHost): one slot per checkpoint, a
        temporal buffer and n conv buffers (and any side states), each
        [slots, layers, 1, *state] in its own memfd. Each buffer is a pool
        of the state namespace, one object per slot and buffer: the first
        the namespace's kv pool, the others all_pages sidecars, so a
        checkpoint is found whole or not at all."""
        layout = str(getattr(pool, "layout", ""))
        if layout not in ("page_first", "page_first_direct"):
            raise RefusedError(
                "l3kv: Mamba host layout %r is not supported: start SGLang with "
                "--hicache-mem-layout page_first" % layout)
        if int(getattr(pool, "page_size", 1)) != 1:
            raise RefusedError("l3kv: the Mamba host pool's page is not one slot")
        fds = list(getattr(getattr(pool, "allocator", None), "fds", None) or [])
        bufs = _buffers_of(pool)
        if not bufs:
            raise RefusedError("l3kv: the Mamba host pool has no state buffers")
        if len(fds) < len(bufs) or any(f is None or int(f) < 0 for f in fds[:len(bufs)]):
            raise RefusedError(
                "l3kv: the Mamba host pool has no memory fds: add \"allocator\": \"shm\" to "
                "--hicache-storage-backend-extra-config")
        slots = int(pool.size)
        pools, regions = [], []
        names = ["temporal"] if getattr(pool, "temporal_buffer", None) is not None and \
            pool.temporal_buffer.numel() > 0 else []
        names += ["conv%d" % i for i in range(len(getattr(pool, "conv_buffer", None) or []))]
        names += ["side%d" % i for i in range(len(getattr(pool, "slot_state_buffers", None)
                                                   or []))]
        for i, (b, fd) in enumerate(zip(bufs, fds)):
            shape = tuple(b.shape)
            if not b.is_contiguous() or shape[0] != slots:
                raise RefusedError("l3kv: Mamba host buffer %d of shape %s is not "
                                   "[slots, ...] contiguous" % (i, shape))
            es = b.element_size()
            nbytes = es * math.prod(shape)
            if os.fstat(int(fd)).st_size < nbytes:
                raise RefusedError("l3kv: the Mamba host pool's memfds do not match its "
                                   "buffers (fd %d is smaller than buffer %d)" % (fd, i))
            is_side = names[i].startswith("side")
            layers = 1 if is_side else shape[1]
            tb = nbytes // (slots * layers)
            dt = str(b.dtype).replace("torch.", "")
            schema = ("mamba-%s:%s:%s" % (names[i], dt, shape[1:]))[:63]
            if i == 0:
                pools.append(Pool(POOL_MAMBA, layers * tb, layers=layers, schema=schema))
            else:
                pools.append(Pool(names[i], layers * tb, kind=PoolKind.SIDECAR, layers=layers,
                                  hit_policy=HitPolicy.ALL_PAGES, schema=schema))
            regions.append(Region.page_first(i, fd, slots, 1, layers, tb, 0))
        lay = Layout(model=str(self.model),
                     kv_dtype=str(bufs[0].dtype).replace("torch.", "")[:15], page_tokens=1,
                     tp_size=self.tp_size,
                     pp_size=int(getattr(self.config, "pp_size", 1) or 1),
                     pp_rank=int(getattr(self.config, "pp_rank", 0) or 0),
                     cp_size=int(getattr(self.config, "attn_cp_size", 1) or 1),
                     attention=Attention.MHA,       # state is its TP rank's: sharded by tp_rank
                     seed=int(_cfg(self.extra, "seed", 0)))
        self.nslots = slots
        return lay, pools, regions

    # Existence: the admission.

    def batch_exists(self, keys, extra_info=None) -> int:
        """The leading run of keys l3kvd holds, admitted (pinned under a lease)
        so that batch_get_v1 finds them; 0 on any failure."""
        return self._kv_admit(keys)[0]

    def _kv_admit(self, keys):
        """batch_exists: (pages admitted, their leases)."""
        if not keys or self._kv is None:
            return 0, []
        hashes = tuple(_hash32(k) for k in keys)
        s = self._kv
        self.count("exists_calls")
        conn = s.conn()
        if conn is None:
            self.count("misses_down")
            return 0, []
        leases = []
        try:
            s.prune(conn)
            # One lease per SGLang load batch (STORAGE_BATCH_SIZE pages): a
            # restore is exactly its lease's promise, and batch_get_v1 comes
            # back batch by batch. Request ids from the whole query: the same
            # on every rank, another for another query.
            query = b"".join(hashes)
            total = 0
            for i in range(0, len(hashes), _BATCH):
                part = hashes[i:i + _BATCH]
                le = s.admit(conn, _request_id(b"kv", query, i), part)
                got = le.pages
                if got:
                    leases.append(le)
                self.count("admitted_pages", got)
                total += got
                if got < len(part):
                    break
            return total, leases
        except Exception as e:  # noqa: BLE001
            s.failed(conn, "ADMIT", e)
            return 0, []

    def exists(self, key) -> bool:
        """Whether l3kvd holds key's page (a PROBE: nothing is pinned)."""
        s = self._kv
        conn = s.conn() if s is not None else None
        if conn is None:
            return False
        try:
            return conn[0].probe(_hash32(key)).hit_pages == 1
        except Exception as e:  # noqa: BLE001
            s.failed(conn, "PROBE", e)
            return False

    def _state_admit(self, hashes, n):
        """Admits the Mamba checkpoints at the longest state_candidates
        prefix lengths up to n (one ADMIT each, all in flight at once; a
        group barrier, so every rank pins the same ones): the lengths
        admitted, ascending. Their leases are siblings: the one SGLang
        loads releases the others."""
        s = self._state
        conn = s.conn()
        if conn is None:
            self.count("misses_down")
            return []
        cands = list(range(n, max(0, n - self.state_candidates), -1))
        query = b"".join(hashes[:n])
        try:
            s.prune(conn)
            tickets = []
            for p in cands:
                h = (hashes[p - 1],)
                tickets.append((p, h, s.submit_admit(conn, _request_id(b"mamba", query, p),
                                                     h, 1)))
            got = []
            err = None
            for p, h, t in tickets:
                try:
                    adm = conn[0].wait(t, max(self.admit_timeout_ms, 1) / 1000.0 + 1.0)
                    le = s.admitted(conn, h, adm.result())
                except Exception as e:  # noqa: BLE001 -- wait for the rest, then fail
                    err = err or e
                    continue
                if le.pages:
                    got.append((p, le))
            if err is not None:
                for _, le in got:
                    s.release(conn, le)
                raise err
        except Exception as e:  # noqa: BLE001
            s.failed(conn, "ADMIT (mamba)", e)
            return []
        leases = [le for _, le in got]
        for le in leases:
            le.siblings = leases
        self.count("state_admitted", len(leases))
        return sorted(p for p, _ in got)

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The kv pool's admitted leading run and, with a Mamba transfer
        (TRAILING_PAGES: the checkpoint at the prefix's last page), the
        lengths whose checkpoint l3kvd holds on every rank
        (restorable_prefix_pages, each pinned); kv_hit_pages the longest.
        A pool this backend does not store is a miss: hit 0."""
        mamba = None
        for t in pool_transfers or ():
            name = _name(t)
            if name == POOL_MAMBA and self._state is not None:
                mamba = t
            elif name != POOL_KV:
                return _transfer_result(0, {}, [])
        if mamba is not None and (len(mamba.keys or [None]) != 1 or "trailing" not in
                                  str(getattr(mamba.hit_policy, "value", mamba.hit_policy))):
            return _transfer_result(0, {}, [])      # not the one trailing checkpoint: a miss
        n, leases = self._kv_admit(keys)
        if mamba is None:
            return _transfer_result(n, {POOL_KV: n} if n else {}, list(range(1, n + 1)))
        hashes = tuple(_hash32(k) for k in keys)
        restorable = self._state_admit(hashes, n) if n else []
        if not restorable:
            # KV without its state is no hit: give the pages back (every rank
            # does, the state's admissions having agreed on none).
            conn = self._kv.conn()
            if conn is not None:
                for le in leases:
                    self._kv.release(conn, le)
            return _transfer_result(0, {POOL_KV: n} if n else {}, [])
        p = restorable[-1]
        return _transfer_result(p, {POOL_KV: n, POOL_MAMBA: p}, restorable)

    # Restore.

    def _dst_pages(self, keys, host_indices, ps=None):
        ps = self.page_size if ps is None else ps
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
        s = self._kv
        conn = s.conn() if s is not None else None
        if conn is None:
            self.count("misses_down")
            return miss
        try:
            le = s.find(hashes)
            if le is not None and le.pages != n:
                # The ranks agreed on fewer pages than this one admitted.
                s.release(conn, le)
                le = None
            if le is None:
                # No lease of exactly these pages (a restart, an expired TTL, the
                # ranks agreed on fewer pages than admitted): a restore is exactly
                # its promise, so promise what is asked.
                le = s.admit(conn, _request_id(b"kv-get", b"".join(hashes)), hashes)
                if le.pages == 0:
                    return miss
            got = s.restore(conn, le, 0, dst[:le.pages])
            self.count("restored_pages", got)
            return [True] * got + [False] * (n - got)
        except Exception as e:  # noqa: BLE001
            s.failed(conn, "RESTORE", e)
            return miss

    def _state_get(self, keys, host_indices):
        """Restores Mamba checkpoints (keys: the hash of the page each ends
        on) into host slots: temporal, conv and side-state buffers at once."""
        n = len(keys)
        miss = [False] * n
        try:
            slots = self._dst_pages(keys, host_indices, 1)
        except Exception as e:  # noqa: BLE001
            logger.error("l3kv: batch_get_v2 (mamba): %s", e)
            return miss
        s = self._state
        conn = s.conn()
        if conn is None:
            self.count("misses_down")
            return miss
        out = []
        try:
            for k, slot in zip(keys, slots):
                h = (_hash32(k),)
                le = s.find(h, pages=1)
                if le is None:
                    le = s.admit(conn, _request_id(b"mamba-get", h[0]), h)
                    if le.pages == 0:
                        break
                if s.restore(conn, le, 0, [slot]) != 1:
                    break
                out.append(True)
        except Exception as e:  # noqa: BLE001
            s.failed(conn, "RESTORE (mamba)", e)
        self.count("state_restored", len(out))
        return out + [False] * (n - len(out))

    # Publish.

    def _publish(self, s, keys, src, what):
        """PUBLISHes keys at src of every region of s, sidecars first (once
        the first pool's object is visible, the page is whole): how many
        are stored or present."""
        conn = s.conn()
        if conn is None:
            self.count("misses_down")
            return 0, 0
        items = list(zip((_hash32(k) for k in keys), src))
        try:
            r = None
            for region in range(len(s.attach["regions"]) - 1, -1, -1):
                r = s.publish(conn, region, items)
            return r.stored, r.present
        except Exception as e:  # noqa: BLE001
            s.failed(conn, "PUBLISH" + what, e)
            return 0, 0

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
        if self._kv is None:
            return [False] * n
        stored, present = self._publish(self._kv, keys, src, "")
        self.count("published_pages", stored)
        self.count("present_pages", present)
        ok = min(stored + present, n)
        return [True] * ok + [False] * (n - ok)

    def _state_set(self, keys, host_indices):
        """Publishes Mamba checkpoints from host slots (every rank: the
        state is its TP rank's shard)."""
        n = len(keys)
        try:
            slots = self._dst_pages(keys, host_indices, 1)
        except Exception as e:  # noqa: BLE001
            logger.error("l3kv: batch_set_v2 (mamba): %s", e)
            return [False] * n
        stored, present = self._publish(self._state, keys, slots, " (mamba)")
        self.count("state_published", stored)
        ok = min(stored + present, n)
        return [True] * ok + [False] * (n - ok)

    # The v2 calls.

    def _v2(self, get, transfers, extra_info):
        """Each pool's transfer: kv through the v1 call, mamba through the
        state session, the others misses."""
        out = {}
        for t in transfers:
            name = _name(t)
            keys = list(t.keys or [])
            if t.host_indices is None or not keys:
                out[t.name] = [False] * len(keys)
            elif name == POOL_KV:
                v1 = self.batch_get_v1 if get else self.batch_set_v1
                out[t.name] = v1(keys, t.host_indices, extra_info)
            elif name == POOL_MAMBA and self._state is not None:
                out[t.name] = (self._state_get if get else self._state_set)(keys,
                                                                           t.host_indices)
            else:
                out[t.name] = [False] * len(keys)
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        return self._v2(True, transfers, extra_info)

    def batch_set_v2(self, transfers, extra_info=None):
        return self._v2(False, transfers, extra_info)

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

    def _sessions(self):
        return [s for s in (self._kv, self._state) if s is not None]

    def clear(self):
        """l3kvd's objects outlive engines and are shared by the group: clear
        drops this side's leases only (l3kvctl manages the daemon's tiers)."""
        for s in self._sessions():
            s.drop_leases()
        return True

    def get_stats(self):
        """This backend's counters (a dict); SGLang's storage metrics come from
        its own controller."""
        with self._stats_lock:
            d = dict(self.stats)
        d["connected"] = bool(self._kv is not None and self._kv.client is not None)
        d["leases"] = sum(s.nleases for s in self._sessions())
        if self._state is not None:
            d["state_connected"] = self._state.client is not None
        d["group"] = self.group
        return d

    def close(self):
        """Releases the leases, DETACHes and closes (idempotent): the daemon
        unmaps the host pools."""
        if self._closed:
            return
        self._closed = True
        for s in self._sessions():
            s.close()


__all__ = ["L3kvStorage", "RefusedError", "SUPPORTED_SGLANG", "default_group", "instance_id"]
