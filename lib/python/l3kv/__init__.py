"""l3kv: the Python client of l3kvd, the decode-side KV-cache daemon.

A thin ctypes binding over libl3kv (lib/l3kv.h): every call goes through
the C library, so the wire protocol has one implementation. Standard
library only; torch is optional (CPU tensors may stand in for hash and
page-index arrays, through their data_ptr()). l3kv.torch registers CUDA
tensors (legacy CUDA IPC) and CUDA IPC events, for an engine written
with torch.

    import l3kv
    with l3kv.Client("/run/l3kvd/l3kvd.sock") as c:
        c.attach(layout, pools, regions, group="engine-0")
        hit, stops = c.probe(hashes)
        adm = c.admit(request_id, hashes, reserved_pages=len(dst))
        if adm.admitted:
            c.restore(adm.lease, region=0, dst_pages=dst[:adm.admitted_pages])
            c.release(adm.lease)

Errors raise L3kvError (an OSError: .errno, plus the daemon's .status and
its text in .message). A declined admission is not an error: it is an
AdmitResult with lease 0 and the reason in .decline.

libl3kv.so is loaded from $L3KV_LIB when set, else from build/libl3kv.so
of the repository this file lives in, else through the system loader.
"""

import collections
import ctypes
import ctypes.util
import dataclasses
import enum
import errno as _errno
import json
import os
import select
import struct
import threading
import time
from typing import Iterator, Optional, Sequence, Tuple

__all__ = [
    "Attention", "AdmitResult", "AttachInfo", "Caps", "Client", "Completion", "Decline",
    "DebugOp", "HitPolicy", "HostLayout", "L3kvError", "Layout", "MemKind", "Op", "Pool",
    "PoolKind", "Prefetch", "ProbeResult", "PublishResult", "Region", "RestoreResult",
    "ServerInfo", "StateDest", "Status", "Write", "default_socket", "has_restore_with",
    "library_path", "strerror", "version",
    "HASH_LEN", "SLOT_NONE", "PAGES_MAX", "REGION_NONE", "TIMEOUT_DEFAULT", "TIMEOUT_INFINITE",
]

# Constants of lib/l3kv.h.
HASH_LEN = 32
SLOT_NONE = 0xFFFFFFFF
PAGES_MAX = 65536
POOLS_MAX = 8
REGIONS_MAX = 64
LIVE_MAX = 65536
HANDLE_LEN = 64
REGION_NONE = 0xFFFF    # no state region, no event region (l3kv_restore_args)
TIMEOUT_DEFAULT = 0
TIMEOUT_INFINITE = -1
DEFAULT_TIMEOUT_MS = 5000


class HostLayout(enum.IntEnum):
    PAGE_FIRST = 1          # page: tokens x layers x bytes
    LAYER_FIRST = 2         # per layer: pages x tokens x bytes
    PAGE_FIRST_DIRECT = 3   # page: layers x tokens x bytes
    SLOTS = 4               # state slots: slot x bytes (regions only)


class Attention(enum.IntEnum):
    MLA = 1
    MHA = 2
    GQA = 3


class PoolKind(enum.IntEnum):
    KV = 1          # attention KV pages
    STATE = 2       # recurrent-state checkpoints
    SIDECAR = 3     # swa, indexer


class HitPolicy(enum.IntEnum):
    ALL_PAGES = 1
    TRAILING = 2    # trailing_pages(n), n in Pool.trailing


class Prefetch(enum.IntEnum):
    WAIT_COMPLETE = 1
    BEST_EFFORT = 2
    TIMEOUT = 3


class Write(enum.IntEnum):
    THROUGH = 1
    BACK = 2
    OFFLOAD = 3     # decode KV offload


class MemKind(enum.IntEnum):
    MEMFD = 1       # host shared memory; fd
    CUDA_IPC = 2    # legacy cudaIpcMemHandle_t in handle
    CUMEM_FD = 3    # cuMem allocation exported as a POSIX fd
    CUDA_EVENT = 4  # a cudaIpcEventHandle_t in handle: no memory; RESTORE may wait on it


class Caps(enum.IntFlag):
    HOST_COPY = 0x0001
    CUDA_COPY = 0x0002
    NONBLOCK = 0x0004


class Op(enum.IntEnum):
    """Request types: a completion's op. Equal to the wire's numbers."""
    HELLO = 1
    ATTACH = 2
    DETACH = 3
    STATS = 4
    HEALTH = 5
    PROBE = 16
    ADMIT = 17
    RESTORE = 18
    CANCEL = 19
    RELEASE = 20
    PUBLISH = 21
    SET_POLICY = 22
    DEBUG = 240


class Decline(enum.IntEnum):
    """Why an ADMIT promised nothing."""
    NONE = 0            # admitted
    NO_HIT = 1          # the group holds no common prefix
    NO_RESERVATION = 2  # some rank reserved 0 pages
    GROUP_TIMEOUT = 3   # a rank did not ask in time
    GROUP_MISMATCH = 4  # ranks asked for different pages
    SHUTTING_DOWN = 5
    RANK_LEFT = 6       # a rank detached while waiting
    NO_SLOT = 7         # a state pool but no usable canonical slot
    SLOT_BUSY = 8       # the slot is held by another lease


class Status(enum.IntEnum):
    """The daemon's status numbers (proto/PROTOCOL.md section 2)."""
    OK = 0
    BAD_MAGIC = 1
    BAD_VERSION = 2
    TOO_BIG = 3
    BAD_TYPE = 4
    BAD_LENGTH = 5
    SHORT_HEADER = 6
    TRUNCATED = 7
    UNEXPECTED_FDS = 8
    DENIED = 9
    LIMIT = 10
    INVALID = 11
    STATE = 12
    GUARD = 13
    NO_MEMORY = 14
    INTERNAL = 15
    BAD_REGION = 16
    BAD_FLAGS = 17
    SHUTTING_DOWN = 18
    OUT_OF_BOUNDS = 19
    NOT_FOUND = 20
    EXPIRED = 21
    LOST = 22
    CANCELLED = 23
    NO_SPACE = 24
    BUSY = 25
    TIMEOUT = 26
    GROUP_MISMATCH = 27
    SLOT = 28


class DebugOp(enum.IntEnum):
    DROP = 1        # remove the object, as if lost
    CORRUPT = 2     # flip a byte of its data


# The C structures, field for field as lib/l3kv.h declares them.

class _CLayout(ctypes.Structure):
    _fields_ = [
        ("model", ctypes.c_char_p),
        ("kv_dtype", ctypes.c_char_p),
        ("hash_scheme", ctypes.c_char_p),
        ("hash_len", ctypes.c_uint),
        ("tp_size", ctypes.c_uint),
        ("dcp_size", ctypes.c_uint),
        ("pp_size", ctypes.c_uint),
        ("cp_size", ctypes.c_uint),
        ("dcp_rank", ctypes.c_uint),
        ("pp_rank", ctypes.c_uint),
        ("host_layout", ctypes.c_int),
        ("attention", ctypes.c_int),
        ("page_tokens", ctypes.c_uint32),
        ("logical_page_tokens", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
    ]


class _CPool(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("kind", ctypes.c_int),
        ("hit_policy", ctypes.c_int),
        ("trailing", ctypes.c_uint),
        ("layers", ctypes.c_uint32),
        ("object_bytes", ctypes.c_uint64),
        ("schema", ctypes.c_char_p),
    ]


class _CRegion(ctypes.Structure):
    _fields_ = [
        ("pool", ctypes.c_uint),
        ("kind", ctypes.c_int),
        ("layout", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("num_pages", ctypes.c_uint32),
        ("page_tokens", ctypes.c_uint32),
        ("layers", ctypes.c_uint32),
        ("token_bytes", ctypes.c_uint32),
        ("page_stride", ctypes.c_uint64),
        ("layer_stride", ctypes.c_uint64),
        ("token_stride", ctypes.c_uint64),
        ("handle", ctypes.c_uint8 * HANDLE_LEN),
    ]


class _CAttachArgs(ctypes.Structure):
    _fields_ = [
        ("layout", _CLayout),
        ("pools", ctypes.POINTER(_CPool)),
        ("npools", ctypes.c_uint),
        ("regions", ctypes.POINTER(_CRegion)),
        ("nregions", ctypes.c_uint),
        ("live_slots", ctypes.POINTER(ctypes.c_uint32)),
        ("nlive", ctypes.c_uint32),
        ("group", ctypes.c_char_p),
        ("group_size", ctypes.c_uint),
        ("group_rank", ctypes.c_uint),
        ("tp_rank", ctypes.c_uint),
        ("prefetch", ctypes.c_int),
        ("prefetch_timeout_ms", ctypes.c_uint32),
        ("write", ctypes.c_int),
        ("timeout_ms", ctypes.c_int),
    ]


class _CAttachInfo(ctypes.Structure):
    _fields_ = [
        ("fingerprint", ctypes.c_uint8 * 16),
        ("ns", ctypes.c_char * 96),
        ("session", ctypes.c_uint32),
        ("lease_ttl_ms", ctypes.c_uint32),
        ("group_members", ctypes.c_uint32),
    ]


class _CServerInfo(ctypes.Structure):
    _fields_ = [
        ("protocol", ctypes.c_uint),
        ("caps", ctypes.c_uint),
        ("max_frame", ctypes.c_uint32),
        ("lease_ttl_ms", ctypes.c_uint32),
        ("server", ctypes.c_char * 32),
        ("role", ctypes.c_char * 32),
    ]


class _CCompletion(ctypes.Structure):
    _fields_ = [
        ("ticket", ctypes.c_uint64),
        ("op", ctypes.c_int),
        ("status", ctypes.c_int),
        ("proto_status", ctypes.c_int),
        ("payload", ctypes.c_void_p),   # not c_char_p: binary replies hold NULs
        ("len", ctypes.c_size_t),
    ]


class _CAdmitArgs(ctypes.Structure):
    _fields_ = [
        ("request_id", ctypes.c_uint64),
        ("hashes", ctypes.c_void_p),
        ("npages", ctypes.c_uint32),
        ("reserved_pages", ctypes.c_uint32),
        ("state_slot", ctypes.c_uint32),
        ("timeout_ms", ctypes.c_int),
    ]


class _CRestoreArgs(ctypes.Structure):
    """struct l3kv_restore_args: RESTORE with a state slot and an event to wait on."""
    _fields_ = [
        ("lease", ctypes.c_uint64),
        ("pages", ctypes.c_void_p),
        ("npages", ctypes.c_uint32),
        ("region", ctypes.c_uint16),
        ("state_region", ctypes.c_uint16),     # REGION_NONE: no state
        ("state_slot", ctypes.c_uint32),       # SLOT_NONE without state
        ("event_region", ctypes.c_uint16),     # REGION_NONE: no event to wait on
        ("pad", ctypes.c_uint16),
    ]


class _CAdmitResult(ctypes.Structure):
    _fields_ = [
        ("lease", ctypes.c_uint64),
        ("admitted_pages", ctypes.c_uint32),
        ("decline", ctypes.c_int),
        ("ttl_ms", ctypes.c_uint32),
        ("group_hit", ctypes.c_uint32),
    ]


class _CRestoreResult(ctypes.Structure):
    _fields_ = [
        ("pages", ctypes.c_uint32),
        ("partial", ctypes.c_int),
        ("bytes", ctypes.c_uint64),
    ]


class _CStateDest(ctypes.Structure):
    _fields_ = [
        ("region", ctypes.c_uint),
        ("slot", ctypes.c_uint32),
    ]


class _CPublishPage(ctypes.Structure):
    _fields_ = [
        ("hash", ctypes.c_uint8 * HASH_LEN),
        ("src_page", ctypes.c_uint32),
    ]


class _CPublishResult(ctypes.Structure):
    _fields_ = [
        ("stored", ctypes.c_uint32),
        ("present", ctypes.c_uint32),
        ("bytes", ctypes.c_uint64),
    ]


# Loading the library.

def _repo_library() -> Optional[str]:
    """build/libl3kv.so of the repository above this file, if there is one."""
    d = os.path.dirname(os.path.abspath(__file__))
    while True:
        cand = os.path.join(d, "build", "libl3kv.so")
        if os.path.isfile(cand):
            return cand
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _find_library() -> str:
    env = os.environ.get("L3KV_LIB")
    if env:
        return env
    repo = _repo_library()
    if repo is not None:
        return repo
    return ctypes.util.find_library("l3kv") or "libl3kv.so.1"


_P = ctypes.POINTER
_K = ctypes.c_void_p    # struct l3kv *
_SIGNATURES = {
    # name: (restype, argtypes)
    "l3kv_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, _P(_K)]),
    "l3kv_close": (None, [_K]),
    "l3kv_default_socket": (ctypes.c_char_p, []),
    "l3kv_version": (ctypes.c_char_p, []),
    "l3kv_set_timeout": (ctypes.c_int, [_K, ctypes.c_int]),
    "l3kv_server_info": (ctypes.c_int, [_K, _P(_CServerInfo)]),
    "l3kv_attach": (ctypes.c_int, [_K, _P(_CAttachArgs), _P(_CAttachInfo)]),
    "l3kv_detach": (ctypes.c_int, [_K]),
    "l3kv_stats": (ctypes.c_int, [_K, _P(ctypes.c_void_p)]),
    "l3kv_health": (ctypes.c_int, [_K, _P(ctypes.c_void_p)]),
    "l3kv_free": (None, [ctypes.c_void_p]),
    "l3kv_fd": (ctypes.c_int, [_K]),
    "l3kv_poll_completion": (ctypes.c_int, [_K, _P(_CCompletion)]),
    "l3kv_completion_release": (None, [_P(_CCompletion)]),
    "l3kv_submit_stats": (ctypes.c_int, [_K, _P(ctypes.c_uint64)]),
    "l3kv_submit_health": (ctypes.c_int, [_K, _P(ctypes.c_uint64)]),
    "l3kv_probe_stops": (ctypes.c_int, [_K, ctypes.c_void_p, ctypes.c_uint32,
                                        _P(ctypes.c_uint32), ctypes.c_void_p,
                                        ctypes.c_uint32, _P(ctypes.c_uint32)]),
    "l3kv_submit_probe": (ctypes.c_int, [_K, ctypes.c_void_p, ctypes.c_uint32,
                                         _P(ctypes.c_uint64)]),
    "l3kv_admit": (ctypes.c_int, [_K, _P(_CAdmitArgs), _P(_CAdmitResult)]),
    "l3kv_submit_admit": (ctypes.c_int, [_K, _P(_CAdmitArgs), _P(ctypes.c_uint64)]),
    "l3kv_admit_result": (ctypes.c_int, [_P(_CCompletion), _P(_CAdmitResult)]),
    "l3kv_restore_state": (ctypes.c_int, [_K, ctypes.c_uint64, ctypes.c_uint, ctypes.c_void_p,
                                          ctypes.c_uint32, _P(_CStateDest), ctypes.c_int,
                                          _P(_CRestoreResult)]),
    "l3kv_submit_restore_state": (ctypes.c_int, [_K, ctypes.c_uint64, ctypes.c_uint,
                                                 ctypes.c_void_p, ctypes.c_uint32,
                                                 _P(_CStateDest), _P(ctypes.c_uint64)]),
    "l3kv_restore_result": (ctypes.c_int, [_P(_CCompletion), _P(_CRestoreResult)]),
    "l3kv_set_policy": (ctypes.c_int, [_K, ctypes.c_int, ctypes.c_int, ctypes.c_uint32]),
    "l3kv_cancel": (ctypes.c_int, [_K, ctypes.c_uint64, _P(ctypes.c_uint32)]),
    "l3kv_submit_cancel": (ctypes.c_int, [_K, ctypes.c_uint64, _P(ctypes.c_uint64)]),
    "l3kv_cancel_result": (ctypes.c_int, [_P(_CCompletion), _P(ctypes.c_uint32)]),
    "l3kv_release": (ctypes.c_int, [_K, ctypes.c_uint64]),
    "l3kv_submit_release": (ctypes.c_int, [_K, ctypes.c_uint64, _P(ctypes.c_uint64)]),
    "l3kv_publish": (ctypes.c_int, [_K, ctypes.c_uint, _P(_CPublishPage), ctypes.c_uint32,
                                    _P(_CPublishResult)]),
    "l3kv_submit_publish": (ctypes.c_int, [_K, ctypes.c_uint, _P(_CPublishPage),
                                           ctypes.c_uint32, _P(ctypes.c_uint64)]),
    "l3kv_publish_result": (ctypes.c_int, [_P(_CCompletion), _P(_CPublishResult)]),
    "l3kv_debug": (ctypes.c_int, [_K, ctypes.c_uint, ctypes.c_uint, ctypes.c_char_p]),
    "l3kv_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "l3kv_last_status": (ctypes.c_int, [_K]),
    "l3kv_last_error": (ctypes.c_char_p, [_K]),
}
# Bound when the loaded libl3kv has them; a call that needs one raises ENOSYS otherwise.
_OPTIONAL = {
    "l3kv_restore_with": (ctypes.c_int, [_K, _P(_CRestoreArgs), ctypes.c_int,
                                         _P(_CRestoreResult)]),
    "l3kv_submit_restore_with": (ctypes.c_int, [_K, _P(_CRestoreArgs), _P(ctypes.c_uint64)]),
}

_lib = None
_lib_path = None
_lib_lock = threading.Lock()


def _load():
    """The library, loaded (and its signatures declared) on first use."""
    global _lib, _lib_path
    with _lib_lock:
        if _lib is None:
            path = _find_library()
            lib = ctypes.CDLL(path)
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = res
                fn.argtypes = args
            for name, (res, args) in _OPTIONAL.items():
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.restype = res
                    fn.argtypes = args
            _lib_path = path
            _lib = lib
    return _lib


def library_path() -> str:
    """The path libl3kv was (or will be) loaded from."""
    _load()
    return _lib_path


def has_restore_with() -> bool:
    """Whether the loaded libl3kv has l3kv_restore_with(), which RESTORE's
    wait_event needs."""
    return hasattr(_load(), "l3kv_restore_with")


def version() -> str:
    """The loaded libl3kv's version, e.g. "0.1.0"."""
    return _load().l3kv_version().decode()


def default_socket() -> str:
    """$L3KV_SOCKET when set and not empty, else "./run/l3kvd.sock"."""
    return _load().l3kv_default_socket().decode()


def strerror(err: int) -> str:
    """libl3kv's text for an errno (either sign)."""
    return _load().l3kv_strerror(-abs(err)).decode(errors="replace")


class L3kvError(OSError):
    """A failed call: errno (positive), the daemon's status (0 when the
    failure was found locally) and the error text."""

    def __init__(self, errno: int, status: int = 0, message: str = ""):
        super().__init__(errno, message or strerror(errno))
        self.status = status
        self.message = message or strerror(errno)

    @property
    def status_name(self) -> str:
        try:
            return Status(self.status).name.lower()
        except ValueError:
            return str(self.status)

    def __str__(self):
        s = "[Errno %d] %s" % (self.errno, self.message)
        if self.status:
            s += " (daemon status %s)" % self.status_name
        return s

    def __reduce__(self):
        return (type(self), (self.errno, self.status, self.message))


# Results.

@dataclasses.dataclass(frozen=True)
class ServerInfo:
    protocol: int
    caps: Caps
    max_frame: int
    lease_ttl_ms: int
    server: str
    role: str


@dataclasses.dataclass(frozen=True)
class AttachInfo:
    fingerprint: bytes
    ns: str
    session: int
    lease_ttl_ms: int
    group_members: int


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """hit_pages, and the legal stop points of a hybrid layout (ascending;
    empty: every length up to hit_pages is one). Unpacks as (hit, stops)."""
    hit_pages: int
    stops: Tuple[int, ...]

    def __iter__(self):
        return iter((self.hit_pages, self.stops))


@dataclasses.dataclass(frozen=True)
class AdmitResult:
    lease: int              # 0 when declined
    admitted_pages: int     # the same on every rank; never grows
    decline: Decline
    ttl_ms: int
    group_hit: int          # the common hit, before the reservation cap

    @property
    def admitted(self) -> bool:
        return self.decline == Decline.NONE and self.lease != 0


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    pages: int              # whole, verified, contiguous pages in place
    partial: bool           # a best_effort/timeout deadline cut it short
    bytes: int


@dataclasses.dataclass(frozen=True)
class PublishResult:
    stored: int             # new objects, now visible
    present: int            # already stored (or being stored): not written twice
    bytes: int


@dataclasses.dataclass(frozen=True)
class Completion:
    """One finished non-blocking request. value is the decoded reply
    (ProbeResult, AdmitResult, RestoreResult, PublishResult, pages landed
    for CANCEL, a dict for STATS/HEALTH, None for RELEASE) when errno is 0;
    message is the error text otherwise."""
    ticket: int
    op: Op
    errno: int              # 0, or the positive errno it failed with
    status: int             # the daemon's status number; 0 for local errors
    value: object = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.errno == 0

    def result(self):
        """The value, or raise the failure as an L3kvError."""
        if self.errno != 0:
            raise L3kvError(self.errno, self.status, self.message)
        return self.value


# Arguments.

@dataclasses.dataclass
class Layout:
    """Everything that shapes bytes: hashed into the namespace fingerprint."""
    model: str
    kv_dtype: str
    page_tokens: int
    hash_scheme: str = "sha256"
    hash_len: int = HASH_LEN
    tp_size: int = 1
    dcp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1
    dcp_rank: int = 0
    pp_rank: int = 0
    host_layout: HostLayout = HostLayout.PAGE_FIRST
    attention: Attention = Attention.MHA
    logical_page_tokens: Optional[int] = None   # None: page_tokens
    seed: int = 0


@dataclasses.dataclass
class Pool:
    """One kind of object the engine stores."""
    name: str
    object_bytes: int
    kind: PoolKind = PoolKind.KV
    layers: int = 1
    hit_policy: HitPolicy = HitPolicy.ALL_PAGES
    trailing: int = 0               # n of trailing_pages(n)
    schema: str = ""


@dataclasses.dataclass
class Region:
    """A memory registration. Byte 0 of (page p, layer l, token t) is at
    offset + p*page_stride + l*layer_stride + t*token_stride, token_bytes
    long. fd is an int or anything with fileno() (memfd, cuMem fd); it is
    borrowed for the ATTACH and stays the caller's.

    GPU memory of a torch tensor: l3kv.torch.cuda_ipc_region(). A CUDA IPC
    event that RESTORE can wait on: Region.cuda_event() (or
    l3kv.torch.event_region()); it takes a region index like memory does."""
    pool: int
    num_pages: int
    page_tokens: int
    layers: int
    token_bytes: int
    page_stride: int
    layer_stride: int
    token_stride: int
    size: int
    fd: object = -1
    offset: int = 0
    kind: MemKind = MemKind.MEMFD
    layout: HostLayout = HostLayout.PAGE_FIRST
    handle: bytes = b""             # a cudaIpcMemHandle_t, MemKind.CUDA_IPC only

    @classmethod
    def page_first(cls, pool: int, fd, num_pages: int, page_tokens: int, layers: int,
                   token_bytes: int, offset: int = 0, kind: MemKind = MemKind.MEMFD):
        """Pages of tokens x layers x token_bytes, packed."""
        page = page_tokens * layers * token_bytes
        return cls(pool=pool, num_pages=num_pages, page_tokens=page_tokens, layers=layers,
                   token_bytes=token_bytes, page_stride=page, layer_stride=token_bytes,
                   token_stride=layers * token_bytes, size=num_pages * page, fd=fd,
                   offset=offset, kind=kind, layout=HostLayout.PAGE_FIRST)

    @classmethod
    def cuda_event(cls, handle: bytes):
        """A CUDA IPC event (kind CUDA_EVENT): handle is the 64-byte
        cudaIpcEventHandle_t (torch: Event(interprocess=True).ipc_handle()).
        No memory: fd -1, pool 0, every geometry field 0. Its index in
        attach(regions=...) is what restore(wait_event=...) names."""
        h = bytes(handle)
        if len(h) != HANDLE_LEN:
            raise ValueError("cuda_event: a cudaIpcEventHandle_t is %d bytes, not %d"
                             % (HANDLE_LEN, len(h)))
        return cls(pool=0, num_pages=0, page_tokens=0, layers=0, token_bytes=0,
                   page_stride=0, layer_stride=0, token_stride=0, size=0, fd=-1, offset=0,
                   kind=MemKind.CUDA_EVENT, layout=0, handle=h)

    @classmethod
    def slots(cls, pool: int, fd, num_slots: int, slot_bytes: int, offset: int = 0,
              kind: MemKind = MemKind.MEMFD):
        """A state-slot region: num_slots checkpoints of slot_bytes, packed."""
        return cls(pool=pool, num_pages=num_slots, page_tokens=1, layers=1,
                   token_bytes=slot_bytes, page_stride=slot_bytes, layer_stride=0,
                   token_stride=0, size=num_slots * slot_bytes, fd=fd, offset=offset,
                   kind=kind, layout=HostLayout.SLOTS)


@dataclasses.dataclass(frozen=True)
class StateDest:
    """Where RESTORE puts a hybrid layout's checkpoint: the slot region's
    index at ATTACH and the canonical slot given to ADMIT."""
    region: int
    slot: int


def _uint(v, bits: int, what: str) -> int:
    v = int(v)
    if v < 0 or v >= 1 << bits:
        raise ValueError("%s: %d does not fit in %d bits" % (what, v, bits))
    return v


def _text(s, what: str) -> bytes:
    if s is None:
        return b""
    b = s.encode("ascii") if isinstance(s, str) else bytes(s)
    if b"\0" in b:
        raise ValueError("%s: contains a NUL" % what)
    return b


def _fileno(fd) -> int:
    return fd if isinstance(fd, int) else fd.fileno()


def _tensor_buffer(obj, elem_size: int, unit: int, what: str):
    """(address, units) of a contiguous CPU tensor-like with data_ptr():
    elements of elem_size bytes, read in units of unit bytes."""
    dev = getattr(obj, "device", None)
    if dev is not None and getattr(dev, "type", "cpu") != "cpu":
        raise ValueError("%s: a %s tensor; libl3kv reads this array on the host" % (what, dev))
    if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
        raise ValueError("%s: the tensor is not contiguous" % what)
    if hasattr(obj, "element_size") and obj.element_size() != elem_size:
        raise ValueError("%s: elements of %d bytes, not %d"
                         % (what, obj.element_size(), elem_size))
    nbytes = obj.nbytes if hasattr(obj, "nbytes") else obj.numel() * obj.element_size()
    if nbytes % unit:
        raise ValueError("%s: %d bytes is not a whole number of %d-byte entries"
                         % (what, nbytes, unit))
    return obj.data_ptr(), nbytes // unit


def _hashes(hashes):
    """(pointer argument, npages, keep-alive) for page hashes: a buffer of
    n*32 bytes, a sequence of hashes of at most 32 bytes each (zero-padded,
    for an engine whose hash_len is shorter), or a tensor with data_ptr()."""
    if hasattr(hashes, "data_ptr"):
        ptr, n = _tensor_buffer(hashes, 1, HASH_LEN, "hashes")    # uint8, n x 32
        return ptr, n, hashes
    if isinstance(hashes, (bytes, bytearray, memoryview)):
        b = bytes(hashes)
        if len(b) % HASH_LEN:
            raise ValueError("hashes: %d bytes is not a multiple of %d" % (len(b), HASH_LEN))
    else:
        parts = []
        for i, h in enumerate(hashes):
            h = bytes(h)
            if not 1 <= len(h) <= HASH_LEN:
                raise ValueError("hashes[%d]: %d bytes (1..%d)" % (i, len(h), HASH_LEN))
            parts.append(h.ljust(HASH_LEN, b"\0"))
        b = b"".join(parts)
    n = len(b) // HASH_LEN
    buf = ctypes.create_string_buffer(b, len(b)) if b else None
    return buf, n, buf


def _address(buf) -> Optional[int]:
    """The address of a ctypes buffer, an int address as is, or None."""
    if buf is None or isinstance(buf, int):
        return buf
    return ctypes.addressof(buf)


def _hash32(h) -> bytes:
    h = bytes(h)
    if not 1 <= len(h) <= HASH_LEN:
        raise ValueError("hash: %d bytes (1..%d)" % (len(h), HASH_LEN))
    return h.ljust(HASH_LEN, b"\0")


def _pages(pages, what: str):
    """(pointer argument, n, keep-alive) for a uint32 page-index array: a
    sequence of ints, an array('I'), or an int32/uint32 tensor."""
    if hasattr(pages, "data_ptr"):
        ptr, n = _tensor_buffer(pages, 4, 4, what)       # int32 or uint32
        return ptr, n, pages
    vals = [_uint(p, 32, "%s[%d]" % (what, i)) for i, p in enumerate(pages)]
    arr = (ctypes.c_uint32 * len(vals))(*vals) if vals else None
    return arr, len(vals), arr


def _state_dest(state):
    if state is None:
        return None
    if not isinstance(state, StateDest):
        region, slot = state
        state = StateDest(region, slot)
    return ctypes.byref(_CStateDest(_uint(state.region, 32, "state.region"),
                                    _uint(state.slot, 32, "state.slot")))


def _restore_args(lease, region, dst, n, state, wait_event) -> _CRestoreArgs:
    """struct l3kv_restore_args; dst is what _pages() returned (kept alive
    by the caller)."""
    a = _CRestoreArgs()
    a.lease = _uint(lease, 64, "lease")
    a.pages = _address(dst)
    a.npages = n
    a.region = _region16(region, "region")
    if state is None:
        a.state_region, a.state_slot = REGION_NONE, SLOT_NONE
    else:
        if not isinstance(state, StateDest):
            state = StateDest(*state)
        a.state_region = _region16(state.region, "state.region")
        a.state_slot = _uint(state.slot, 32, "state.slot")
    a.event_region = REGION_NONE if wait_event is None else _region16(wait_event, "wait_event")
    return a


def _region16(v, what: str) -> int:
    """A region index for a 16-bit field; REGION_NONE is not an index."""
    v = _uint(v, 16, what)
    if v == REGION_NONE:
        raise ValueError("%s: %d is REGION_NONE, not a region index" % (what, v))
    return v


def _publish_pages(pages):
    items = list(pages)
    arr = (_CPublishPage * len(items))() if items else None
    for i, (h, src) in enumerate(items):
        arr[i].hash[:] = _hash32(h)
        arr[i].src_page = _uint(src, 32, "pages[%d].src_page" % i)
    return arr, len(items)


def _probe_decode(payload: bytes) -> ProbeResult:
    """PROBE's reply: hit_pages, nstops, then nstops uint32 stop points.
    Decoded here: l3kv_probe_result() hands back the hit only, and only for
    a reply without stop points."""
    hit, nstops = struct.unpack_from("<II", payload)
    if len(payload) != 8 + 4 * nstops:
        raise L3kvError(_errno.EPROTO, 0, "PROBE reply of %d bytes with %d stop points"
                        % (len(payload), nstops))
    return ProbeResult(hit, tuple(struct.unpack_from("<%dI" % nstops, payload, 8)))


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

    @property
    def server_info(self) -> ServerInfo:
        with self._lock:
            i = _CServerInfo()
            self._check(self._lib.l3kv_server_info(self._handle(), ctypes.byref(i)))
        return ServerInfo(i.protocol, Caps(i.caps), i.max_frame, i.lease_ttl_ms,
                          i.server.decode(errors="replace"), i.role.decode(errors="replace"))

    # ATTACH, DETACH, administration.

    def attach(self, layout: Layout, pools: Sequence[Pool], regions: Sequence[Region] = (),
               live_slots: Sequence[int] = (), group: str = "", group_size: int = 1,
               group_rank: int = 0, tp_rank: int = 0,
               prefetch: Prefetch = Prefetch.WAIT_COMPLETE, write: Write = Write.THROUGH,
               prefetch_timeout_ms: int = 0, timeout_ms: int = TIMEOUT_DEFAULT) -> AttachInfo:
        """Registers this rank: layout, pools, memory and policies. The
        regions' fds are sent with the request and stay the caller's."""
        keep = []

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
        with self._lock:
            self._check(self._lib.l3kv_attach(self._handle(), ctypes.byref(a),
                                              ctypes.byref(info)))
        return AttachInfo(bytes(info.fingerprint), info.ns.decode(errors="replace"),
                          info.session, info.lease_ttl_ms, info.group_members)

    def detach(self):
        """Leaves; the daemon keeps the stored data."""
        with self._lock:
            self._check(self._lib.l3kv_detach(self._handle()))

    def _json(self, fn) -> dict:
        p = ctypes.c_void_p()
        with self._lock:
            self._check(fn(self._handle(), ctypes.byref(p)))
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
                wait_event: Optional[int] = None) -> RestoreResult:
        """RESTORE: the lease's admitted pages, in order, into dst_pages of
        region (exactly the admitted count). state: a StateDest or
        (region, slot) for a layout with recurrent state. wait_event: the
        index of a CUDA_EVENT region; the daemon's copies then wait on the
        GPU for that event's last record before the call (record it on the
        stream whose work must land first, then call). Needs
        l3kv_restore_with() in libl3kv (has_restore_with()), else ENOSYS."""
        dst, n, _keep = _pages(dst_pages, "dst_pages")
        r = _CRestoreResult()
        if wait_event is None:
            sd = _state_dest(state)
            with self._lock:
                self._check(self._lib.l3kv_restore_state(
                    self._handle(), _uint(lease, 64, "lease"), _uint(region, 32, "region"),
                    dst, n, sd, int(timeout_ms), ctypes.byref(r)))
        else:
            a = _restore_args(lease, region, dst, n, state, wait_event)
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
                       wait_event: Optional[int] = None) -> int:
        """RESTORE without waiting; as restore(). The page list is copied
        into the request before this returns."""
        dst, n, _keep = _pages(dst_pages, "dst_pages")
        if wait_event is None:
            return self._ticket(self._lib.l3kv_submit_restore_state, _uint(lease, 64, "lease"),
                                _uint(region, 32, "region"), dst, n, _state_dest(state))
        a = _restore_args(lease, region, dst, n, state, wait_event)
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
                    done = self._decode(c)
                finally:
                    self._lib.l3kv_completion_release(ctypes.byref(c))
            yield done

    def wait(self, ticket: int, timeout: Optional[float] = None) -> Completion:
        """Waits for one ticket's completion (at most timeout seconds; None:
        forever). Others that arrive meanwhile are kept for
        poll_completions()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for i, c in enumerate(self._stash):
                if c.ticket == ticket:
                    del self._stash[i]
                    return c
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise L3kvError(_errno.ETIMEDOUT, 0, "no completion of ticket %d in time"
                                % ticket)
            if left is not None and left > 0:
                select.select([self.fileno()], [], [], left)
            elif left is None:
                select.select([self.fileno()], [], [])
            with self._lock:
                c = _CCompletion()
                rc = self._lib.l3kv_poll_completion(self._handle(), ctypes.byref(c))
                if rc == -_errno.EAGAIN:
                    continue
                if rc == -_errno.ENOTCONN:
                    raise L3kvError(_errno.ENOTCONN, 0,
                                    "the connection broke before ticket %d completed" % ticket)
                self._check(rc)
                try:
                    done = self._decode(c)
                finally:
                    self._lib.l3kv_completion_release(ctypes.byref(c))
            if done.ticket == ticket:
                return done
            self._stash.append(done)
