"""tiled.ops as torch.library custom ops (`torch.ops.tiled.<name>`), each with a fake
(meta) implementation, so that torch.compile(fullgraph=True, dynamic=True) traces through them
and CUDA graphs capture them (after one eager call has compiled the kernel). Registered once,
when tiled.ops is imported with torch installed."""

from __future__ import annotations

import torch

import tiled.ops as ops

Tensor = torch.Tensor


@torch.library.custom_op("tiled::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return ops.rms_norm(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("tiled::fused_add_rms_norm", mutates_args=("x", "residual"))
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> None:
    ops.fused_add_rms_norm(x, residual, weight, eps)


@fused_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return None


@torch.library.custom_op("tiled::layer_norm", mutates_args=())
def layer_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float) -> Tensor:
    return ops.layer_norm(x, weight, bias, eps)


@layer_norm.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _gated_fake(x):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.custom_op("tiled::silu_and_mul", mutates_args=())
def silu_and_mul(x: Tensor) -> Tensor:
    return ops.silu_and_mul(x)


@silu_and_mul.register_fake
def _(x):
    return _gated_fake(x)


@torch.library.custom_op("tiled::gelu_and_mul", mutates_args=())
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    return ops.gelu_and_mul(x, approximate)


@gelu_and_mul.register_fake
def _(x, approximate="none"):
    return _gated_fake(x)


@torch.library.custom_op("tiled::softmax", mutates_args=())
def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return ops.softmax(x, dim)


@softmax.register_fake
def _(x, dim=-1):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("tiled::rotary_embedding", mutates_args=("query", "key"))
def rotary_embedding(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                     cos_sin_cache: Tensor, is_neox: bool) -> None:
    ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


@rotary_embedding.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None


@torch.library.custom_op("tiled::linear", mutates_args=())
def linear(x: Tensor, w: Tensor, bias: Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> Tensor:
    return ops.linear(x, w, bias, out_dtype)


@linear.register_fake
def _(x, w, bias=None, out_dtype=None):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype or x.dtype)


@torch.library.custom_op("tiled::quantize_fp8", mutates_args=())
def quantize_fp8(x: Tensor, block: int | None = 128) -> tuple[Tensor, Tensor]:
    return ops.quantize_fp8(x, block)


@quantize_fp8.register_fake
def _(x, block=128):
    scales = (1,) if block is None else (*x.shape[:-1], x.shape[-1] // block)
    return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
            x.new_empty(scales, dtype=torch.float32))


@torch.library.custom_op("tiled::fp8_linear", mutates_args=())
def fp8_linear(x: Tensor, w: Tensor, x_scale: Tensor, w_scale: Tensor,
               bias: Tensor | None = None, out_dtype: torch.dtype | None = None) -> Tensor:
    return ops.fp8_linear(x, w, x_scale, w_scale, bias, out_dtype)


@fp8_linear.register_fake
def _(x, w, x_scale, w_scale, bias=None, out_dtype=None):
    return x.new_empty((*x.shape[:-1], w.shape[0]), dtype=out_dtype or torch.bfloat16)


@torch.library.custom_op("tiled::grouped_linear", mutates_args=())
def grouped_linear(x: Tensor, w: Tensor, expert_offsets: Tensor) -> Tensor:
    return ops.grouped_linear(x, w, expert_offsets)


@grouped_linear.register_fake
def _(x, w, expert_offsets):
    return x.new_empty((x.shape[0], w.shape[1]))


@torch.library.custom_op("tiled::matmul", mutates_args=())
def matmul(a: Tensor, b: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    return ops.matmul(a, b, out_dtype)


@matmul.register_fake
def _(a, b, out_dtype=None):
    return a.new_empty((*a.shape[:-1], b.shape[1]), dtype=out_dtype or a.dtype)


@torch.library.custom_op("tiled::paged_attention", mutates_args=())
def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                    seq_lens: Tensor, scale: float | None = None,
                    k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> Tensor:
    return ops.paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, k_scale,
                               v_scale)


@paged_attention.register_fake
def _(q, k_cache, v_cache, block_tables, seq_lens, scale=None, k_scale=None, v_scale=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("tiled::linear_w4a16", mutates_args=())
def linear_w4a16(x: Tensor, qweight: Tensor, scales: Tensor, zeros: Tensor | None = None,
                 group_size: int = 128, layout: str = "gptq") -> Tensor:
    return ops.linear_w4a16(x, qweight, scales, zeros, group_size, layout)


@linear_w4a16.register_fake
def _(x, qweight, scales, zeros=None, group_size=128, layout="gptq"):
    return x.new_empty((*x.shape[:-1], qweight.shape[1]))


@torch.library.custom_op("tiled::linear_w8a16", mutates_args=())
def linear_w8a16(x: Tensor, qweight: Tensor, scales: Tensor) -> Tensor:
    return ops.linear_w8a16(x, qweight, scales)


@linear_w8a16.register_fake
def _(x, qweight, scales):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


@torch.library.custom_op("tiled::mla_decode", mutates_args=())
def mla_decode(q: Tensor, kv_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
               head_dim_v: int = 512, scale: float | None = None) -> Tensor:
    return ops.mla_decode(q, kv_cache, block_tables, seq_lens, head_dim_v, scale)


@mla_decode.register_fake
def _(q, kv_cache, block_tables, seq_lens, head_dim_v=512, scale=None):
    return q.new_empty((*q.shape[:3], head_dim_v))


@torch.library.custom_op("tiled::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
              cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
              window: int | None = None, softcap: float | None = None,
              scale: float | None = None, layout: str = "bshd",
              max_seqlen_q: int | None = None) -> Tensor:
    return ops.attention(q, k, v, causal, cu_seqlens_q, cu_seqlens_k, window, softcap, scale,
                         False, layout, max_seqlen_q)


@attention.register_fake
def _(q, k, v, causal=False, cu_seqlens_q=None, cu_seqlens_k=None, window=None, softcap=None,
      scale=None, layout="bshd", max_seqlen_q=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("tiled::conv2d", mutates_args=())
def conv2d(x: Tensor, w: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0,
           dilation: int = 1) -> Tensor:
    return ops.conv2d(x, w, bias, stride, padding, dilation)


@conv2d.register_fake
def _(x, w, bias=None, stride=1, padding=0, dilation=1):
    def size(n, k):
        return (n + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    N, _, H, W = x.shape
    F, _, R, S = w.shape
    return x.new_empty((N, F, size(H, R), size(W, S))).to(memory_format=torch.channels_last)
