"""The cpu lowering's folded tiles (tiled/compiler/targets/cpu/forward.py) on and off, same
process, same threads.

    python benchmarks/cpu/folds.py [--rows 4096 --cols 4096 --repeat 30]
        [--out benchmarks/results/cpu_folds.json]

tiled.ops' RMSNorm and softmax (its CPU launch config) compiled twice, into separate caches:
as the backend compiles them, and with forward.plan folding nothing (the lowering before the
folds). Timed in rounds of (tiled copy, folds off, folds on), so load that comes and goes on
a shared machine hits both alike; `on_over_off` is the median over rounds of the two times'
ratio, `of_copy` each variant's median over rounds of its bandwidth over the copy's.
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_common import rows_cols_main
from membound import copy_kernel, np_dtype

ROOT = Path(__file__).resolve().parents[2]


def compiled(rows: int, cols: int, dtype: str, folds: bool) -> dict:
    import tiled
    from tiled import config
    from tiled.compiler.targets.cpu import forward
    from tiled.ops import _launch_config, kernels

    cfg = _launch_config("rms_norm", "cpu", N=cols, dtype=dtype)
    plan = forward.plan
    if not folds:
        forward.plan = lambda _program: forward.Plan()
    try:
        with config.override(cache_dir=Path(tempfile.mkdtemp(prefix="tiled-folds-"))):
            return {"rms_norm": tiled.compile(kernels.rms_norm(cols, dtype, 1e-6, **cfg), "cpu"),
                    "softmax": tiled.compile(kernels.softmax(cols, dtype, **cfg), "cpu")}
    finally:
        forward.plan = plan


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_dtype(rows: int, cols: int, dtype: str, repeat: int) -> dict:
    import tiled

    dt = np_dtype(dtype)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((rows, cols), dtype=np.float32) * 2).astype(dt)
    w = rng.standard_normal(cols, dtype=np.float32).astype(dt)
    y_off, y_on = np.empty((rows, cols), dt), np.empty((rows, cols), dt)
    copy = tiled.compile(copy_kernel(cols, dtype), target="cpu", stream_stores=False)
    off, on = compiled(rows, cols, dtype, False), compiled(rows, cols, dtype, True)
    out = {}
    for name in off:
        args = (x, w) if name == "rms_norm" else (x,)
        off[name](*args, y_off)
        on[name](*args, y_on)
        diff = np.abs(y_on.astype(np.float64) - y_off.astype(np.float64)).max()
        tol = 1e-5 if dtype == "float32" else 1e-2  # a bfloat16 ulp is 2^-8 of the value
        assert diff <= tol * np.abs(y_off.astype(np.float64)).max(), (name, dtype, diff)
        t_copy, t_off, t_on = [], [], []
        for _ in range(repeat):
            t_copy.append(seconds(lambda: copy(x, y_on)))
            t_off.append(seconds(lambda n=name, a=args: off[n](*a, y_off)))
            t_on.append(seconds(lambda n=name, a=args: on[n](*a, y_on)))
        def ratio(a, b):
            return round(statistics.median(x / y for x, y in zip(a, b, strict=True)), 3)

        out[name] = {
            "copy_best_ms": round(min(t_copy) * 1e3, 3),
            "off_best_ms": round(min(t_off) * 1e3, 3), "on_best_ms": round(min(t_on) * 1e3, 3),
            "off_of_copy": ratio(t_copy, t_off), "on_of_copy": ratio(t_copy, t_on),
            "on_over_off": ratio(t_on, t_off)}
        r = out[name]
        print(f"{name:9s} {dtype:8s} folds off {r['off_best_ms']:6.2f} ms ({r['off_of_copy']:.2f} "
              f"of copy), on {r['on_best_ms']:6.2f} ms ({r['on_of_copy']:.2f}); on / off "
              f"{r['on_over_off']:.2f} per round", flush=True)
    return out


def main() -> None:
    rows_cols_main(__doc__, bench_dtype, ROOT / "benchmarks/results/cpu_folds.json")


if __name__ == "__main__":
    main()
