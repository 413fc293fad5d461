"""Run inside a second container of the daemon image by tests/deploy/test_image.py, as a
serving pod would be: the image's uid, the daemon's socket directory mounted read-only,
TILED_SERVER naming the socket in it. Compiles through the socket with tiled's own client
(which checks the socket's owner first), loads the artifact and runs it; prints one JSON
line."""

import json

import numpy as np

import tiled
import tiled.lang as T
from tiled.client import Client

N = T.dyn("N")


@tiled.kernel
def triple(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
    with T.Kernel(T.ceildiv(N, 128), threads=128) as bx:
        for i in T.Parallel(128):
            if bx * 128 + i < N:
                Y[bx * 128 + i] = X[bx * 128 + i] * 3.0


with Client() as client:  # TILED_SERVER
    kernel = client.compile(triple, "cpu")
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    kernel(x, y)
    print(json.dumps({"ok": bool(np.array_equal(y, x * 3)), "cache_hit": kernel.cache_hit,
                      "health": client.health("")}))
