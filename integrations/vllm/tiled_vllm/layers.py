"""The layers tiled_vllm gives vLLM (imported by register(), so importing tiled_vllm does not
import vLLM). Each subclasses vLLM's layer and keeps its constructor, weights and
forward_native; forward_cuda / forward_cpu call torch.ops.tiled.* instead, and run
forward_native (counted, logged once) where tiled cannot serve the call: arguments its
kernels do not take (a variance size override, a weightless norm, a non-contiguous view), no
compiled kernel during a CUDA graph capture, the daemon unreachable.

They are on whatever vLLM's `custom_ops` says, unless it names them with a minus: `-RMSNorm`
or `-rms_norm` keeps vLLM's RMSNorm (likewise SiluAndMul / silu_and_mul, GeluAndMul /
gelu_and_mul, RotaryEmbedding / rotary_embedding for every rotary class).
"""

import torch
from torch import Tensor
from vllm import ir
from vllm.model_executor.custom_op import CustomOp, get_cached_compilation_config
from vllm.model_executor.layers import rotary_embedding as rope
from vllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm

import tiled.ops  # noqa: F401 - registers torch.ops.tiled.*
from tiled_vllm.counters import count, fell_back

BASE = rope.RotaryEmbedding


def serve(op: str, tiled_fn, native_fn):
    """tiled_fn()'s result, or native_fn()'s where tiled_fn raises. Under torch.compile the
    custom op is traced as it is (a fallback cannot be traced)."""
    if torch.compiler.is_compiling():
        return tiled_fn()
    try:
        out = tiled_fn()
    except Exception as e:  # any failure of tiled's: vLLM's own forward
        fell_back(op, e)
        return native_fn()
    count(op, "tiled")
    return out


def _unsupported(op: str, native_fn):
    count(op, "native")
    return native_fn()


class _ForcedOn:
    """enabled(): on unless custom_ops disables the class (`-Name`) or one of `off_names`
    (its in-tree op name; for every rotary class, RotaryEmbedding's names too)."""

    off_names: tuple = ()

    @classmethod
    def enabled(cls) -> bool:
        custom_ops = get_cached_compilation_config().custom_ops
        return all(f"-{n}" not in custom_ops for n in (cls.name, *cls.off_names))


class TiledRMSNorm(_ForcedOn, RMSNorm):
    off_names = (RMSNorm.name,)

    def forward_cuda(self, x: Tensor, residual: Tensor | None = None):
        native = lambda: self.forward_native(x, residual)  # noqa: E731
        if self.variance_size_override is not None or not self.has_weight or \
                self.weight.dtype != x.dtype:
            return _unsupported("rms_norm", native)
        w, eps = self.weight.data, self.variance_epsilon
        if residual is None:
            return serve("rms_norm", lambda: torch.ops.tiled.rms_norm(x, w, eps), native)

        def fused():
            torch.ops.tiled.fused_add_rms_norm(x, residual, w, eps)  # in place, as vLLM's
            return x, residual
        return serve("rms_norm", fused, native)

    forward_cpu = forward_cuda


class TiledSiluAndMul(_ForcedOn, SiluAndMul):
    off_names = (SiluAndMul.name,)

    def forward_cuda(self, x: Tensor) -> Tensor:
        return serve("silu_and_mul", lambda: torch.ops.tiled.silu_and_mul(x),
                     lambda: self.forward_native(x))

    forward_cpu = forward_cuda


class TiledGeluAndMul(_ForcedOn, GeluAndMul):
    off_names = (GeluAndMul.name,)

    def forward_cuda(self, x: Tensor) -> Tensor:
        return serve("gelu_and_mul", lambda: torch.ops.tiled.gelu_and_mul(x, self.approximate),
                     lambda: self.forward_native(x))

    forward_cpu = forward_cuda


class _TiledRotary(_ForcedOn):
    """The rotary forward on top of a RotaryEmbedding class whose forward is the base one (its
    subclasses differ in the cos / sin cache they compute)."""

    off_names = (BASE.name, BASE.__name__)

    def forward_cuda(self, positions: Tensor, query: Tensor, key: Tensor | None = None):
        native = lambda: self.forward_native(positions, query, key)  # noqa: E731
        if key is None or self.use_flashinfer:
            return _unsupported("rotary_embedding", native)

        def rotate():
            cache = self._match_cos_sin_cache_dtype(query)
            torch.ops.tiled.rotary_embedding(positions.flatten(), query, key, self.head_size,
                                             cache, self.is_neox_style)
            return query, key
        return serve("rotary_embedding", rotate, native)

    forward_cpu = forward_cuda


def rotary_classes() -> list[type]:
    """RotaryEmbedding and its subclasses (vLLM's rotary_embedding package) that keep its
    forward: the ones the tiled kernel computes."""
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(rope.__path__):  # every module that defines a subclass
        try:
            importlib.import_module(f"{rope.__name__}.{info.name}")
        except Exception:  # a model-specific module that does not import here
            continue
    out, todo = [], [BASE]
    while todo:
        c = todo.pop()
        todo.extend(c.__subclasses__())
        if c.__module__.startswith("vllm.") and c.forward_native is BASE.forward_native and \
                c.forward_cuda is BASE.forward_cuda:
            out.append(c)
    return sorted(set(out), key=lambda c: c.__name__)


def _rms_ok(x, weight, epsilon, variance_size=None) -> bool:
    return variance_size is None and weight is not None and weight.dtype == x.dtype and \
        x.is_contiguous()


def _rms_add_ok(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return _rms_ok(x, weight, epsilon, variance_size) and x_residual.is_contiguous()


def _register_ir() -> None:
    """The `tiled` provider of vLLM's IR ops rms_norm and fused_add_rms_norm (chosen with
    --kernel-config '{"ir_op_priority": {"rms_norm": "tiled,native"}}')."""

    @ir.ops.rms_norm.register_impl("tiled", supports_args=_rms_ok)
    def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float,
                 variance_size: int | None = None) -> Tensor:
        count("rms_norm", "tiled")
        return torch.ops.tiled.rms_norm(x, weight, epsilon)

    @ir.ops.fused_add_rms_norm.register_impl("tiled", supports_args=_rms_add_ok, inplace=True)
    def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None,
                           epsilon: float, variance_size: int | None = None
                           ) -> tuple[Tensor, Tensor]:
        count("rms_norm", "tiled")
        torch.ops.tiled.fused_add_rms_norm(x, x_residual, weight, epsilon)
        return x, x_residual


def install(ops) -> dict[str, list[str]]:
    """Registers the layers of `ops` with vLLM; returns op -> the vLLM classes replaced."""
    done: dict[str, list[str]] = {}
    if "rms_norm" in ops:
        CustomOp.register_oot(TiledRMSNorm, name="RMSNorm")
        _register_ir()
        done["rms_norm"] = ["RMSNorm"]
    if "silu_and_mul" in ops:
        CustomOp.register_oot(TiledSiluAndMul, name="SiluAndMul")
        done["silu_and_mul"] = ["SiluAndMul"]
    if "gelu_and_mul" in ops:
        CustomOp.register_oot(TiledGeluAndMul, name="GeluAndMul")
        done["gelu_and_mul"] = ["GeluAndMul"]
    if "rotary_embedding" in ops:
        names = []
        for c in rotary_classes():
            layer = type(f"Tiled{c.__name__}", (_TiledRotary, c), {"__module__": __name__})
            CustomOp.register_oot(layer, name=c.__name__)
            names.append(c.__name__)
        done["rotary_embedding"] = names
    return done
