"""Memory-bound ops on the cpu backend against a plain copy of the same bytes, same process.

    env -u OPENBLAS_CORETYPE python benchmarks/cpu/membound.py [--rows 4096 --cols 4096]
        [--out benchmarks/results/cpu_membound.json]

tiled.ops' kernels as its CPU path compiles them (tiled/ops/kernels.py, the launch config of
tiled.ops for `cpu`): RMSNorm, softmax and LayerNorm (with weight and bias) over X [rows, cols]
-> Y [rows, cols], SiLU-and-mul
over X [rows, 2 cols] -> Y [rows, cols]; float32 and bfloat16. Bandwidth counts the bytes the
op must move (X read + Y written; the weight row is not counted). The reference is the faster
of two plain copies of a [rows, cols] array measured in the same run: numpy's `copyto` and a
tiled copy kernel on the same threads as the ops, built with `stream_stores=False` (plain
stores). The ops are built as tiled.ops builds them, so on x86-64 with clang an output of twice
the last-level cache or more takes non-temporal stores (tiled/compiler/targets/cpu/stream_out.py);
the copy kernel built that way (`streaming_copy_gbs`) is the second reference. Outputs are
preallocated (a fresh 64 MB output per call would measure page faults). Each op is checked
against numpy first, then timed in rounds of (tiled copy, streaming copy, op): `of_copy` is
the op's best bandwidth over the best plain copy's, `of_copy_median_of_rounds` the median over
rounds of the op's bandwidth over the round's plain copy's, which load that comes and goes (a
shared machine) affects less, `of_streaming_copy_median_of_rounds` the same over the round's
streaming copy.
"""

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import rows_cols_main, timings

ROOT = Path(__file__).resolve().parents[2]


def np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def copy_kernel(cols: int, dtype: str, rows_per_block: int = 4, tile: bool = False):
    """Y = X, element by element; with `tile`, through a block tile (copied in, stored back:
    the cpu backend folds both copies). Either streams Y where the cpu backend's
    `stream_stores` is on (its default); the benchmarks' plain-copy references turn it off."""
    import tiled
    import tiled.lang as T

    M = T.dyn("M")
    r = rows_per_block

    @tiled.kernel
    def copy(X: T.Tensor((M, cols), dtype), Y: T.Tensor((M, cols), dtype)):
        with T.Kernel(T.ceildiv(M, r), threads=128) as bx:
            for i, j in T.Parallel(r, cols):
                Y[bx * r + i, j] = X[bx * r + i, j]

    @tiled.kernel
    def copy_tile(X: T.Tensor((M, cols), dtype), Y: T.Tensor((M, cols), dtype)):
        with T.Kernel(T.ceildiv(M, r), threads=128) as bx:
            t = T.alloc_fragment((r, cols), dtype)
            T.copy(X[bx * r, 0], t)
            for i, j in T.Parallel(r, cols):
                t[i, j] = t[i, j]
            T.copy(t, Y[bx * r, 0])
    return copy_tile if tile else copy


def reference(name: str, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What op `name` computes, in float64."""
    x64 = x.astype(np.float64)
    if name == "rms_norm":
        return x64 / np.sqrt((x64 ** 2).mean(1, keepdims=True) + 1e-6) * w.astype(np.float64)
    if name == "layer_norm":
        c = x64 - x64.mean(1, keepdims=True)
        return c / np.sqrt((c ** 2).mean(1, keepdims=True) + 1e-5) * w.astype(np.float64) + \
            b.astype(np.float64)
    if name == "softmax":
        e = np.exp(x64 - x64.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    g = x64[:, :x.shape[1] // 2]
    return g / (1 + np.exp(-g)) * x64[:, x.shape[1] // 2:]


def inputs(rows: int, cols: int, dtype: str) -> tuple[np.ndarray, ...]:
    """X [rows, cols], X2 [rows, 2 cols] (SiLU-and-mul's), the weight and the bias rows."""
    dt = np_dtype(dtype)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, cols), dtype=np.float32) * 2).astype(dt)
    x2 = (rng.standard_normal((rows, 2 * cols), dtype=np.float32) * 2).astype(dt)
    w = rng.standard_normal(cols, dtype=np.float32).astype(dt)
    b = rng.standard_normal(cols, dtype=np.float32).astype(dt)
    return x, x2, w, b


def bench_dtype(rows: int, cols: int, dtype: str, repeat: int) -> dict:
    import tiled
    from tiled.ops import _launch_config, kernels

    dt = np_dtype(dtype)
    x, x2, w, b = inputs(rows, cols, dtype)
    y = np.empty((rows, cols), dt)
    nbytes = x.nbytes

    # The reference copies with plain stores (the cpu backend's `stream_stores` off); the
    # copy through a tile, as the backend builds it by default, streams Y (non-temporal
    # stores, tiled's stream_out.py) and is reported beside it.
    copy = tiled.compile(copy_kernel(cols, dtype), target="cpu", stream_stores=False)
    copy_streaming = tiled.compile(copy_kernel(cols, dtype, tile=True), target="cpu")
    for c in (copy, copy_streaming):
        y.fill(0)
        c(x, y)
        assert np.array_equal(y.view(np.uint8), x.view(np.uint8))
    ref_copy = {"numpy_copyto": timings(lambda: np.copyto(y, x), repeat),
                "tiled_copy": timings(lambda: copy(x, y), repeat)}
    copy_gbs = {k: round(2 * nbytes / v["best_s"] / 1e9, 2) for k, v in ref_copy.items()}
    copy_best = max(copy_gbs.values())
    streaming_gbs = round(2 * nbytes / timings(lambda: copy_streaming(x, y), repeat)["best_s"]
                          / 1e9, 2)

    cfg = _launch_config("rms_norm", "cpu", N=cols, dtype=dtype)
    ops = {
        "rms_norm": (tiled.compile(kernels.rms_norm(cols, dtype, 1e-6, **cfg), target="cpu"),
                     (x, w, y), 2 * nbytes, x),
        "softmax": (tiled.compile(kernels.softmax(cols, dtype, **cfg), target="cpu"),
                    (x, y), 2 * nbytes, x),
        "layer_norm": (tiled.compile(kernels.layer_norm(cols, dtype, 1e-5, True, **cfg),
                                     target="cpu"), (x, w, b, y), 2 * nbytes, x),
        "silu_and_mul": (tiled.compile(kernels.gated_activation(
            cols, dtype, "silu", **_launch_config("gated_activation", "cpu", N=cols)),
            target="cpu"), (x2, y), x2.nbytes + y.nbytes, x2),
    }
    tol = 1e-5 if dtype == "float32" else 1e-2
    out = {"copy_gbs": copy_gbs, "copy_spread": {k: v["spread"] for k, v in ref_copy.items()},
           "reference_gbs": copy_best, "streaming_copy_gbs": streaming_gbs, "ops": {}}
    for name, (kernel, args, moved, src) in ops.items():
        kernel(*args)
        want = reference(name, src, w, b)
        err = float(np.abs(y.astype(np.float64) - want).max() / np.abs(want).max())
        assert err < tol, (name, dtype, err)
        op_t, copy_t, stream_t = [], [], []
        for _ in range(repeat):  # rounds: the tiled copy, its streaming build, then the op
            copy_t.append(timings(lambda: copy(x, y), 1, warmup=0)["best_s"])
            stream_t.append(timings(lambda: copy_streaming(x, y), 1, warmup=0)["best_s"])
            op_t.append(timings(lambda k=kernel, a=args: k(*a), 1, warmup=0)["best_s"])
        t = {"best_s": min(op_t), "spread": round(max(op_t) / min(op_t) - 1, 3)}
        gbs = moved / t["best_s"] / 1e9
        per_round, per_round_streaming = (statistics.median(
            (moved / o) / (2 * nbytes / c) for o, c in zip(op_t, ref, strict=True))
            for ref in (copy_t, stream_t))
        out["ops"][name] = {"ms": round(t["best_s"] * 1e3, 3), "gbs": round(gbs, 2),
                            "of_copy": round(gbs / copy_best, 3),
                            "of_copy_median_of_rounds": round(per_round, 3),
                            "of_streaming_copy_median_of_rounds": round(per_round_streaming, 3),
                            "spread": t["spread"], "bytes": moved, "max_rel_err": err,
                            "target": kernel.manifest.target}
        print(f"{name:13s} {dtype:8s} {t['best_s'] * 1e3:7.2f} ms {gbs:6.2f} GB/s = "
              f"{gbs / copy_best:.2f} of copy ({copy_best:.2f} GB/s), per round "
              f"{per_round:.2f} (spread {t['spread']}); of the streaming copy per round "
              f"{per_round_streaming:.2f}", flush=True)
    return out


def main() -> None:
    rows_cols_main(__doc__, bench_dtype, ROOT / "benchmarks/results/cpu_membound.json")


if __name__ == "__main__":
    main()
