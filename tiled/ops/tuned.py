"""What the autotuned ops of tiled.ops share (this module, tiled.ops.tuned): a `TunedOp` holds an
op's tiled.autotune tuner per target kind and the kernel it chose per (target, bucket)."""

import tiled
from tiled.runtime.cpu_levels import is_cpu_target


class TunedOp:
    """An op's kernel factory under tiled.autotune: `spaces` {"cuda": configs, "cpu": configs},
    `key` and `bucket` as tiled.autotune takes them, `autotune` its other arguments (inputs=,
    run=, compile options). `chosen` maps (target, bucket) to the Tuned kernel."""

    def __init__(self, name: str, factory, spaces: dict, key: list, bucket, **autotune):
        self.name, self.factory, self.spaces = name, factory, spaces
        self.key, self.bucket, self.autotune = key, bucket, autotune
        self.chosen: dict[tuple, object] = {}
        self._tuners: dict[str, object] = {}

    def tuned(self, like, *args):
        """The Tuned kernel for the factory's key arguments `args` on tensor `like`'s device,
        chosen once per (target, bucket), then kept. Inside a CUDA graph capture a bucket not
        tuned yet raises RuntimeError (tuning launches and synchronizes)."""
        from tiled.ops import _capturing, _target
        from tiled.runtime.telemetry import count_launch

        target = _target(like)
        count_launch(self.name, target)  # the caller launches what this returns
        key = (target, tuple(self.bucket(*args)))
        t = self.chosen.get(key)
        if t is not None:
            return t
        if _capturing(like):
            raise RuntimeError(f"tiled.ops.{self.name}: no kernel is tuned yet for {key[1]} and "
                               "a CUDA graph is being captured; call it once before capturing")
        kind = "cpu" if is_cpu_target(target) else "cuda"
        tuner = self._tuners.get(kind)
        if tuner is None:
            tuner = self._tuners[kind] = tiled.autotune(
                configs=self.spaces[kind], key=self.key, bucket=self.bucket,
                **self.autotune)(self.factory)
        return self.chosen.setdefault(key, tuner(*args))

    def clear(self) -> None:
        """Forgets the tuners and their choices (tests)."""
        self.chosen.clear()
        self._tuners.clear()


def pow2_bucket(n: int, cap: int, least: int = 1) -> int:
    """The bucket of count `n` that one tuning serves: the smallest power of two times `least`
    at or above n, at most `cap` (everything past cap shares it)."""
    m = least
    while m < n and m < cap:
        m *= 2
    return m
