"""A compile-pool job for the pool's tests only (tests/server/test_pool_hygiene.py): it fails
inside TVM in a worker, so that a test can check that the daemon process, which never
imports TVM, gets the error without loading it. Under tiled.compiler, where TVM is used."""


def _test_raise_tvm(payload: bytes) -> bytes:
    """Fails inside TVM's C++ simplifier (a constant division by zero): the worker sees a
    tvm.error.InternalError, a class the daemon must never import."""
    from tvm import tirx  # type: ignore[import-untyped]

    tirx.floordiv(tirx.const(1, "int32"), tirx.const(0, "int32"))
    return b""
