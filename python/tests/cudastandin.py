"""The CUDA seam (kvmesh.torch.gpu.cuda) for a machine without a GPU, as the
tests that need one use it: CPU tensors are device tensors; page-locking,
copy streams and waits are recorded; an IPC export names the tensor's CPU
storage (one made-up 64-byte handle per storage, offset 0, as torch names
a caching-allocator block), so that layers viewing one allocation share
its handle and differ by their offsets. A node cannot open these handles:
tests that need a node to write "device" memory register the same memory
as shared memory behind the node's back (test_vllm's IPCNode)."""

import contextlib
import hashlib

import torch

from kvmesh.torch import gpu


def storage_ptr(t) -> int:
    """The address of the start of t's storage (not of t's first element)."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr()


class StandIn(gpu.CUDA):
    """The seam's stand-in (module doc). calls lists what was asked of
    CUDA, in order; export_error and wait_error make those calls fail."""

    def __init__(self):
        self.calls = []
        self.export_error = None
        self.wait_error = None
        self.handles = {}  # handle -> the storage address it names

    def is_device(self, t):
        return isinstance(t, torch.Tensor)

    def export(self, t):
        if self.export_error:
            raise self.export_error
        ptr = storage_ptr(t)
        handle = hashlib.sha512(ptr.to_bytes(8, "little")).digest()
        self.handles[handle] = ptr
        return 0, handle, 0

    def pin(self, ptr, nbytes):
        self.calls.append(("pin", ptr, nbytes))
        return True

    def unpin(self, ptr):
        self.calls.append(("unpin", ptr))

    def stream(self, t):
        return "copy stream"

    def copying(self, stream):
        assert stream == "copy stream"
        self.calls.append(("copy",))
        return contextlib.nullcontext()

    def wait(self, stream):
        if self.wait_error:
            raise self.wait_error
        self.calls.append(("wait",))
