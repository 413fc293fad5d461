"""The layers tiled_sglang gives SGLang (imported by register(), so importing tiled_sglang does
not import SGLang). Each subclasses SGLang's layer and keeps its constructor, weights and
forwards, and adds tiled's kernels as the op's `plugin` kernel backend (SGLang's BaseFusedOp
dispatch, sglang.kernels.fused_op): `forward_plugin` calls torch.ops.tiled.*, put first in the
class's backend priority. A per-call gate (`backend_eligible`) hands what tiled's kernels do
not compute to SGLang's own path (its platform forward, forward_cuda on a GPU, else
forward_native): a residual with a post-residual addition, a fused input quantization, an fp32
residual, rotary offsets or a fused KV-cache store. A call tiled fails on (the daemon
unreachable, no compiled kernel while a CUDA graph is captured) runs SGLang's own path too,
counted and logged once.

SGLang's own switches keep working: SGLANG_FORCE_FUSED_OP_BACKEND=torch runs forward_native
everywhere; a layer pinned to a path at construction (force_native, the aiter paths) keeps it;
under SGLang's torch.compile mode (enter_torch_compile) the layers run forward_native, as
SGLang's own kernels do, so that inductor sees them.

HookRegistry's class REPLACE rebinds every module attribute that is the replaced class (the
`from X import Y` copies), so this module keeps SGLang's originals only inside ORIGINAL.
"""

import importlib
import pkgutil

import torch
from sglang.kernels import fused_op
from sglang.kernels.spec import KernelBackend
from sglang.srt.layers import activation, layernorm
from sglang.srt.layers import rotary_embedding as rope_pkg
from sglang.srt.layers.rotary_embedding import base as rope_base
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

import tiled.ops  # noqa: F401 - registers torch.ops.tiled.*
from tiled_sglang.counters import count, fell_back

ORIGINAL = {"RMSNorm": layernorm.RMSNorm, "SiluAndMul": activation.SiluAndMul,
            "GeluAndMul": activation.GeluAndMul, "RotaryEmbedding": rope_base.RotaryEmbedding}
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
PLUGIN = KernelBackend.PLUGIN


class _Tiled:
    """The plugin backend on top of an SGLang BaseFusedOp class. `tiled_op` names the op in
    the counters; `takes(*args)` says whether tiled's kernel computes the call;
    `forward_tiled(*args)` runs it. Only the exact classes install() built are served: a class
    that SGLang or a model derives from one later may compute something else."""

    tiled_op = ""
    tiled_class = None  # set on each class install() builds

    def backend_eligible(self, backend, *args, **kwargs) -> bool:
        if backend is not PLUGIN:
            return super().backend_eligible(backend, *args, **kwargs)
        ok = type(self) is self.tiled_class and self.takes(*args, **kwargs)
        if not ok and not torch.compiler.is_compiling():
            count(self.tiled_op, "sglang")
        return ok

    def forward_plugin(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # the custom op is traced as it is
            return self.forward_tiled(*args, **kwargs)
        try:
            out = self.forward_tiled(*args, **kwargs)
        except Exception as e:  # any failure of tiled's: SGLang's own path
            fell_back(self.tiled_op, e)
            return self.sglang_forward()(*args, **kwargs)
        count(self.tiled_op, "tiled")
        return out

    def sglang_forward(self):
        """The forward SGLang runs for this layer without the plugin (its platform forward,
        else forward_native)."""
        try:
            method = self._platform_method(fused_op._platform_key())
        except Exception:  # an SGLang whose dispatch internals moved: its reference forward
            method = None
        return method if method is not None else self.forward_native


class _RMSNorm(_Tiled):
    tiled_op = "rms_norm"

    def takes(self, x, residual=None, post_residual_addition=None, quant_linear=None):
        if post_residual_addition is not None or quant_linear is not None or \
                self._quant_linear is not None:
            return False
        if self.variance_size_override is not None or not self.has_weight or \
                self.cast_x_before_out_mul or self.fp32_residual or \
                self.override_orig_dtype not in (None, x.dtype):
            return False
        invariant = getattr(layernorm, "is_batch_invariant_mode_enabled", None)
        if invariant is not None and invariant():
            return False
        if x.dtype not in DTYPES or self.weight.dtype != x.dtype or x.numel() == 0 or \
                x.shape[-1] != self.hidden_size:
            return False
        return residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                    and x.is_contiguous() and residual.is_contiguous())

    def forward_tiled(self, x, residual=None, post_residual_addition=None, quant_linear=None):
        w, eps = self.weight.data, self.variance_epsilon
        if residual is None:
            return torch.ops.tiled.rms_norm(x, w, eps)
        torch.ops.tiled.fused_add_rms_norm(x, residual, w, eps)  # in place, as forward_cuda
        return x, residual


class _SiluAndMul(_Tiled):
    tiled_op = "silu_and_mul"

    def takes(self, x):
        return x.dtype in DTYPES and x.shape[-1] % 2 == 0

    def forward_tiled(self, x):
        return torch.ops.tiled.silu_and_mul(x)


class _GeluAndMul(_Tiled):
    tiled_op = "gelu_and_mul"

    def takes(self, x):
        return self.approximate in ("none", "tanh") and x.dtype in DTYPES and \
            x.shape[-1] % 2 == 0

    def forward_tiled(self, x):
        return torch.ops.tiled.gelu_and_mul(x, self.approximate)


class _Rotary(_Tiled):
    """The rotation of RotaryEmbedding.forward_native, in place on query and key as
    forward_cuda does; a subclass that keeps those forwards differs only in the cos / sin
    cache it computes."""

    tiled_op = "rotary_embedding"

    def takes(self, positions, query, key=None, offsets=None, fused_set_kv_buffer_arg=None):
        if key is None or offsets is not None or fused_set_kv_buffer_arg is not None or \
                self._force_native or hasattr(self, "sin_cos_cache"):
            return False
        return positions.dim() == 1 and query.dtype in DTYPES and key.dtype == query.dtype and \
            query.is_contiguous() and key.is_contiguous() and \
            self.cos_sin_cache.device == query.device

    def forward_tiled(self, positions, query, key=None, offsets=None,
                      fused_set_kv_buffer_arg=None):
        torch.ops.tiled.rotary_embedding(positions, query, key, self.head_size,
                                         self.cos_sin_cache, self.is_neox_style)
        return query, key


def _build(mixin: type, base: type, *more: type) -> type:
    """The tiled class of SGLang's `base`: mixin's forward as its first kernel backend."""
    priority = (PLUGIN, *(b for b in base.priority if b is not PLUGIN))
    cls = type(f"Tiled{base.__name__}", (*more, mixin, base),
               {"__module__": __name__, "__qualname__": f"Tiled{base.__name__}",
                "capabilities": {**base.capabilities, PLUGIN: frozenset()},
                "priority": priority})
    cls.tiled_class = cls
    return cls


def rotary_classes() -> list[type]:
    """RotaryEmbedding and its subclasses in SGLang's rotary_embedding package that keep its
    forwards (the rotation tiled computes): Llama 3, linear / dynamic NTK / YaRN scaling, ..."""
    base = ORIGINAL["RotaryEmbedding"]
    for info in pkgutil.iter_modules(rope_pkg.__path__):  # every module that defines one
        try:
            importlib.import_module(f"{rope_pkg.__name__}.{info.name}")
        except Exception:  # a model-specific module that does not import here
            continue
    forwards = ("forward", "forward_native", "forward_cuda", "forward_cpu", "forward_hip",
                "get_cos_sin_with_position")
    out, todo = [], [base]
    while todo:
        c = todo.pop()
        todo.extend(c.__subclasses__())
        if c.__module__.startswith("sglang.") and issubclass(c, fused_op.BaseFusedOp) and \
                all(getattr(c, f, None) is getattr(base, f, None) for f in forwards):
            out.append(c)
    return sorted(set(out), key=lambda c: c.__name__)


def install(ops) -> dict[str, list[str]]:
    """Builds the tiled classes of `ops`, then registers each as a HookRegistry REPLACE of
    SGLang's class (applied by load_plugins() after every plugin ran); returns op -> the
    SGLang classes replaced. Nothing is registered when building any of them fails."""
    plan: list[tuple[str, type, type]] = []  # (op, SGLang's class, its tiled class)
    if "rms_norm" in ops:
        plan.append(("rms_norm", ORIGINAL["RMSNorm"], _build(_RMSNorm, ORIGINAL["RMSNorm"])))
    if "silu_and_mul" in ops:
        plan.append(("silu_and_mul", ORIGINAL["SiluAndMul"],
                     _build(_SiluAndMul, ORIGINAL["SiluAndMul"])))
    if "gelu_and_mul" in ops:
        plan.append(("gelu_and_mul", ORIGINAL["GeluAndMul"],
                     _build(_GeluAndMul, ORIGINAL["GeluAndMul"])))
    if "rotary_embedding" in ops:
        base = ORIGINAL["RotaryEmbedding"]
        tiled_base = _build(_Rotary, base)
        plan.append(("rotary_embedding", base, tiled_base))
        for c in rotary_classes():
            if c is not base:  # isinstance(x, <tiled base>) holds for these too
                plan.append(("rotary_embedding", c, _build(_Rotary, c, tiled_base)))
    done: dict[str, list[str]] = {}
    for op, original, cls in plan:
        HookRegistry.register(f"{original.__module__}.{original.__qualname__}", cls,
                              HookType.REPLACE)
        done.setdefault(op, []).append(original.__name__)
    return done
