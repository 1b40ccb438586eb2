"""Exactness of un-rotating cached keys (the alternative to capturing
pre-RoPE keys when an engine only keeps post-RoPE keys, as vLLM does;
docs/VLLM.md quotes the numbers this prints): post-RoPE keys in the cache
dtype are rotated back, stored, and rotated again at injection."""

import pytest

torch = pytest.importorskip("torch")

from kvmesh.torch.examples import rope_tables, rotate  # noqa: E402


def unrotate(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c + b * s, b * c - a * s], dim=-1)


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-6), (torch.float16, 1e-3), (torch.bfloat16, 1e-2)])
def test_unrotate_roundtrip(dtype, bound):
    torch.manual_seed(0)
    T, H, D = 2048, 8, 128
    cos, sin = rope_tables(D, 500000.0, T)
    k = (torch.randn(T, H, D) * torch.exp(0.5 * torch.randn(1, H, D))).to(dtype)
    cached = rotate(k.float(), cos, sin).to(dtype)  # what the engine's cache holds
    pre = unrotate(cached.float(), cos, sin).to(dtype)  # what kvmesh would store
    again = rotate(pre.float(), cos, sin).to(dtype)  # what injection writes back
    exact = (again == cached).float().mean().item()
    err = ((again.float() - cached.float()).abs().max() / cached.float().abs().max()).item()
    print(f"{dtype}: pre-RoPE recovered bit-exact {(pre == k).float().mean().item():.1%}, "
          f"re-rotated keys bit-exact {exact:.1%}, max error / max |k| {err:.2e}")
    assert err < bound
