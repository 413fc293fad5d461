"""Tile IR: the program format that travels between the DSL, the daemon and the compiler.
Free of TVM: importing this package never imports `tvm`."""

from tiled.errors import IRDecodeError, VerifyError
from tiled.ir.program import SCHEMA_VERSION, Program
from tiled.ir.verifier import Limits, verify_program
from tiled.v1 import tile_ir_pb2 as pb


def verify(program: Program, limits: Limits | None = None) -> Program:
    """Checks every rule of the IR (see tiled.ir.verifier); returns the program or raises
    VerifyError with a located message."""
    verify_program(program, limits)
    return program


__all__ = ["SCHEMA_VERSION", "IRDecodeError", "Limits", "Program", "VerifyError", "pb", "verify"]
