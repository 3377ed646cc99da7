"""l3kv.torch: torch CUDA tensors and events as l3kvd registrations.

An engine written with torch keeps its KV cache in CUDA tensors. This
module turns such a tensor into the Region that ATTACH sends (legacy CUDA
IPC: a cudaIpcMemHandle_t of the allocation plus the tensor's offset in
it, and the page geometry from its shape and strides), and a CUDA IPC
event into the region that RESTORE's wait_event names:

    import torch, l3kv, l3kv.torch as lt
    kv = torch.empty(layers, pages, page_tokens, 576, dtype=torch.bfloat16, device="cuda")
    ev = lt.ipc_event()
    c.attach(layout, [Pool("kv", page_tokens * layers * 576 * 2, layers=layers)],
             [lt.cuda_ipc_region(kv, pool=0, layout="layer_first"), lt.event_region(ev)],
             group="engine-0")
    ...
    ev.record(stream)                   # behind the work that must end before it writes
    c.restore(lease, 0, dst, wait_event=1)

The region also names the GPU its memory is on by UUID (gpu_uuid, from
torch.cuda.get_device_properties()), so that Client.attach() claims the
daemon's index of that GPU whatever either process's CUDA_VISIBLE_DEVICES
(device= claims an index of the daemon's explicitly).

torch is imported only by ipc_event(); everything else works on what a
tensor answers (shape, stride(), element_size(), storage_offset(),
untyped_storage(), device) and on torch as the caller imported it (the
UUID), so kv_geometry() needs no torch at all.
"""

import dataclasses
import sys
from typing import Optional, Sequence, Tuple

from . import HANDLE_LEN, HostLayout, MemKind, Region

__all__ = ["Geometry", "cuda_ipc_region", "device_uuid", "event_region", "ipc_event",
           "ipc_mem_handle", "kv_geometry"]

_LAYOUTS = {
    "layer_first": HostLayout.LAYER_FIRST,
    "page_first": HostLayout.PAGE_FIRST,
    "page_first_direct": HostLayout.PAGE_FIRST_DIRECT,
}

# The named dims of each layout, outermost first; any dims after them are
# one token's elements. With page_tokens= the pages and tokens dims are one
# dim of token rows (row p * page_tokens + t is token t of page p).
_DIMS = {
    HostLayout.LAYER_FIRST: ("layers", "pages", "tokens"),
    HostLayout.PAGE_FIRST: ("pages", "tokens", "layers"),
    HostLayout.PAGE_FIRST_DIRECT: ("pages", "layers", "tokens"),
}
_ROW_DIMS = {
    HostLayout.LAYER_FIRST: ("layers", "rows"),
    HostLayout.PAGE_FIRST: ("rows", "layers"),
}

# torch's storage IPC handle (c10's CUDACachingAllocator shareIpcHandle()):
# in current torch a version byte, a type byte, then the payload; in older
# torch the bare 64-byte cudaIpcMemHandle_t.
_SHARE_CUDA_MALLOC = ord("c")           # payload: cudaIpcMemHandle_t of the segment's base
_SHARE_EXPANDABLE = ord("e")            # payload: cuMem handles of an expandable segment


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Page geometry in bytes, as struct l3kv_region has it, relative to
    the first byte of (page 0, layer 0, token 0). span: the bytes from
    there to one past the last byte of the last (page, layer, token); the
    region's size."""
    layout: HostLayout
    num_pages: int
    page_tokens: int
    layers: int
    token_bytes: int
    page_stride: int
    layer_stride: int
    token_stride: int
    span: int

    @property
    def object_bytes(self) -> int:
        """Bytes of one page's object: the pool's object_bytes."""
        return self.page_tokens * self.layers * self.token_bytes


def _layout(layout) -> HostLayout:
    if isinstance(layout, str):
        if layout not in _LAYOUTS:
            raise ValueError("layout %r: one of %s" % (layout, ", ".join(sorted(_LAYOUTS))))
        return _LAYOUTS[layout]
    lo = HostLayout(layout)
    if lo not in _DIMS:
        raise ValueError("layout %s: a KV region is layer_first, page_first or "
                         "page_first_direct" % lo.name.lower())
    return lo


def kv_geometry(layout, shape: Sequence[int], stride: Sequence[int], element_size: int,
                page_tokens: Optional[int] = None, token_bytes: Optional[int] = None,
                what: str = "kv") -> Geometry:
    """The region geometry of a strided tensor: shape and stride in
    elements (tensor.shape, tensor.stride()), element_size in bytes.

    layout names the leading dims:
      layer_first        [layers, pages, tokens, ...]
      page_first         [pages, tokens, layers, ...]
      page_first_direct  [pages, layers, tokens, ...]
    The dims after those hold one token of one layer and must be packed
    (row-major, innermost stride 1); none means one element per token.
    With page_tokens, pages and tokens are one dim of token rows instead:
    layer_first [layers, rows, ...], page_first [rows, layers, ...].
    token_bytes, when given, is checked: a whole number of elements, and
    what the tensor holds per token.

    Raises ValueError, naming `what`, for what a region cannot describe:
    too few dims, an empty dim, token dims that are not packed, dims that
    overlap (a zero stride, as expand() makes).
    """
    lo = _layout(layout)
    shape = tuple(int(n) for n in shape)
    stride = tuple(int(s) for s in stride)
    element_size = int(element_size)
    name = lo.name.lower()
    if len(shape) != len(stride):
        raise ValueError("%s: shape %s and stride %s differ in length" % (what, shape, stride))
    if element_size < 1:
        raise ValueError("%s: element size %d" % (what, element_size))
    if token_bytes is not None and (token_bytes < 1 or token_bytes % element_size):
        raise ValueError("%s: token_bytes %d is not a whole number of the dtype's %d-byte "
                         "elements" % (what, token_bytes, element_size))
    if page_tokens is None:
        dims = _DIMS[lo]
    else:
        if lo not in _ROW_DIMS:
            raise ValueError("%s: page_tokens= splits token rows into pages; page_first_direct "
                             "has layers between pages and tokens" % what)
        if page_tokens < 1:
            raise ValueError("%s: page_tokens %d" % (what, page_tokens))
        dims = _ROW_DIMS[lo]
    if len(shape) < len(dims):
        raise ValueError("%s: %s wants [%s, ...]; shape %s has %d dims" % (
            what, name, ", ".join(dims), list(shape), len(shape)))
    for i, n in enumerate(shape):
        if n < 1:
            raise ValueError("%s: dim %d of shape %s is empty" % (what, i, list(shape)))
    for i, s in enumerate(stride):
        if s < 0:
            raise ValueError("%s: dim %d has a negative stride %d" % (what, i, s))

    # One token of one layer: the trailing dims, packed.
    nb = element_size
    for i in range(len(shape) - 1, len(dims) - 1, -1):
        if shape[i] != 1 and stride[i] * element_size != nb:
            raise ValueError("%s: the token dims %s (stride %s) are not contiguous: dim %d "
                             "has stride %d, packed would be %d" % (
                                 what, list(shape[len(dims):]), list(stride[len(dims):]), i,
                                 stride[i], nb // element_size))
        nb *= shape[i]
    if token_bytes is not None and token_bytes != nb:
        raise ValueError("%s: %d bytes per token of a layer (dims %s of %d-byte elements), "
                         "not token_bytes %d" % (what, nb, list(shape[len(dims):]),
                                                 element_size, token_bytes))

    named = dict(zip(dims, zip(shape, (s * element_size for s in stride))))
    if page_tokens is not None:
        rows, row_stride = named.pop("rows")
        if rows % page_tokens:
            raise ValueError("%s: %d token rows are not whole pages of %d tokens; slice the "
                             "tensor to %d rows" % (what, rows, page_tokens,
                                                    rows - rows % page_tokens))
        named["pages"] = (rows // page_tokens, page_tokens * row_stride)
        named["tokens"] = (page_tokens, row_stride)
    (pages, ps), (layers, ls), (tokens, ts) = named["pages"], named["layers"], named["tokens"]

    # No two (page, layer, token) may share a byte: sorted by stride, each
    # dim must step past everything the smaller ones cover.
    extent = nb
    for st, n, dim in sorted((st, n, dim) for dim, (n, st) in named.items() if n > 1):
        if st < extent:
            raise ValueError("%s: the %s dim (stride %d bytes) overlaps the %d bytes inside "
                             "it: shape %s, stride %s" % (what, dim, st, extent, list(shape),
                                                          list(stride)))
        extent += st * (n - 1)
    return Geometry(lo, pages, tokens, layers, nb, ps, ls, ts, extent)


def ipc_mem_handle(handle: bytes) -> bytes:
    """The cudaIpcMemHandle_t inside the handle torch's _share_cuda_()
    returns (item 1); ValueError for one that has none (an expandable
    segment)."""
    h = bytes(handle)
    if len(h) == HANDLE_LEN:
        return h                        # older torch: the bare handle
    if len(h) == 2 + HANDLE_LEN and h[1] == _SHARE_CUDA_MALLOC:
        return h[2:]
    if len(h) >= 2 and h[1] == _SHARE_EXPANDABLE:
        raise ValueError("the tensor lives in an expandable segment, which has no legacy "
                         "CUDA IPC handle: allocate the KV cache with "
                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    raise ValueError("torch's storage IPC handle is %d bytes (type byte %r): not a format "
                     "l3kv knows" % (len(h), h[1:2]))


def _check_cuda(t, what: str):
    dev = getattr(t, "device", None)
    if dev is None or not hasattr(t, "untyped_storage"):
        raise TypeError("%s: a torch tensor is needed, not %s" % (what, type(t).__name__))
    if getattr(dev, "type", None) != "cuda":
        raise ValueError("%s: a %s tensor; l3kvd maps GPU memory by CUDA IPC, so the KV "
                         "cache must be a CUDA tensor" % (what, dev))
    if getattr(t, "is_sparse", False) or getattr(t, "is_nested", False) or \
            str(getattr(t, "layout", "torch.strided")) != "torch.strided":
        raise ValueError("%s: a %s tensor; only dense strided tensors map"
                         % (what, getattr(t, "layout", "non-strided")))


def _share(t, what: str) -> Tuple[bytes, int, int]:
    """(cudaIpcMemHandle_t, storage size, storage offset in the allocation)."""
    # UntypedStorage._share_cuda_() (torch/csrc/StorageSharing.cpp), as
    # torch.multiprocessing.reductions.reduce_tensor() unpacks it:
    #   0 device index
    #   1 IPC handle of the caching allocator's base block (the whole
    #     cudaMalloc segment the storage was carved from); see ipc_mem_handle()
    #   2 the storage's size in bytes (not the segment's)
    #   3 the storage's byte offset inside that base block
    #   4, 5 the shared ref counter's file and offset, 6, 7 an IPC event
    #     and whether the receiver must wait on it (torch-to-torch only)
    # It moves the storage behind torch's IPC ref counting: the block is
    # not reused by the allocator after the tensor dies (until exit),
    # which keeps a late daemon copy from landing in someone else's tensor.
    try:
        info = t.untyped_storage()._share_cuda_()
    except RuntimeError as e:
        raise ValueError("%s: torch cannot export its storage: %s" % (what, e)) from e
    if info[1] is None:
        raise ValueError("%s: the storage has no memory" % what)
    return ipc_mem_handle(info[1]), int(info[2]), int(info[3])


def device_uuid(device) -> str:
    """The UUID of a torch CUDA device (a torch.device, "cuda:N" or N), as
    nvidia-smi prints it ("GPU-" and 8-4-4-4-12 hex digits), or "" where
    torch is not imported or cannot say. A device ordinal is this process's
    (CUDA_VISIBLE_DEVICES); the UUID is the same in every process."""
    # A real CUDA tensor means torch is imported: never import it here.
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    try:
        if isinstance(device, str):
            device = torch.device(device)
        index = device if device is None or isinstance(device, int) else device.index
        if index is None:
            index = torch.cuda.current_device()
        u = torch.cuda.get_device_properties(int(index)).uuid
        raw = getattr(u, "bytes", None)
        if raw is not None and len(raw) == 16:
            # The 16 bytes, as cudaDeviceProp.uuid has them and nvidia-smi prints them.
            h = bytes(raw).hex()
            return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])
        u = str(u).strip()
    except Exception:   # no CUDA, an old torch without .uuid: no UUID, no claim
        return ""
    if not u:
        return ""
    return u if u.lower().startswith(("gpu-", "mig-")) else "GPU-" + u


def cuda_ipc_region(kv, pool: int = 0, layout="layer_first", page_tokens: Optional[int] = None,
                    token_bytes: Optional[int] = None, device: Optional[int] = None) -> Region:
    """A MemKind.CUDA_IPC Region for GPU memory held by torch.

    kv is one CUDA tensor laid out as kv_geometry() describes (a view or
    slice of a larger tensor is fine: the offset and strides follow it),
    or, for layer_first, a list of per-layer tensors [pages, tokens, ...]
    (or [rows, ...] with page_tokens) that are views of one storage at one
    distance from each other, such as big.unbind(0).

    The region covers exactly the bytes the tensor spans. Keep the tensor
    alive while the connection is attached: the daemon writes into it.
    Its gpu_uuid is the tensor's GPU's (device_uuid()), which
    Client.attach() turns into the daemon's index of that GPU; device=,
    an index of the daemon's (HEALTH device_uuids), claims that instead.
    Raises ValueError (TypeError for a non-tensor) with the reason.
    """
    if isinstance(kv, (list, tuple)):
        geom, base = _layers_geometry(kv, layout, page_tokens, token_bytes)
    else:
        _check_cuda(kv, "kv")
        geom = kv_geometry(layout, kv.shape, kv.stride(), kv.element_size(), page_tokens,
                           token_bytes, "kv")
        base = kv
    handle, storage_bytes, storage_offset = _share(base, "kv")
    start = base.storage_offset() * base.element_size()
    if start + geom.span > storage_bytes:
        raise ValueError("kv: spans bytes %d..%d of a %d-byte storage" % (
            start, start + geom.span, storage_bytes))
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or
                               not 0 <= device <= 65534):
        raise ValueError("kv: device=%r is not a device index of the daemon (0..65534)"
                         % (device,))
    return Region(pool=pool, num_pages=geom.num_pages, page_tokens=geom.page_tokens,
                  layers=geom.layers, token_bytes=geom.token_bytes,
                  page_stride=geom.page_stride, layer_stride=geom.layer_stride,
                  token_stride=geom.token_stride, size=geom.span, fd=-1,
                  offset=storage_offset + start, kind=MemKind.CUDA_IPC, layout=geom.layout,
                  handle=handle, device=device, gpu_uuid=device_uuid(base.device))


def _layers_geometry(tensors, layout, page_tokens, token_bytes):
    """(Geometry, layer 0's tensor) of per-layer views of one storage."""
    if _layout(layout) != HostLayout.LAYER_FIRST:
        raise ValueError("kv: a list of per-layer tensors is layer_first, not %s" % layout)
    if not tensors:
        raise ValueError("kv: an empty list of layers")
    for i, t in enumerate(tensors):
        _check_cuda(t, "kv[%d]" % i)
    t0 = tensors[0]
    elem = t0.element_size()
    shape, stride = tuple(t0.shape), tuple(t0.stride())
    storage = t0.untyped_storage().data_ptr()
    offs = []
    for i, t in enumerate(tensors):
        if (tuple(t.shape), tuple(t.stride()), t.element_size(), t.device) != \
                (shape, stride, elem, t0.device):
            raise ValueError("kv[%d]: shape %s, stride %s, %d-byte elements on %s; layer 0 "
                             "has %s, %s, %d on %s" % (i, list(t.shape), list(t.stride()),
                                                       t.element_size(), t.device, list(shape),
                                                       list(stride), elem, t0.device))
        if t.untyped_storage().data_ptr() != storage:
            raise ValueError("kv[%d]: not in layer 0's storage; per-layer tensors must be "
                             "views of one allocation (e.g. big.unbind(0)), or each needs a "
                             "region of its own" % i)
        offs.append(t.storage_offset())
    if len(offs) > 1:
        step = offs[1] - offs[0]
        for i in range(1, len(offs)):
            if offs[i] - offs[i - 1] != step or step <= 0:
                raise ValueError("kv[%d]: layers must lie at one increasing distance in the "
                                 "storage; element offsets are %s" % (i, offs))
    else:
        # One layer: the stride a [1, ...] tensor of it would have.
        step = kv_geometry(HostLayout.LAYER_FIRST, (1,) + shape, (0,) + stride, elem,
                           page_tokens, token_bytes, "kv").span // elem
    geom = kv_geometry(HostLayout.LAYER_FIRST, (len(tensors),) + shape, (step,) + stride, elem,
                       page_tokens, token_bytes, "kv")
    return geom, t0


def ipc_event(device=None):
    """A new torch.cuda.Event(interprocess=True) (no timing, as CUDA
    requires of IPC events), created on device (None: the current one)."""
    import torch    # only here: the rest of the package runs without torch

    ev = torch.cuda.Event(interprocess=True)
    # torch creates the CUDA event at first use; make it now, on device.
    with torch.cuda.device(device):
        ev.ipc_handle()
    return ev


def event_region(event) -> Region:
    """The CUDA_EVENT Region of an interprocess torch.cuda.Event: its
    64-byte cudaIpcEventHandle_t, no memory. RESTORE with wait_event set to
    this region's index waits, on the GPU, for the event's last record
    made before the RESTORE was sent."""
    return Region.cuda_event(event.ipc_handle())
