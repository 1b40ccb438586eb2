"""CUDA IPC registration (kvmesh.inject.CUDAPagedCache): the handles and
offsets come from torch's storage sharing; what cannot be registered is
refused before anything is sent; what torch cannot export makes staging
"auto" choose host staging. Tensors here are stand-ins with the
torch methods cuda_ipc reads (this machine's torch has no CUDA); a GPU run
registers real ones."""

import pytest

from kvmesh.errors import UsageError
from kvmesh.inject import CUDA_IPC, HOST_STAGING, CacheLayout, CUDAPagedCache, PagedCache, cuda_ipc

LAYOUT = CacheLayout(4, 16, 2, 64, 3)  # bf16: 2 * 4 * 16 * 2 * 64 * 2 = 32 KiB a layer


class Storage:
    def __init__(self, device, handle, offset):
        self.device, self.handle, self.offset = device, handle, offset

    def _share_cuda_(self):
        # (device, handle, size, offset, ref counter handle, ref counter
        # offset, event handle, event sync required), as torch answers.
        return self.device, self.handle, 1 << 20, self.offset, b"", 0, b"", False


class Tensor:
    def __init__(self, nbytes=LAYOUT.layer_bytes, device=0, handle=b"h" * 64, offset=0, elem_offset=0,
                 cuda=True, contiguous=True):
        self.is_cuda, self._contiguous = cuda, contiguous
        self._n, self._elem_offset = nbytes // 2, elem_offset
        self._storage = Storage(device, handle, offset)

    def is_contiguous(self):
        return self._contiguous

    def numel(self):
        return self._n

    def element_size(self):
        return 2

    def storage_offset(self):
        return self._elem_offset

    def untyped_storage(self):
        return self._storage


def test_cuda_ipc_handles_and_offsets():
    a, b = b"a" * 64, b"b" * 64
    layers = [Tensor(handle=a, offset=0), Tensor(handle=a, offset=0, elem_offset=LAYOUT.layer_bytes // 2),
              Tensor(handle=b, offset=4096)]
    device, handles, offsets = cuda_ipc(layers, LAYOUT)
    assert device == 0
    assert handles == [a, a, b]
    assert offsets == [0, LAYOUT.layer_bytes, 4096]
    cache = PagedCache.cuda(layers, LAYOUT)
    assert isinstance(cache, CUDAPagedCache)
    assert (cache.layers, cache.device, cache.ipc_handles, cache.offsets) == (3, 0, handles, offsets)
    assert cache.layer(2) is layers[2]


@pytest.mark.parametrize("version", [2, 3])
def test_cuda_ipc_versioned_handles(version):
    """torch 2.2 and later give a version byte and a type byte before a
    cudaMalloc block's cudaIpcMemHandle_t ('c'); the node gets the 64-byte
    handle alone."""
    a, b = bytes(range(64)), bytes(range(64, 128))
    layers = [Tensor(handle=bytes([version]) + b"c" + a), Tensor(handle=bytes([version]) + b"c" + b, offset=4096)]
    device, handles, offsets = cuda_ipc(layers, LAYOUT)
    assert (device, handles, offsets) == (0, [a, b], [0, 4096])
    assert PagedCache.cuda(layers, LAYOUT).transport == CUDA_IPC


@pytest.mark.parametrize("layers, why", [
    ([], "no layers"),
    ([Tensor(cuda=False)], "shared memory"),
    ([Tensor(contiguous=False)], "contiguous"),
    ([Tensor(nbytes=1024)], "the layout needs"),
])
@pytest.mark.parametrize("staging", ["auto", "never", "always"])
def test_cuda_cache_refusals(layers, why, staging):
    """Layers that cannot be a GPU cache are refused whatever the path."""
    with pytest.raises(UsageError, match=why):
        CUDAPagedCache(layers, LAYOUT, staging)


@pytest.mark.parametrize("layers, why", [
    ([Tensor(offset=32)], "alignment"),
    ([Tensor(handle=b"x" * 8)], "8-byte shareable handle"),
    ([Tensor(handle=b"\x02e" + b"x" * 80)], "expandable segment"),
    ([Tensor(handle=b"\x02c" + b"x" * 63)], "65-byte shareable handle"),
    ([Tensor(device=0), Tensor(device=1)], "one GPU"),
])
def test_cuda_ipc_refusals(layers, why):
    """What cannot be exported by CUDA IPC is refused with staging "never",
    and makes "auto" choose host staging, saying why (the staging itself
    is made only when the cache is registered)."""
    with pytest.raises(UsageError, match=why):
        cuda_ipc(layers, LAYOUT)
    with pytest.raises(UsageError, match=why):
        CUDAPagedCache(layers, LAYOUT, "never")
    cache = PagedCache.cuda(layers, LAYOUT)
    assert cache.transport == HOST_STAGING and why in cache.fallback_reason
    assert cache.ipc_handles == [] and cache._host is None


def test_staging_choices():
    layers = [Tensor()]
    ipc = PagedCache.cuda(layers, LAYOUT)
    assert (ipc.staging, ipc.transport, ipc.fallback_reason) == ("auto", CUDA_IPC, None)
    always = PagedCache.cuda(layers, LAYOUT, staging="always")
    assert (always.transport, always.fallback_reason, always.ipc_handles) == (HOST_STAGING, None, [])
    for bad in ("sometimes", None, True):
        with pytest.raises(UsageError, match="staging"):
            PagedCache.cuda(layers, LAYOUT, staging=bad)
    with pytest.raises(UsageError, match="one torch CUDA tensor per layer"):
        PagedCache.cuda(Tensor(), LAYOUT)


_CHILD = """
import sys
import numpy as np
import cupy
handle, offset, n, device = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cupy.cuda.Device(device).use()
p = cupy.cuda.runtime.ipcOpenMemHandle(handle)
out = np.zeros(n // 4, dtype=np.int32)
cupy.cuda.runtime.memcpy(out.ctypes.data, p + offset, n, cupy.cuda.runtime.memcpyDeviceToHost)
cupy.cuda.runtime.ipcCloseMemHandle(p)
print(int(out[0]), int(out[-1]), int((out == np.arange(out[0], out[0] + out.size, dtype=np.int32)).all()))
"""


def _have_cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _have_cuda(), reason="needs torch with CUDA (the GPU run)")
def test_real_export_opens_in_another_process():
    """The seam's export of a real CUDA tensor (a view inside a caching-
    allocator block): the 64-byte handle and the byte offset cuda_ipc sends
    name the view's bytes in another process (cupy there, as the node's
    cuIpcOpenMemHandle), on the device's own torch."""
    import subprocess
    import sys

    import torch
    pytest.importorskip("cupy")
    from kvmesh.torch import gpu
    raw = torch.arange(3 * 4096, dtype=torch.int32, device="cuda")
    view = raw[4096:8192]
    device, handle, offset = gpu.CUDA().export(view)
    offset += view.storage_offset() * view.element_size()
    print(f"torch {torch.__version__}: shareable handle of "
          f"{len(bytes(view.untyped_storage()._share_cuda_()[1]))} bytes, offset {offset}")
    assert len(handle) == 64
    torch.cuda.synchronize()
    r = subprocess.run([sys.executable, "-c", _CHILD, handle.hex(), str(offset), str(4096 * 4), str(device)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4096", "8191", "1"], r.stdout
