"""Builds the launch manifest from the Tile IR, which tiled owns: parameters, grid expressions
and symbolic dims come from the program, never from TVM's internals."""

from __future__ import annotations

from tiled.compiler.registry import Artifact, Target, get_backend
from tiled.errors import CompileError
from tiled.ir import dtypes
from tiled.ir.program import Program
from tiled.ir.walk import waits_on_grid
from tiled.v1 import tile_ir_pb2 as pb

_OPS = {pb.ADD: "add", pb.SUB: "sub", pb.MUL: "mul", pb.FLOOR_DIV: "floordiv",
        pb.FLOOR_MOD: "floormod", pb.MIN: "min", pb.MAX: "max"}


def expr_json(program: pb.Program, e: pb.Expr, dim_names: dict[int, str]):
    """A grid expression as the manifest's JSON expression language."""
    kind = e.WhichOneof("kind")
    if kind == "int_value":
        return int(e.int_value)
    if kind == "var" and e.var in dim_names:
        return dim_names[e.var]
    if kind == "binary" and e.binary.op in _OPS:
        return [_OPS[e.binary.op], expr_json(program, e.binary.a, dim_names),
                expr_json(program, e.binary.b, dim_names)]
    if kind == "binary" and e.binary.op == pb.DIV:
        return ["floordiv", expr_json(program, e.binary.a, dim_names),
                expr_json(program, e.binary.b, dim_names)]
    if kind == "cast":
        return expr_json(program, e.cast.value, dim_names)
    raise CompileError("grid extents may use constants, symbolic dims and + - * // % min max "
                       f"only (found {kind})")


def dim_names(program: pb.Program) -> dict[int, str]:
    """Symbolic dim var id -> its name in the manifest and the kernel (`d<id>` if unnamed).
    Vars are looked up by id: the table's order is not their ids'."""
    out = {}
    buffers = {b.id: b for b in program.buffers}
    names = {v.id: v.name for v in program.vars}
    for p in program.params:
        if p.WhichOneof("kind") == "buffer":
            for d in buffers[p.buffer].shape:
                if d.WhichOneof("kind") == "var":
                    out[d.var] = names[d.var] or f"d{d.var}"
    return out


def manifest_params(program: pb.Program) -> list[dict]:
    names = dim_names(program)
    buffers = {b.id: b for b in program.buffers}
    var_dtype = {v.id: v.dtype for v in program.vars}
    params = []
    for p in program.params:
        if p.WhichOneof("kind") == "buffer":
            b = buffers[p.buffer]
            shape = [names[d.var] if d.WhichOneof("kind") == "var" else int(d.size)
                     for d in b.shape]
            params.append({"name": p.name, "kind": "tensor",
                           "dtype": dtypes.canonical_name(b.dtype), "shape": shape,
                           "align": 16})
        else:
            params.append({"name": p.name, "kind": "scalar",
                           "dtype": dtypes.canonical_name(var_dtype[p.scalar])})
    return params


def build_manifest(program: Program, target: Target, art: Artifact, artifact_sha256: str,
                   action: dict | None = None):
    from tiled.runtime.manifest import Manifest

    p = program.proto
    names = dim_names(p)
    grid = program_grid = [expr_json(p, g, names) for g in p.kernel.grid]
    if art.persistent:
        from tiled.runtime.manifest import SM_COUNT_DIM

        size = art.cluster[0]
        if size > 1:  # whole clusters, one per pair of blocks at most, a CTA per SM at most
            grid[art.paired_axis] = ["ceildiv", grid[art.paired_axis], size]
        blocks = grid[0]
        for g in grid[1:]:
            blocks = ["mul", blocks, g]
        sms = SM_COUNT_DIM if art.persistent == 1 else ["mul", art.persistent, SM_COUNT_DIM]
        grid = [["min", blocks, sms]] if size == 1 else \
            [["mul", size, ["min", blocks, ["max", 1, ["floordiv", SM_COUNT_DIM, size]]]]]
    grid = grid + [1] * (3 - len(grid))
    backend = get_backend(target.backend)
    params = manifest_params(p)
    if target.backend == "cpu":
        for prm in params:
            prm.pop("align", None)
    return Manifest.from_dict({
        "manifest_version": 1,
        "name": p.name,
        "program_digest": program.digest,
        "target": str(target),
        "backend": target.backend,
        "arch": target.arch,
        "artifact_format": backend.artifact_format,
        "artifact_sha256": artifact_sha256,
        "symbol": art.symbol,
        "params": params,
        "kernel_args": art.kernel_args or [],
        "grid": grid,
        "block": list(art.block),
        "dynamic_smem_bytes": art.dynamic_smem_bytes,
        "cluster": list(art.cluster),
        "action": action,
        "requires": art.requires,
        "fallback": None if art.fallback is None else {
            **art.fallback, "grid": program_grid + [1] * (3 - len(program_grid)),
            "cluster": [1, 1, 1]},
        **({"code_object": art.code_object} if art.code_object is not None else {}),
        **({"metal": art.metal} if art.metal is not None else {}),
        **({"pdl": True} if _programmatic(p, target) else {}),
    })


def _programmatic(p: pb.Program, target: Target) -> bool:
    """Whether the kernel is launched with programmatic stream serialization: it holds a
    T.pdl_sync and its target has griddepcontrol (CUDA sm_90 and newer; tiled.lang.pdl)."""
    digits = target.arch.removeprefix("sm_").rstrip("af")
    return target.backend == "cuda" and digits.isdigit() and int(digits) >= 90 and \
        waits_on_grid(p.kernel.body)
