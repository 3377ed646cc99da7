"""l3kv's ctypes layer: the C structures of lib/l3kv.h field for field,
the loader of libl3kv.so and the signatures it declares, and the helpers
that turn Python arguments (hashes, page lists, CPU tensors, state
destinations, publish lists) into what the C calls take. l3kv.client is
its one user; tests reach a few of its private names through l3kv.

libl3kv.so is loaded from $L3KV_LIB when set, else from build/libl3kv.so
of the repository this file lives in, else through the system loader."""

import array
import ctypes
import ctypes.util
import errno as _errno
import os
import struct
import threading
from typing import Optional

from .values import *  # noqa: F401,F403 -- constants, enums, results, L3kvError

_U32 = array.array("I")     # page lists go to C as this when its items are 4 bytes

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
        ("flags", ctypes.c_uint16),            # RESTORE_RELEASE, or 0
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
    "l3kv_set_spin": (ctypes.c_int, [_K, ctypes.c_uint]),
    "l3kv_server_info": (ctypes.c_int, [_K, _P(_CServerInfo)]),
    "l3kv_attach": (ctypes.c_int, [_K, _P(_CAttachArgs), _P(_CAttachInfo)]),
    "l3kv_detach": (ctypes.c_int, [_K]),
    "l3kv_stats": (ctypes.c_int, [_K, _P(ctypes.c_void_p)]),
    "l3kv_health": (ctypes.c_int, [_K, _P(ctypes.c_void_p)]),
    "l3kv_reload": (ctypes.c_int, [_K, _P(ctypes.c_void_p)]),
    "l3kv_list": (ctypes.c_int, [_K, ctypes.c_int, ctypes.c_uint, _P(ctypes.c_void_p)]),
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
    "l3kv_set_device": (ctypes.c_int, [_K, ctypes.c_int]),
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
    elif isinstance(hashes, (list, tuple)) and all(type(h) is bytes and len(h) == HASH_LEN
                                                   for h in hashes):
        b = b"".join(hashes)        # the common case, without a copy per hash
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
    if not isinstance(pages, (list, tuple, range, array.array)):
        pages = list(pages)
    if _U32.itemsize == 4:
        # array('I') converts at C speed and refuses what does not fit in 32 bits
        # (OverflowError), and anything but ints (TypeError): those take the
        # slow path below, which names the bad entry.
        try:
            arr = pages if isinstance(pages, array.array) and pages.typecode == "I" else \
                array.array("I", pages)
        except (OverflowError, TypeError, ValueError):
            arr = None
        if arr is not None:
            return (arr.buffer_info()[0] if len(arr) else None), len(arr), arr
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


def _restore_args(lease, region, dst, n, state, wait_event, release=False) -> _CRestoreArgs:
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
    a.flags = RESTORE_RELEASE if release else 0
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
