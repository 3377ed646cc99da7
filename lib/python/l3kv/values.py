"""l3kv's value types: the constants and enums of lib/l3kv.h (the wire's
numbers), the results calls return, the arguments attach() takes, and
L3kvError. Standard library only, no ctypes: what an engine builds and
reads, apart from the C layer (l3kv.clib) and the connection (l3kv.client)."""

import dataclasses
import enum
from typing import Optional, Tuple

# Constants of lib/l3kv.h.
HASH_LEN = 32
SLOT_NONE = 0xFFFFFFFF
PAGES_MAX = 65536
POOLS_MAX = 8
REGIONS_MAX = 64
LIVE_MAX = 65536
HANDLE_LEN = 64
REGION_NONE = 0xFFFF    # no state region, no event region (l3kv_restore_args)
DEVICE_ANY = -1         # l3kv_set_device: no device claim, the daemon takes the memory's
SPIN_AUTO = 0xFFFFFFFF   # l3kv_set_spin: spin only around a reply's expected time (default)
RESTORE_RELEASE = 0x0001    # l3kv_restore_args.flags: the lease ends when RESTORE succeeds
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
    RELOAD = 24
    LIST = 25
    DEBUG = 240


class ListWhat(enum.IntEnum):
    """What LIST lists (l3kv_list): Client.list() takes these or their names."""
    NAMESPACES = 1
    GROUPS = 2
    LEASES = 3


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
    WRONG_DEVICE = 40   # GPU memory is not on the device claimed


class DebugOp(enum.IntEnum):
    DROP = 1        # remove the object, as if lost
    CORRUPT = 2     # flip a byte of its data



class L3kvError(OSError):
    """A failed call: errno (positive), the daemon's status (0 when the
    failure was found locally) and the error text."""

    def __init__(self, errno: int, status: int = 0, message: str = ""):
        if not message:
            from .clib import strerror  # the C library's text; clib imports this module
            message = strerror(errno)
        super().__init__(errno, message)
        self.status = status
        self.message = message

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
    """device: the daemon's device index the GPU memory claimed (None: no
    claim, the daemon took the device the memory is on; always None for
    host memory)."""
    fingerprint: bytes
    ns: str
    session: int
    lease_ttl_ms: int
    group_members: int
    device: Optional[int] = None


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
    l3kv.torch.event_region()); it takes a region index like memory does.

    GPU memory's device claim (Client.attach() sends it): device, the
    daemon's device index, when set; else the daemon's index of the GPU
    whose UUID is gpu_uuid (as HEALTH's device_uuids lists it; the UUID
    is the same in every process, an index is not); else none, and the
    daemon takes the device the memory is on."""
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
    device: Optional[int] = None    # GPU memory: the daemon's device index it claims
    gpu_uuid: str = ""              # GPU memory: its GPU's UUID ("GPU-..."), to find that index

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
