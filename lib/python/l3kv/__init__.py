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

The package: l3kv.values (constants, enums, results, arguments,
L3kvError), l3kv.clib (the ctypes layer and the library loader),
l3kv.client (Client); every public name is here too. l3kv.torch
registers torch CUDA tensors; l3kv.sglang is SGLang's HiCache L3 backend.
"""

__all__ = [
    "Attention", "AdmitResult", "AttachInfo", "Caps", "Client", "Completion", "Decline",
    "DebugOp", "HitPolicy", "HostLayout", "L3kvError", "Layout", "ListWhat", "MemKind", "Op",
    "Pool", "PoolKind", "Prefetch", "ProbeResult", "PublishResult", "Region", "RestoreResult",
    "ServerInfo", "StateDest", "Status", "Write", "default_socket", "has_restore_with",
    "library_path", "strerror", "version",
    "HASH_LEN", "SLOT_NONE", "PAGES_MAX", "REGION_NONE", "RESTORE_RELEASE", "TIMEOUT_DEFAULT",
    "TIMEOUT_INFINITE", "DEVICE_ANY", "SPIN_AUTO",
]

from .values import *  # noqa: F401,F403
from .values import (DEFAULT_TIMEOUT_MS, HANDLE_LEN, LIVE_MAX, POOLS_MAX,  # noqa: F401
                     REGIONS_MAX)
from .clib import (_CAdmitArgs, _CAdmitResult, _CAttachArgs, _CAttachInfo,  # noqa: F401
                   _CCompletion, _CLayout, _CPool, _CPublishPage, _CPublishResult,
                   _CRegion, _CRestoreArgs, _CRestoreResult, _CServerInfo, _CStateDest,
                   _address, _fileno, _find_library, _hash32, _hashes, _load, _pages,
                   _probe_decode, _publish_pages, _region16, _repo_library, _restore_args,
                   _state_dest, _tensor_buffer, _text, _uint, default_socket,
                   has_restore_with, library_path, strerror, version)
from .clib import _K, _OPTIONAL, _P, _SIGNATURES  # noqa: F401
from .client import Client  # noqa: F401
