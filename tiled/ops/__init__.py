"""`tiled.ops`: the serving kernels, written in the DSL (tiled.ops.kernels), as plain functions
over torch tensors with vLLM's argument conventions:

    rms_norm(x, weight, eps)                  -> out
    fused_add_rms_norm(x, residual, weight, eps)   in place: residual += x; x = rms_norm(residual)
    layer_norm(x, weight, bias, eps)          -> out (weight / bias may be None)
    silu_and_mul(x)                           -> silu(x[..., :d]) * x[..., d:]
    gelu_and_mul(x, approximate="none")       -> gelu(x[..., :d]) * x[..., d:] ("tanh" too)
    softmax(x, dim=-1)                        -> out
    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)   in place
    linear(x, w, bias=None, out_dtype=None)   -> x @ w.T, autotuned (tiled.ops.gemm)
    matmul(a, b, out_dtype=None)              -> a @ b (b 2-D [K, N]), autotuned
    quantize_fp8(x, block=128)                -> (e4m3 q, float32 scales) (tiled.ops.fp8)
    fp8_linear(x, w, x_scale, w_scale, bias=None, out_dtype=None)   scaled e4m3 GEMM
    grouped_linear(x, w, expert_offsets)      -> MoE experts' x @ w[e].T in one launch
    attention(q, k, v, causal=False, cu_seqlens_q=None, cu_seqlens_k=None, window=None,
              softcap=None, scale=None, return_lse=False)   prefill attention (tiled.ops.prefill)
    paged_attention(q, k_cache, v_cache, block_tables, seq_lens, scale=None, k_scale=None,
                    v_scale=None)            -> decode attention over vLLM's paged KV cache
    mla_decode(q, kv_cache, block_tables, seq_lens, head_dim_v=512, scale=None)
                                              -> DeepSeek MLA decode, FlashMLA's layout
    linear_w4a16(x, qweight, scales, zeros=None, group_size=128, layout="gptq")
                                              -> GPTQ 4-bit weights (layout="mma": qweight
                                                 from repack_w4a16, once at load time)
    conv2d(x, w, bias=None, stride=1, padding=0, dilation=1)   implicit-GEMM F.conv2d
    linear_w8a16(x, qweight, scales)          -> int8 weights, per-channel scales

Each op compiles its kernel on the first call for a (hidden size, dtype, device) and keeps it
(the token count is symbolic: one compile serves every batch), through `tiled.compile`, so the
daemon when TILED_SERVER is set, else this process with the kernel cache. CUDA tensors run on
the local GPU, on torch's current stream; CPU tensors through the cpu target. Inside a CUDA
graph capture nothing compiles: an op whose kernel is not compiled yet raises (call it once
before capturing). Importing tiled.ops also registers each op as `torch.ops.tiled.<name>`
(tiled.ops.torch_lib). Never imports TVM.
"""

from __future__ import annotations

import threading

from tiled.ops import kernels as _k
from tiled.runtime.cpu_levels import is_cpu_target
from tiled.runtime.telemetry import count_launch

_KERNELS: dict[tuple, object] = {}
_FACTORIES = {"rms_norm": _k.rms_norm, "fused_add_rms_norm": _k.fused_add_rms_norm,
              "layer_norm": _k.layer_norm, "gated_activation": _k.gated_activation,
              "softmax": _k.softmax, "rotary_embedding": _k.rotary,
              "splitk_sum": _k.splitk_sum}
_LOCK = threading.Lock()
_DTYPES = ("float16", "bfloat16", "float32")


def _dtype(t, op: str) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"tiled.ops.{op}: dtype {name} is not supported (one of "
                        f"{', '.join(_DTYPES)})")
    return name


def _target(t) -> str:
    if t.device.type == "cpu":
        return "cpu"
    if t.device.type == "cuda":
        from tiled.jit import _local_cuda_target

        return _local_cuda_target(t)
    raise TypeError(f"tiled.ops: tensors on {t.device} are not supported (cpu or cuda)")


def _capturing(t) -> bool:
    if t.device.type != "cuda":
        return False
    import torch

    return torch.cuda.is_current_stream_capturing()


def _kernel(op: str, like, **params):
    """The compiled kernel of factory(**params) for `like`'s device, compiled once (or the
    one `install` gave for it)."""
    target = _target(like)
    count_launch(op, target)  # the caller launches what this returns
    key = _key(op, target, params)
    k = _KERNELS.get(key)
    if k is not None:
        return k
    if _capturing(like):
        raise RuntimeError(f"tiled.ops.{op}: its kernel for {params} is not compiled yet and "
                           "a CUDA graph is being captured; call the op once before capturing")
    import tiled

    compiled = tiled.compile(kernel_factory(op, target, **params), target=target)
    with _LOCK:
        return _KERNELS.setdefault(key, compiled)


def _key(op: str, target: str, params: dict) -> tuple:
    return op, target, tuple(sorted(params.items()))


def _launch_config(op: str, target: str, N: int | None = None, dtype: str | None = None,
                   **_) -> dict:
    """Rows per block and threads. CPU: four rows per block. CUDA: one row per block of 128
    threads, except where the H200 measured better (benchmarks/results/ops_sweep_h200.json,
    against a 4.2 TB/s streaming reference): rms_norm / fused_add_rms_norm take 256 threads
    at N = 4096 (multiples of 2048) and 512 at N = 8192 (multiples of 4096) — rms_norm 85% /
    90% of the reference at M = 4096 where 128 threads read 74% / 80%; float32 softmax over
    4096 columns (multiples of 2048) takes 512 threads, 80% / 86% at M = 4096 / 32768 against
    69% / 77% with 128 (its normalization a multiply by the row's reciprocal:
    benchmarks/results/ops_sweep_h200.json; a division per element read 71% / 75% at 512).
    layer_norm takes 256 threads at N = 4096 and 8192 (multiples of 2048): on an H100,
    bf16, 88% / 92% of the copy at M = 4096 where 128 threads read 86% / 91%, and as much at
    32768 (benchmarks/results/ops_sweep_ln_h100.json; 512 threads read 83% / 88%). Each row
    stays whole rounds of the block (N a multiple of threads x the 16-byte run), so its sums
    are shuffles. gated_activation on CPU: 4096 columns per block, where 1024 (the
    default) made a thread's consecutive blocks 4 KB runs pages apart, which the hardware
    prefetchers follow worst (float32 SiLU-and-mul over 4096 x 4096 on the 2-core Zen 4: 0.82
    of a copy's bandwidth against 0.56, per-round medians, benchmarks/cpu/membound.py's
    method)."""
    if op == "gated_activation" and is_cpu_target(target):
        return {"block_n": 4096}
    if op not in ("rms_norm", "fused_add_rms_norm", "layer_norm", "softmax"):
        return {}
    if is_cpu_target(target):
        return {"blk_m": 4}
    blk_m, threads = 1, 128
    if op in ("rms_norm", "fused_add_rms_norm") and N is not None:
        if N >= 8192 and N % 4096 == 0:
            threads = 512
        elif N >= 4096 and N % 2048 == 0:
            threads = 256
    if op == "layer_norm" and N is not None and N >= 4096 and N % 2048 == 0:
        threads = 256
    if op == "softmax" and dtype == "float32" and N is not None and N >= 4096 and \
            N % 2048 == 0:
        threads = 512
    return {"blk_m": blk_m, "threads": threads}


def _rows(x, op: str):
    """x as a [M, N] view (N: the last dim); raises for a layout that has none."""
    if x.dim() == 0:
        raise ValueError(f"tiled.ops.{op}: x must have at least one dimension")
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        raise ValueError(f"tiled.ops.{op}: x of shape {tuple(x.shape)} and strides "
                         f"{x.stride()} has no [tokens, hidden] view; pass a contiguous "
                         "tensor") from None


def _check_vector(w, n: int, x, op: str, name: str):
    if w.shape != (n,):
        raise ValueError(f"tiled.ops.{op}: {name} has shape {tuple(w.shape)}, expected ({n},)")
    if w.dtype != x.dtype or w.device != x.device:
        raise ValueError(f"tiled.ops.{op}: {name} is {w.dtype} on {w.device}, x is {x.dtype} "
                         f"on {x.device}")
    return w.contiguous()


def rms_norm(x, weight, eps: float = 1e-6):
    """x / sqrt(mean(x^2, -1) + eps) * weight, as F.rms_norm(x, (d,), weight, eps)."""
    x2 = _rows(x.contiguous(), "rms_norm")
    n = x2.shape[1]
    w = _check_vector(weight, n, x, "rms_norm", "weight")
    out = x2.new_empty(x2.shape)
    _kernel("rms_norm", x, N=n, dtype=_dtype(x, "rms_norm"),
            eps=float(eps))(x2, w, out)
    return out.view(x.shape)


def fused_add_rms_norm(x, residual, weight, eps: float = 1e-6) -> None:
    """In place, as vLLM's fused_add_rms_norm: residual += x, then x = rms_norm(residual) *
    weight. Both must be contiguous tensors of one shape and dtype."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"tiled.ops.fused_add_rms_norm: residual is {tuple(residual.shape)} "
                         f"{residual.dtype}, x is {tuple(x.shape)} {x.dtype}")
    if not (x.is_contiguous() and residual.is_contiguous()):
        raise ValueError("tiled.ops.fused_add_rms_norm: x and residual must be contiguous "
                         "(it writes them in place)")
    x2, r2 = _rows(x, "fused_add_rms_norm"), _rows(residual, "fused_add_rms_norm")
    n = x2.shape[1]
    w = _check_vector(weight, n, x, "fused_add_rms_norm", "weight")
    _kernel("fused_add_rms_norm", x, N=n,
            dtype=_dtype(x, "fused_add_rms_norm"), eps=float(eps))(x2, r2, w)


_CONSTANTS: dict[tuple, object] = {}


def _constant_vector(x, n: int, value: float):
    key = (x.device, x.dtype, n, value)
    v = _CONSTANTS.get(key)
    if v is None:
        if _capturing(x):
            raise RuntimeError("tiled.ops.layer_norm: call it once before capturing a graph")
        v = _CONSTANTS.setdefault(key, x.new_full((n,), value))
    return v


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5):
    """F.layer_norm(x, (d,), weight, bias, eps) over the last dim."""
    x2 = _rows(x.contiguous(), "layer_norm")
    n = x2.shape[1]
    affine = weight is not None or bias is not None
    w = _check_vector(weight, n, x, "layer_norm", "weight") if weight is not None else \
        _constant_vector(x, n, 1.0)
    b = _check_vector(bias, n, x, "layer_norm", "bias") if bias is not None else \
        _constant_vector(x, n, 0.0)
    out = x2.new_empty(x2.shape)
    _kernel("layer_norm", x, N=n, dtype=_dtype(x, "layer_norm"),
            eps=float(eps), affine=affine)(x2, w, b, out)
    return out.view(x.shape)


def _gated(x, act: str, op: str):
    x2 = _rows(x.contiguous(), op)
    if x2.shape[1] % 2:
        raise ValueError(f"tiled.ops.{op}: the last dim ({x2.shape[1]}) must be even")
    d = x2.shape[1] // 2
    out = x2.new_empty((x2.shape[0], d))
    _kernel("gated_activation", x, N=d, dtype=_dtype(x, op),
            act=act)(x2, out)
    return out.view(*x.shape[:-1], d)


def silu_and_mul(x):
    """silu(x[..., :d]) * x[..., d:] for x [..., 2d] (vLLM's SiluAndMul)."""
    return _gated(x, "silu", "silu_and_mul")


def gelu_and_mul(x, approximate: str = "none"):
    """gelu(x[..., :d], approximate) * x[..., d:] (vLLM's GeluAndMul): "none" (erf) or
    "tanh"."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"tiled.ops.gelu_and_mul: approximate={approximate!r}, expected "
                         "'none' or 'tanh'")
    return _gated(x, "gelu" if approximate == "none" else "gelu_tanh", "gelu_and_mul")


def softmax(x, dim: int = -1):
    """torch.softmax(x, dim) for the last dim."""
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"tiled.ops.softmax: only the last dim is supported, got dim={dim}")
    x2 = _rows(x.contiguous(), "softmax")
    out = x2.new_empty(x2.shape)
    _kernel("softmax", x, N=x2.shape[1], dtype=_dtype(x, "softmax"))(x2, out)
    return out.view(x.shape)


def rotary_embedding(positions, query, key, head_size: int, cos_sin_cache,
                     is_neox: bool = True) -> None:
    """In place on query [T, heads * head_size] (or [T, heads, head_size]) and key (the same
    with its own head count), as vLLM's rotary_embedding: the first rot_dim =
    cos_sin_cache.shape[1] lanes of each head rotated by positions' angles; cos_sin_cache
    [max_position, rot_dim] holds cos in its first half, sin in its second."""
    op = "rotary_embedding"
    if key is None:
        raise ValueError(f"tiled.ops.{op}: key=None is not supported yet")
    t = positions.numel()
    for name, v in (("query", query), ("key", key)):
        if not v.is_contiguous() or v.numel() % max(1, t * head_size):
            raise ValueError(f"tiled.ops.{op}: {name} of shape {tuple(v.shape)} is not a "
                             f"contiguous [{t}, heads * {head_size}] tensor")
    if query.dtype != key.dtype:
        raise ValueError(f"tiled.ops.{op}: query is {query.dtype}, key {key.dtype}")
    rot_dim = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rot_dim % 2 or rot_dim > head_size:
        raise ValueError(f"tiled.ops.{op}: cos_sin_cache of shape {tuple(cos_sin_cache.shape)} "
                         f"is not [max_position, rot_dim] with an even rot_dim <= {head_size}")
    if t == 0:
        return
    heads, kv_heads = query.numel() // (t * head_size), key.numel() // (t * head_size)
    pos = positions.reshape(t)
    if str(pos.dtype) != "torch.int64":
        pos = pos.long()
    _kernel(op, query, heads=heads, kv_heads=kv_heads, head_size=head_size,
            rot_dim=rot_dim, dtype=_dtype(query, op),
            cache_dtype=_dtype(cos_sin_cache, op), is_neox=bool(is_neox))(
        pos.contiguous(), query.view(t, heads * head_size), key.view(t, kv_heads * head_size),
        cos_sin_cache.contiguous())


def kernel_factory(op: str, target: str, **params):
    """The DSL kernel op `op` compiles for `params` on `target` (with its launch config), for
    building it ahead of time: a bundle for hosts without the compiler, see `install`."""
    if op not in _FACTORIES:
        raise ValueError(f"tiled.ops: no op {op!r} (one of {', '.join(_FACTORIES)})")
    return _FACTORIES[op](**params, **_launch_config(op, target, **params))


def install(op: str, target: str, kernel, **params) -> None:
    """Makes op `op` launch `kernel` (a loaded kernel, e.g. tiled.runtime.load of what
    kernel_factory(op, target, **params) compiled to) for `params` on `target` instead of
    compiling: how a host with neither the compiler nor a daemon runs the ops. Raises
    ValueError when the kernel is not of that program."""
    expected = kernel_factory(op, target, **params).ir.digest
    if kernel.manifest.program_digest != expected:
        raise ValueError(f"tiled.ops.install: the kernel ({kernel.manifest.name}) is not "
                         f"{op} for {params}")
    with _LOCK:
        _KERNELS[_key(op, target, params)] = kernel


def compiled_kernels() -> int:
    """How many kernels the ops hold compiled in this process."""
    return len(_KERNELS)


def _register_torch_ops() -> None:
    """torch.ops.tiled.*, when torch is installed. A torch whose torch.library refuses them
    leaves the plain functions working (a logged warning, not an import error)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    try:
        from tiled.ops import torch_lib  # noqa: F401 - registers torch.ops.tiled.*
    except Exception as e:  # an older or newer torch.library: the functions still work
        import logging

        logging.getLogger(__name__).warning("tiled.ops: torch.ops.tiled.* not registered: %s",
                                            e)


from tiled.ops import fp8 as _fp8  # noqa: E402
from tiled.ops.conv import conv2d  # noqa: E402
from tiled.ops.fp8 import fp8_linear, quantize_fp8  # noqa: E402
from tiled.ops.gemm import linear, matmul  # noqa: E402 - it imports the helpers above
from tiled.ops.grouped import grouped_linear  # noqa: E402
from tiled.ops.mla import mla_decode  # noqa: E402
from tiled.ops.paged import combine_kernel as _paged_combine  # noqa: E402
from tiled.ops.paged import paged_attention  # noqa: E402
from tiled.ops.prefill import attention  # noqa: E402
from tiled.ops.quant import linear_w4a16, linear_w8a16, repack_w4a16  # noqa: E402

_FACTORIES.update({"quantize_fp8_groups": _fp8.quantize_group_kernel,
                   "fp8_absmax": _fp8.absmax_kernel,
                   "quantize_fp8_scaled": _fp8.quantize_scaled_kernel,
                   "paged_combine": _paged_combine})

_register_torch_ops()

__all__ = ["attention", "compiled_kernels", "conv2d", "fp8_linear", "fused_add_rms_norm",
           "gelu_and_mul", "grouped_linear", "install", "kernel_factory", "layer_norm", "linear",
           "linear_w4a16", "linear_w8a16", "matmul", "mla_decode", "paged_attention",
           "quantize_fp8", "repack_w4a16", "rms_norm", "rotary_embedding", "silu_and_mul",
           "softmax"]
