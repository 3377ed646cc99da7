#!/usr/bin/env python3
"""l3kv.torch without a GPU (and without torch): the region geometry of
strided tensors, the CUDA IPC handle torch exports, the per-layer form,
what is refused and why; the CUDA event region; the struct
l3kv_restore_args binding. Every geometry is checked byte for byte
against the strided addressing it must reproduce.

Fake tensors stand in for torch's (l3kv.torch only asks a tensor for
shape, stride(), element_size(), storage_offset(), device and
untyped_storage()); where torch is installed, real CPU tensors are checked
too. Standard library only.

Run from the repository root:  python3 tests/python/test_torch_geometry.py
"""

import collections
import ctypes
import errno
import itertools
import sys
import threading
import unittest
from unittest import mock

import l3kvd_process  # noqa: F401  (first: it points sys.path and L3KV_LIB at the build)
import l3kv  # noqa: E402
import l3kv.torch as lt  # noqa: E402
from l3kv import HostLayout, L3kvError, MemKind, Region  # noqa: E402

try:
    import torch as real_torch
except ImportError:
    real_torch = None

HANDLE = bytes(range(1, 65))            # a cudaIpcMemHandle_t, never zero


def packed(shape):
    """Row-major strides, in elements."""
    st, n = [], 1
    for d in reversed(shape):
        st.append(n)
        n *= d
    return tuple(reversed(st))


def addresses(layout, shape, stride, elem, page_tokens=None):
    """{(page, layer, token): [byte address of each byte of the token]} by
    plain strided addressing, the truth a Geometry must reproduce."""
    ndims = (2 if page_tokens else 3)
    out = {}
    for idx in itertools.product(*(range(n) for n in shape[:ndims])):
        base = sum(i * s for i, s in zip(idx, stride)) * elem
        tok = []
        for rest in itertools.product(*(range(n) for n in shape[ndims:])):
            a = base + sum(i * s for i, s in zip(rest, stride[ndims:])) * elem
            tok.extend(range(a, a + elem))
        if page_tokens:
            if layout == "layer_first":
                layer, row = idx
            else:
                row, layer = idx
            key = (row // page_tokens, layer, row % page_tokens)
        elif layout == "layer_first":
            key = (idx[1], idx[0], idx[2])
        elif layout == "page_first":
            key = (idx[0], idx[2], idx[1])
        else:
            key = (idx[0], idx[1], idx[2])
        out[key] = tok
    return out


class FakeDevice:
    def __init__(self, type_, index=0):
        self.type = type_
        self.index = index

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __str__(self):
        return self.type if self.type == "cpu" else "%s:%d" % (self.type, self.index)


class FakeStorage:
    """One storage of `nbytes` at byte `offset` of a caching-allocator block."""

    def __init__(self, ptr, nbytes, offset, handle):
        self.ptr, self.nbytes, self.offset, self.handle = ptr, nbytes, offset, handle
        self.shared = 0

    def data_ptr(self):
        return self.ptr

    def _share_cuda_(self):
        self.shared += 1
        return (0, self.handle, self.nbytes, self.offset, b"/torch_ref", 0, bytes(64), True)


class FakeTensor:
    """A strided view: what l3kv.torch asks of a torch tensor."""

    layout = "torch.strided"
    is_sparse = False

    def __init__(self, storage, shape, stride=None, offset=0, elem=2, device="cuda"):
        self.storage = storage
        self.shape = tuple(shape)
        self._stride = tuple(stride) if stride is not None else packed(shape)
        self._offset = offset
        self._elem = elem
        self.device = FakeDevice(device)

    def stride(self):
        return self._stride

    def element_size(self):
        return self._elem

    def storage_offset(self):
        return self._offset

    def untyped_storage(self):
        return self.storage

    def select0(self, i):
        """t[i] (unbind's pieces)."""
        return FakeTensor(self.storage, self.shape[1:], self._stride[1:],
                          self._offset + i * self._stride[0], self._elem, self.device.type)


def storage(nbytes, offset=4096, handle=b"\x02c" + HANDLE):
    return FakeStorage(0x7f0000000000 + offset, nbytes, offset, handle)


class GeometryTest(unittest.TestCase):

    def check_addresses(self, layout, shape, stride, elem, page_tokens=None):
        """The geometry puts every byte where strided addressing does."""
        g = lt.kv_geometry(layout, shape, stride, elem, page_tokens)
        want = addresses(layout, shape, stride, elem, page_tokens)
        self.assertEqual(len(want), g.num_pages * g.layers * g.page_tokens)
        seen = set()
        for (p, ly, t), tok in want.items():
            a = p * g.page_stride + ly * g.layer_stride + t * g.token_stride
            self.assertEqual(tok, list(range(a, a + g.token_bytes)), (p, ly, t))
            seen.update(tok)
        self.assertEqual(len(seen), len(want) * g.token_bytes, "bytes shared")
        self.assertEqual(g.span, max(seen) + 1)
        return g

    def test_layer_first_packed(self):
        g = self.check_addresses("layer_first", (3, 4, 2, 8), packed((3, 4, 2, 8)), 2)
        self.assertEqual((g.layout, g.layers, g.num_pages, g.page_tokens, g.token_bytes),
                         (HostLayout.LAYER_FIRST, 3, 4, 2, 16))
        self.assertEqual((g.page_stride, g.layer_stride, g.token_stride), (32, 128, 16))
        self.assertEqual((g.span, g.object_bytes), (3 * 4 * 2 * 16, 3 * 2 * 16))

    def test_layer_first_slice_of_a_larger_tensor(self):
        # big[:, 2:6] of [3, 9, 2, 8]: pages 2..5 of every layer, gaps between layers.
        st = packed((3, 9, 2, 8))
        g = self.check_addresses("layer_first", (3, 4, 2, 8), st, 2)
        self.assertEqual((g.num_pages, g.page_stride, g.layer_stride), (4, 32, 9 * 32))
        self.assertEqual(g.span, 2 * 9 * 32 + 4 * 32)

    def test_page_first_and_page_first_direct(self):
        g = self.check_addresses("page_first", (4, 2, 3, 8), packed((4, 2, 3, 8)), 1)
        self.assertEqual((g.layout, g.num_pages, g.page_tokens, g.layers, g.token_bytes),
                         (HostLayout.PAGE_FIRST, 4, 2, 3, 8))
        self.assertEqual((g.page_stride, g.layer_stride, g.token_stride), (48, 8, 24))
        g = self.check_addresses("page_first_direct", (4, 3, 2, 8), packed((4, 3, 2, 8)), 1)
        self.assertEqual((g.layout, g.num_pages, g.page_tokens, g.layers),
                         (HostLayout.PAGE_FIRST_DIRECT, 4, 2, 3))
        self.assertEqual((g.page_stride, g.layer_stride, g.token_stride), (48, 16, 8))
        # The enum names the layout as well as the string.
        self.assertEqual(lt.kv_geometry(HostLayout.PAGE_FIRST, (4, 2, 3, 8),
                                        packed((4, 2, 3, 8)), 1), g.__class__(
            HostLayout.PAGE_FIRST, 4, 2, 3, 8, 48, 8, 24, 192))

    def test_token_dims_heads_and_none(self):
        # MHA: [layers, pages, tokens, heads, head_dim] in fp32.
        g = self.check_addresses("layer_first", (2, 3, 2, 2, 4), packed((2, 3, 2, 2, 4)), 4)
        self.assertEqual(g.token_bytes, 32)
        # A size-1 token dim with any stride is still packed.
        g = self.check_addresses("layer_first", (2, 3, 2, 1, 4), (24, 8, 4, 999, 1), 4)
        self.assertEqual(g.token_bytes, 16)
        # No token dims: one element per token.
        g = self.check_addresses("page_first", (3, 4, 2), packed((3, 4, 2)), 2)
        self.assertEqual((g.token_bytes, g.token_stride, g.layer_stride), (2, 4, 2))

    def test_token_rows_split_into_pages(self):
        # sglang-style per-token rows: [layers, pages * page_tokens, 1, dim].
        g = self.check_addresses("layer_first", (2, 12, 1, 8), packed((2, 12, 1, 8)), 2,
                                 page_tokens=4)
        self.assertEqual((g.num_pages, g.page_tokens, g.page_stride, g.token_stride),
                         (3, 4, 64, 16))
        g = self.check_addresses("page_first", (8, 3, 4), packed((8, 3, 4)), 1, page_tokens=2)
        self.assertEqual((g.num_pages, g.page_tokens, g.layers), (4, 2, 3))

    def test_one_page_one_layer_one_token(self):
        g = self.check_addresses("layer_first", (1, 1, 1, 8), (77, 55, 33, 1), 1)
        self.assertEqual((g.num_pages, g.layers, g.page_tokens, g.span), (1, 1, 1, 8))

    def test_token_bytes_must_be_whole_elements_and_match(self):
        shape = (2, 3, 4, 8)
        with self.assertRaisesRegex(ValueError, r"kv: token_bytes 15 is not a whole number "
                                    r"of the dtype's 2-byte elements"):
            lt.kv_geometry("layer_first", shape, packed(shape), 2, token_bytes=15)
        with self.assertRaisesRegex(ValueError, r"16 bytes per token of a layer \(dims \[8\] of "
                                    r"2-byte elements\), not token_bytes 32"):
            lt.kv_geometry("layer_first", shape, packed(shape), 2, token_bytes=32)
        g = lt.kv_geometry("layer_first", shape, packed(shape), 2, token_bytes=16)
        self.assertEqual(g.token_bytes, 16)

    def test_refused_shapes(self):
        cases = [
            (("layer_first", (4, 8), (8, 1), 2),
             r"kv: layer_first wants \[layers, pages, tokens, \.\.\.\]; shape \[4, 8\] has 2 "
             r"dims"),
            (("layer_first", (2, 0, 4, 8), packed((2, 0, 4, 8)), 2),
             r"kv: dim 1 of shape \[2, 0, 4, 8\] is empty"),
            (("layer_first", (2, 3), (3, 1, 1), 2), r"differ in length"),
            (("slots", (2, 3, 4), packed((2, 3, 4)), 2), r"layout 'slots': one of"),
            ((HostLayout.SLOTS, (2, 3, 4), packed((2, 3, 4)), 2),
             r"layout slots: a KV region is layer_first, page_first or page_first_direct"),
            (("layer_first", (2, 3, 4, 8), (96, 32, 8, -1), 2), r"negative stride"),
        ]
        for args, msg in cases:
            with self.assertRaisesRegex(ValueError, msg, msg=str(args)):
                lt.kv_geometry(*args)

    def test_token_dims_must_be_packed(self):
        # [.., heads, dim] transposed to [.., dim, heads]: not one run of bytes.
        shape, st = (2, 3, 4, 8, 2), packed((2, 3, 4, 2, 8))
        st = st[:3] + (1, 8)
        with self.assertRaisesRegex(ValueError, r"kv: the token dims \[8, 2\] \(stride \[1, 8\]\) "
                                    r"are not contiguous: dim 4 has stride 8, packed would be 1"):
            lt.kv_geometry("layer_first", shape, st, 2)
        # Every other token element: a strided slice of the last dim.
        with self.assertRaisesRegex(ValueError, r"dim 3 has stride 2, packed would be 1"):
            lt.kv_geometry("layer_first", (2, 3, 4, 4), (48, 16, 8, 2), 2)

    def test_overlapping_dims(self):
        # expand(): every page the same bytes.
        with self.assertRaisesRegex(ValueError, r"kv: the pages dim \(stride 0 bytes\) overlaps "
                                    r"the 16 bytes inside it"):
            lt.kv_geometry("layer_first", (2, 3, 1, 8), (8, 0, 8, 1), 2)
        # Tokens 8 bytes apart but 16 long.
        with self.assertRaisesRegex(ValueError, r"the tokens dim \(stride 8 bytes\) overlaps"):
            lt.kv_geometry("layer_first", (2, 3, 4, 8), (96, 32, 4, 1), 2)
        # Layers interleaved inside a page's tokens.
        with self.assertRaisesRegex(ValueError, r"the layers dim \(stride 32 bytes\) overlaps "
                                    r"the 64 bytes"):
            lt.kv_geometry("layer_first", (2, 3, 4, 8), (16, 32, 8, 1), 2)

    def test_token_rows_refused(self):
        with self.assertRaisesRegex(ValueError, r"kv: 10 token rows are not whole pages of 4 "
                                    r"tokens; slice the tensor to 8 rows"):
            lt.kv_geometry("layer_first", (2, 10, 8), packed((2, 10, 8)), 2, page_tokens=4)
        with self.assertRaisesRegex(ValueError, r"page_first_direct has layers between"):
            lt.kv_geometry("page_first_direct", (2, 10, 8), packed((2, 10, 8)), 2,
                           page_tokens=2)
        with self.assertRaisesRegex(ValueError, r"kv: page_tokens 0"):
            lt.kv_geometry("layer_first", (2, 10, 8), packed((2, 10, 8)), 2, page_tokens=0)


class RegionTest(unittest.TestCase):

    def test_slice_of_a_larger_tensor(self):
        # big: [3 layers, 9 pages, 2 tokens, 8 bf16] at byte 4096 of its block;
        # kv = big[:, 2:6]: its first byte is 2 pages into the storage.
        s = storage(3 * 9 * 2 * 8 * 2)
        big_st = packed((3, 9, 2, 8))
        kv = FakeTensor(s, (3, 4, 2, 8), big_st, offset=2 * 16)
        r = lt.cuda_ipc_region(kv, pool=1)
        self.assertEqual(s.shared, 1)
        self.assertEqual((r.kind, r.layout, r.fd, r.pool), (MemKind.CUDA_IPC,
                                                            HostLayout.LAYER_FIRST, -1, 1))
        self.assertEqual(r.handle, HANDLE)
        self.assertEqual(r.offset, 4096 + 2 * 32)
        self.assertEqual((r.num_pages, r.page_tokens, r.layers, r.token_bytes), (4, 2, 3, 16))
        self.assertEqual((r.page_stride, r.layer_stride, r.token_stride), (32, 9 * 32, 16))
        self.assertEqual(r.size, 2 * 9 * 32 + 4 * 32)
        # The region ends inside the storage.
        self.assertLessEqual(r.offset - 4096 + r.size, s.nbytes)

    def test_handle_formats(self):
        for h in (HANDLE, b"\x02c" + HANDLE, b"\x03c" + HANDLE):
            r = lt.cuda_ipc_region(FakeTensor(storage(64, handle=h), (1, 1, 1, 32)))
            self.assertEqual(r.handle, HANDLE, h[:2])
        self.assertEqual(lt.ipc_mem_handle(b"\x02c" + HANDLE), HANDLE)
        with self.assertRaisesRegex(ValueError, r"expandable segment.*"
                                    r"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"):
            lt.cuda_ipc_region(FakeTensor(storage(64, handle=b"\x02e" + bytes(40)),
                                          (1, 1, 1, 32)))
        with self.assertRaisesRegex(ValueError, r"torch's storage IPC handle is 65 bytes "
                                    r"\(type byte b'x'\): not a format l3kv knows"):
            lt.ipc_mem_handle(b"\x02x" + HANDLE[:63])

    def test_not_a_cuda_tensor(self):
        t = FakeTensor(storage(64), (1, 1, 1, 32), device="cpu")
        with self.assertRaisesRegex(ValueError, r"kv: a cpu tensor; l3kvd maps GPU memory by "
                                    r"CUDA IPC"):
            lt.cuda_ipc_region(t)
        with self.assertRaisesRegex(TypeError, r"kv: a torch tensor is needed, not bytes"):
            lt.cuda_ipc_region(b"kv")
        t = FakeTensor(storage(64), (1, 1, 1, 32))
        t.layout = "torch.sparse_coo"
        with self.assertRaisesRegex(ValueError, r"kv: a torch.sparse_coo tensor; only dense"):
            lt.cuda_ipc_region(t)

    def test_geometry_errors_reach_the_caller(self):
        s = storage(4096)
        with self.assertRaisesRegex(ValueError, r"token_bytes 3 is not a whole number"):
            lt.cuda_ipc_region(FakeTensor(s, (2, 2, 2, 8)), token_bytes=3)
        self.assertEqual(s.shared, 0, "shared before the geometry was checked")

    def test_past_the_storage(self):
        with self.assertRaisesRegex(ValueError, r"kv: spans bytes 96\.\.160 of a 128-byte "
                                    r"storage"):
            lt.cuda_ipc_region(FakeTensor(storage(128), (2, 2, 2, 8), offset=96, elem=1))

    def test_per_layer_tensors(self):
        # unbind(0) of [4 layers, 9 pages, 2, 8] sliced to pages 1..8.
        s = storage(4 * 9 * 2 * 8 * 2, offset=0)
        big = FakeTensor(s, (4, 8, 2, 8), packed((4, 9, 2, 8)), offset=16)
        layers = [big.select0(i) for i in range(4)]
        r = lt.cuda_ipc_region(layers)
        whole = lt.cuda_ipc_region(big)
        self.assertEqual(r, whole)
        self.assertEqual((r.layers, r.layer_stride, r.offset), (4, 9 * 32, 32))
        # One layer.
        r = lt.cuda_ipc_region(layers[2:3])
        self.assertEqual((r.layers, r.num_pages, r.offset, r.size, r.layer_stride),
                         (1, 8, 32 + 2 * 9 * 32, 256, 256))

    def test_per_layer_tensors_refused(self):
        s = storage(4 * 9 * 2 * 8 * 2, offset=0)
        big = FakeTensor(s, (4, 8, 2, 8), packed((4, 9, 2, 8)), offset=16)
        layers = [big.select0(i) for i in range(4)]
        with self.assertRaisesRegex(ValueError, r"kv\[2\]: layers must lie at one increasing "
                                    r"distance in the storage; element offsets are "
                                    r"\[16, 160, 448, 304\]"):
            lt.cuda_ipc_region([layers[0], layers[1], layers[3], layers[2]])
        with self.assertRaisesRegex(ValueError, r"kv\[1\]: layers must lie at one increasing"):
            lt.cuda_ipc_region([layers[1], layers[0]])
        other = FakeTensor(storage(4096), (8, 2, 8))
        with self.assertRaisesRegex(ValueError, r"kv\[1\]: not in layer 0's storage"):
            lt.cuda_ipc_region([layers[0], other])
        odd = FakeTensor(s, (8, 2, 4), packed((8, 2, 4)), offset=200)
        with self.assertRaisesRegex(ValueError, r"kv\[1\]: shape \[8, 2, 4\]"):
            lt.cuda_ipc_region([layers[0], odd])
        with self.assertRaisesRegex(ValueError, r"a list of per-layer tensors is layer_first, "
                                    r"not page_first"):
            lt.cuda_ipc_region(layers, layout="page_first")
        with self.assertRaisesRegex(ValueError, r"kv: an empty list of layers"):
            lt.cuda_ipc_region([])
        cpu = FakeTensor(s, (8, 2, 8), device="cpu")
        with self.assertRaisesRegex(ValueError, r"kv\[1\]: a cpu tensor"):
            lt.cuda_ipc_region([layers[0], cpu])

    def test_device_claim_and_uuid(self):
        t = FakeTensor(storage(64), (1, 1, 1, 32))
        self.assertIsNone(lt.cuda_ipc_region(t).device)
        self.assertEqual(lt.cuda_ipc_region(t, device=3).device, 3)
        for bad in (-1, 65535, "0", True, 1.5):
            with self.assertRaisesRegex(ValueError, r"kv: device=.* is not a device index of "
                                        r"the daemon"):
                lt.cuda_ipc_region(t, device=bad)
        # The UUID: torch's device properties (printed bare), as nvidia-smi prints it.
        asked = []

        class Props:
            def __init__(self, i):
                self.uuid = "0a1b2c3d-0000-1111-2222-33334444555%d" % i

        class Cuda:
            @staticmethod
            def get_device_properties(i):
                asked.append(i)
                return Props(i)

            @staticmethod
            def current_device():
                return 5

        class Torch:
            cuda = Cuda

            @staticmethod
            def device(name):
                return FakeDevice("cuda", int(name.split(":")[1]))

        with mock.patch.dict(sys.modules, {"torch": Torch}):
            self.assertEqual(lt.device_uuid(FakeDevice("cuda", 1)),
                             "GPU-0a1b2c3d-0000-1111-2222-333344445551")
            self.assertEqual(lt.device_uuid("cuda:2")[-1], "2")
            self.assertEqual(lt.device_uuid(None)[-1], "5")
            t = FakeTensor(storage(64), (1, 1, 1, 32))
            t.device = FakeDevice("cuda", 4)
            self.assertEqual(lt.cuda_ipc_region(t).gpu_uuid,
                             "GPU-0a1b2c3d-0000-1111-2222-333344445554")
            self.assertEqual(asked, [1, 2, 5, 4])
            Props.__init__ = lambda self, i: setattr(self, "uuid", "GPU-abc")
            self.assertEqual(lt.device_uuid(0), "GPU-abc")     # prefixed already: as it is

            class Uuid:                                         # torch's _CUuuid: its bytes
                bytes = list(range(0xf0, 0x100))
            Props.__init__ = lambda self, i: setattr(self, "uuid", Uuid())
            self.assertEqual(lt.device_uuid(0), "GPU-f0f1f2f3-f4f5-f6f7-f8f9-fafbfcfdfeff")

            def broken(i):
                raise RuntimeError("no CUDA")
            Cuda.get_device_properties = staticmethod(broken)
            self.assertEqual(lt.device_uuid(0), "")
        # torch not imported by the caller: no UUID (and torch is not imported here).
        with mock.patch.dict(sys.modules, {"torch": None}):
            self.assertEqual(lt.cuda_ipc_region(FakeTensor(storage(64), (1, 1, 1, 32))).gpu_uuid,
                             "")

    def test_event_region(self):
        class Event:
            def ipc_handle(self):
                return HANDLE
        r = lt.event_region(Event())
        self.assertEqual((r.kind, r.handle, r.fd, r.pool, r.offset, r.size), (
            MemKind.CUDA_EVENT, HANDLE, -1, 0, 0, 0))
        self.assertEqual((r.num_pages, r.page_tokens, r.layers, r.token_bytes, r.page_stride,
                          r.layer_stride, r.token_stride, int(r.layout)), (0,) * 8)
        self.assertEqual(Region.cuda_event(HANDLE), r)
        with self.assertRaisesRegex(ValueError, r"a cudaIpcEventHandle_t is 64 bytes, not 63"):
            Region.cuda_event(HANDLE[:63])


class RestoreArgsTest(unittest.TestCase):
    """struct l3kv_restore_args as lib/l3kv.h declares it."""

    def test_layout_of_the_struct(self):
        a = l3kv._CRestoreArgs
        self.assertEqual(ctypes.sizeof(a), 32)
        self.assertEqual([(f, getattr(a, f).offset) for f, _ in a._fields_], [
            ("lease", 0), ("pages", 8), ("npages", 16), ("region", 20), ("state_region", 22),
            ("state_slot", 24), ("event_region", 28), ("flags", 30)])

    def test_fields(self):
        pages = (ctypes.c_uint32 * 2)(5, 6)
        a = l3kv._restore_args(7, 3, pages, 2, None, None)
        self.assertEqual((a.lease, a.pages, a.npages, a.region, a.state_region, a.state_slot,
                          a.event_region, a.flags), (7, ctypes.addressof(pages), 2, 3, 0xFFFF,
                                                     0xFFFFFFFF, 0xFFFF, 0))
        a = l3kv._restore_args(7, 3, pages, 2, None, None, release=True)
        self.assertEqual(a.flags, l3kv.RESTORE_RELEASE)
        a = l3kv._restore_args(7, 0, None, 0, (1, 9), 2)
        self.assertEqual((a.pages, a.state_region, a.state_slot, a.event_region),
                         (None, 1, 9, 2))
        a = l3kv._restore_args(7, 0, 0x1000, 1, l3kv.StateDest(4, 0), 0)
        self.assertEqual((a.pages, a.state_region, a.state_slot, a.event_region),
                         (0x1000, 4, 0, 0))
        for kw, msg in (((None, 0xFFFF), r"wait_event: 65535 is REGION_NONE"),
                        (((0xFFFF, 1), None), r"state.region: 65535 is REGION_NONE"),
                        ((None, 1 << 16), r"wait_event: 65536 does not fit in 16 bits")):
            with self.assertRaisesRegex(ValueError, msg):
                l3kv._restore_args(1, 0, None, 0, *kw)
        with self.assertRaisesRegex(ValueError, r"region: 70000 does not fit in 16 bits"):
            l3kv._restore_args(1, 70000, None, 0, None, None)

    def test_wait_event_needs_restore_with(self):
        c = l3kv.Client.__new__(l3kv.Client)
        c._lib, c._k = l3kv._load(), None
        c._lock, c._stash = threading.RLock(), collections.deque()
        for call in (lambda: c.restore(1, 0, [0], wait_event=1),
                     lambda: c.submit_restore(1, 0, [0], wait_event=1)):
            with self.assertRaises(L3kvError) as cm:
                call()
            if l3kv.has_restore_with():
                self.assertEqual(cm.exception.errno, errno.ENOTCONN)    # the closed client
            else:
                self.assertEqual(cm.exception.errno, errno.ENOSYS)
                self.assertIn("has no l3kv_", cm.exception.message)


@unittest.skipIf(real_torch is None, "torch is not installed: real tensors not checked")
class RealTorchTest(unittest.TestCase):
    """The same geometry from real (CPU) torch views, by data_ptr()."""

    def test_views_match_data_ptr(self):
        torch = real_torch
        big = torch.zeros(3, 9, 2, 4, 8, dtype=torch.bfloat16)
        cases = [
            ("layer_first", big[:, 2:6], None),
            ("layer_first", big[1:, ::2], None),
            ("page_first", big.permute(1, 2, 0, 3, 4)[3:7], None),
            ("page_first_direct", big.transpose(0, 1)[1:8], None),
            ("layer_first", big[:, 1:7].flatten(1, 2), 3),
        ]
        for layout, kv, pt in cases:
            g = lt.kv_geometry(layout, kv.shape, kv.stride(), kv.element_size(), pt)
            e = kv.element_size()
            for idx in itertools.product(*(range(n) for n in kv.shape[:2 if pt else 3])):
                off = kv[idx].data_ptr() - kv.data_ptr()
                if pt:
                    ly, row = idx
                    p, t = row // pt, row % pt
                elif layout == "layer_first":
                    ly, p, t = idx
                elif layout == "page_first":
                    p, t, ly = idx
                else:
                    p, ly, t = idx
                self.assertEqual(off, p * g.page_stride + ly * g.layer_stride
                                 + t * g.token_stride, (layout, idx))
            self.assertEqual(g.token_bytes, 4 * 8 * e)
        with self.assertRaisesRegex(ValueError, r"overlaps"):
            t = torch.zeros(2, 1, 4, 8).expand(2, 5, 4, 8)
            lt.kv_geometry("layer_first", t.shape, t.stride(), t.element_size())
        with self.assertRaisesRegex(ValueError, r"not contiguous"):
            t = big[..., ::2]
            lt.kv_geometry("layer_first", t.shape, t.stride(), t.element_size())

    def test_cpu_tensors_are_refused(self):
        with self.assertRaisesRegex(ValueError, r"kv: a cpu tensor"):
            lt.cuda_ipc_region(real_torch.zeros(2, 2, 2, 8))


if __name__ == "__main__":
    unittest.main(verbosity=2)
