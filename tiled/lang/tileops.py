"""Allocations and tile operations: collective statements that the whole block executes."""

from __future__ import annotations

from enum import IntEnum

from tiled.ir import dtypes
from tiled.lang.builder import current, definition_error
from tiled.lang.expr import BufferRef, Element, Expr, RegionRef, cast, index_expr
from tiled.lang.localvar import alloc_var
from tiled.lang.loops import If
from tiled.v1 import tile_ir_pb2 as pb


def _alloc(shape, dtype, scope: int, name: str | None) -> BufferRef:
    b = current()
    if not b.kernel_open:
        raise definition_error("allocate buffers inside `with T.Kernel(...)`")
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
            raise definition_error(f"allocation shapes must be positive ints, got {shape!r}")
    try:
        dt = dtypes.canonical_name(dtype)
    except ValueError as e:
        raise definition_error(str(e)) from None
    prefix = {pb.SHARED: "shared", pb.FRAGMENT: "frag", pb.LOCAL: "local"}[scope]
    name = name or f"{prefix}{len(b.program.buffers)}"
    buf = b.new_buffer(name, dt, list(shape), scope)
    buf.loc.CopyFrom(b.location())
    return BufferRef(buf.id, name, dt, shape, scope)


def alloc_shared(shape, dtype, name: str | None = None) -> BufferRef:
    """A tile in shared memory, visible to every thread of the block.

    >>> A_shared = T.alloc_shared((128, 32), "float16")
    """
    return _alloc(shape, dtype, pb.SHARED, name)


def alloc_fragment(shape, dtype, name: str | None = None) -> BufferRef:
    """A tile held in the registers of the block's threads (the compiler picks the layout).

    >>> C_local = T.alloc_fragment((128, 128), "float32")
    """
    return _alloc(shape, dtype, pb.FRAGMENT, name)


def alloc_local(shape, dtype, name: str | None = None) -> BufferRef:
    """Per-thread storage.

    >>> acc = T.alloc_local((1,), "float32")
    """
    return _alloc(shape, dtype, pb.LOCAL, name)


def _region(operand, other_shape: tuple | None, what: str) -> tuple[pb.Region, tuple]:
    """A Region from a buffer (whole), a slice, or an element (a corner whose extents come
    from the other operand's shape)."""
    r = pb.Region()
    if isinstance(operand, BufferRef):
        r.buffer = operand.bid
        for d in operand.shape:
            r.offsets.add(dtype=pb.INT32, int_value=0)
            if not isinstance(d, int):
                raise definition_error(
                    f"{what}: {operand.name} has a symbolic shape; name a tile of it, e.g. "
                    f"{operand.name}[i, j]")
            r.extents.append(d)
        return r, tuple(operand.shape)
    if isinstance(operand, RegionRef):
        r.buffer = operand.buffer.bid
        for o in operand.offsets:
            r.offsets.add().CopyFrom(o.node)
        r.extents.extend(operand.extents)
        return r, tuple(operand.extents)
    if isinstance(operand, Element):
        if other_shape is None:
            raise definition_error(
                f"{what}: both operands are tile corners; one must be a whole buffer or a slice")
        rank = operand.buffer.ndim
        lead = len(other_shape) - rank
        if lead > 0 and all(d == 1 for d in other_shape[:lead]):
            other_shape = tuple(other_shape)[lead:]  # one stage of a staged tile
        if len(other_shape) > rank:
            raise definition_error(f"{what}: a {len(other_shape)}-d tile does not fit in "
                                   f"{operand.buffer.name}, which has {rank} dims")
        ext = (1,) * (rank - len(other_shape)) + tuple(other_shape)
        r.buffer = operand.buffer.bid
        for i in operand.indices:
            r.offsets.add().CopyFrom(i.node)
        r.extents.extend(ext)
        return r, ext
    raise definition_error(f"{what}: expected a buffer, a slice or buf[i, j], got "
                           f"{type(operand).__name__}")


def _squeeze(shape) -> tuple:
    return tuple(d for d in shape if d != 1)


EVICTION_POLICIES = ("evict_normal", "evict_first", "evict_last")


def copy(src, dst, coalesced_width: int | None = None, disable_tma: bool = False,
         eviction_policy: str | None = None) -> None:
    """Copies a tile between global, shared and fragment memory. Parts of a global tile past the
    tensor's end read as zero and are not written (ragged tails). TileLang's hints
    `coalesced_width`, `disable_tma` and `eviction_policy` are checked and dropped: tiled
    picks the vector width and whether TMA moves the tile (docs/tilelang.md).

    >>> T.copy(A[by * 128, k * 32], A_shared)   # global -> shared
    >>> T.copy(C_local, C[by * 128, bx * 128])  # fragment -> global
    """
    if coalesced_width is not None and (isinstance(coalesced_width, bool) or
                                        not isinstance(coalesced_width, int) or
                                        coalesced_width < 1):
        raise definition_error(f"T.copy: coalesced_width must be a positive int, got "
                               f"{coalesced_width!r}")
    if not isinstance(disable_tma, bool):
        raise definition_error(f"T.copy: disable_tma must be True or False, got {disable_tma!r}")
    if eviction_policy is not None and eviction_policy not in EVICTION_POLICIES:
        raise definition_error(f"T.copy: eviction_policy must be one of "
                               f"{', '.join(EVICTION_POLICIES)}, got {eviction_policy!r}")
    current().emit(copy_stmt(src, dst))


def copy_stmt(src, dst) -> pb.Stmt:
    """The Copy statement of T.copy(src, dst), not yet emitted (T.tma_copy adds its barrier)."""
    src_shape = None if isinstance(src, Element) else _region(src, None, "T.copy")[1]
    dst_shape = None if isinstance(dst, Element) else _region(dst, None, "T.copy")[1]
    rs, s_shape = _region(src, dst_shape, "T.copy source")
    rd, d_shape = _region(dst, src_shape if src_shape is not None else s_shape,
                          "T.copy destination")
    if _squeeze(s_shape) != _squeeze(d_shape):
        raise definition_error(f"T.copy: source tile {s_shape} and destination tile {d_shape} "
                               "have different shapes")
    stmt = pb.Stmt()
    stmt.copy.src.CopyFrom(rs)
    stmt.copy.dst.CopyFrom(rd)
    return stmt


def _gemm_operand(x, name: str) -> tuple[BufferRef, list, tuple]:
    """(buffer, indices of its leading dims, 2-d tile shape) of a gemm operand: a 2-d buffer,
    or one 2-d tile of a staged buffer, `A_s[s, :, :]`."""
    if isinstance(x, BufferRef) and x.ndim == 2:
        return x, [], tuple(x.shape)
    if isinstance(x, RegionRef) and name != "C":
        buf, lead = x.buffer, x.buffer.ndim - 2
        whole = all(o.node.WhichOneof("kind") == "int_value" and o.node.int_value == 0
                    for o in x.offsets[lead:])
        if lead >= 1 and all(e == 1 for e in x.extents[:lead]) and whole and \
                tuple(x.extents[lead:]) == tuple(buf.shape[lead:]):
            return buf, list(x.offsets[:lead]), tuple(buf.shape[lead:])
    what = "a 2-d tile buffer" if name == "C" else \
        "a 2-d tile buffer or one whole 2-d tile of a staged buffer (A_s[s, :, :])"
    raise definition_error(f"T.gemm: {name} must be {what}")


class GemmWarpPolicy(IntEnum):
    """How T.gemm splits the C tile over the block's warps (TileLang's names; the values are
    the Tile IR's). Square: as square a grid of warp tiles as the warp count allows; FullRow:
    warps stacked along M, each with whole rows of C (a row reduction after the gemm stays in
    one warp, as FlashAttention wants); FullCol: warps side by side along N. A performance
    choice only: every policy computes the same C.

    >>> T.gemm(Q_shared, K_shared, S_local, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
    """

    Square = pb.POLICY_SQUARE
    FullRow = pb.POLICY_FULL_ROW
    FullCol = pb.POLICY_FULL_COL


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise definition_error(f"{what} must be True or False, got {value!r}")
    return value


def gemm(A: BufferRef, B: BufferRef, C: BufferRef, transpose_A: bool = False,
         transpose_B: bool = False, policy: GemmWarpPolicy = GemmWarpPolicy.Square,
         clear_accum: bool = False, k_pack: int = 1, mbar=None) -> None:
    """C += op(A) @ op(B) on tiles (tensor cores where the target has them); C = op(A) @ op(B)
    with clear_accum=True (or where a traced clear_accum holds: `clear_accum=k == 0`). A and B
    are shared or fragment tiles, C a fragment; op transposes when its flag is set. The
    arguments are TileLang's, in its order: `policy` picks how warps split C
    (T.GemmWarpPolicy; CUDA honours it, other targets have no warps to split); `k_pack` is a
    TileLang tuning knob for ROCm's matrix cores, accepted and ignored (tiled picks its own
    instruction shapes); `mbar` (Blackwell's tcgen05 barrier) is not supported.

    >>> T.gemm(A_shared, B_shared, C_local)                    # (M,K) @ (K,N)
    >>> T.gemm(Q_shared, K_shared, S_local, transpose_B=True)  # (M,K) @ (N,K)^T
    >>> T.gemm(A_s[k % 3, :, :], B_s[k % 3, :, :], C_local)  # stage k % 3 of (3, M, K) tiles
    >>> T.gemm(P_cast, V_shared, O_local, policy=T.GemmWarpPolicy.FullRow)  # A in registers
    """
    if mbar is not None:
        raise definition_error("TileLang feature T.gemm(mbar=...) is not supported by tiled: "
                               "it names a Blackwell tcgen05 barrier, and tiled's gemm "
                               "completes before the next statement; drop the argument")
    if isinstance(policy, bool) or not isinstance(policy, int) or \
            policy not in GemmWarpPolicy._value2member_map_:
        raise definition_error(f"T.gemm: policy must be T.GemmWarpPolicy.Square, FullRow or "
                               f"FullCol, got {policy!r}")
    if isinstance(k_pack, bool) or not isinstance(k_pack, int) or k_pack < 1:
        raise definition_error(f"T.gemm: k_pack must be a positive int, got {k_pack!r}")
    transpose_A, transpose_B = _flag(transpose_A, "transpose_A"), _flag(transpose_B,
                                                                         "transpose_B")
    # A traced clear_accum (TileLang's `clear_accum=k == 0`) clears C where it holds.
    clear_when = clear_accum if isinstance(clear_accum, Expr) else None
    clear_accum = False if clear_when is not None else _flag(clear_accum, "clear_accum")
    A, a_index, a_shape = _gemm_operand(A, "A")
    B, b_index, b_shape = _gemm_operand(B, "B")
    C, _, _ = _gemm_operand(C, "C")
    if C.scope != pb.FRAGMENT:
        raise definition_error("T.gemm: C must be a fragment (T.alloc_fragment)")
    m, k = (a_shape[1], a_shape[0]) if transpose_A else a_shape
    k2, n = (b_shape[1], b_shape[0]) if transpose_B else b_shape
    if k != k2 or tuple(C.shape) != (m, n):
        raise definition_error(
            f"T.gemm: shapes do not chain: op(A) is {m}x{k}, op(B) is {k2}x{n}, C is "
            f"{C.shape[0]}x{C.shape[1]}")
    stmt = pb.Stmt()
    g = stmt.gemm
    g.a, g.b, g.c = A.bid, B.bid, C.bid
    g.transpose_a, g.transpose_b, g.clear_accum = transpose_A, transpose_B, clear_accum
    g.policy = int(policy)
    if clear_when is not None:
        with If(clear_when):
            fill(C, 0)
    for field, index in ((g.a_index, a_index), (g.b_index, b_index)):
        for i in index:
            field.add().CopyFrom(i.node)
    current().emit(stmt)


def fill(buffer, value) -> None:
    """Sets every element of a tile (or a slice of one) to `value`.

    >>> T.fill(m_local, -T.infinity("float32"))
    """
    r, _ = _region(buffer, None, "T.fill")
    dt = current().buffer(r.buffer)
    v = cast(value, dtypes.canonical_name(dt.dtype))
    stmt = pb.Stmt()
    stmt.fill.dst.CopyFrom(r)
    stmt.fill.value.CopyFrom(v.node)
    current().emit(stmt)


def clear(buffer) -> None:
    """Sets a tile to zero. `T.clear(C_local)`"""
    fill(buffer, 0)


def _reduce(kind: int, src: BufferRef, dst: BufferRef, dim: int, clear: bool) -> None:
    if not isinstance(src, BufferRef) or not isinstance(dst, BufferRef):
        raise definition_error("reduce operands must be tile buffers")
    if dim < 0:
        dim += src.ndim
    if not 0 <= dim < src.ndim:
        raise definition_error(f"reduce dim {dim} out of range for a {src.ndim}-d tile")
    want = tuple(d for i, d in enumerate(src.shape) if i != dim) or (1,)
    if tuple(dst.shape) != want:
        raise definition_error(f"reduce over dim {dim} of {src.name}{tuple(src.shape)} gives "
                               f"shape {want}, but {dst.name} is {tuple(dst.shape)}")
    stmt = pb.Stmt()
    stmt.reduce.kind, stmt.reduce.src, stmt.reduce.dst = kind, src.bid, dst.bid
    stmt.reduce.dim, stmt.reduce.clear = dim, clear
    current().emit(stmt)


def reduce_max(src, dst, dim: int = -1, clear: bool = True) -> None:
    """dst = max of src along `dim` (joined with the old dst when clear=False).

    >>> T.reduce_max(S_local, m_local, dim=1)
    """
    _reduce(pb.REDUCE_MAX, src, dst, dim, clear)


def reduce_sum(src, dst, dim: int = -1, clear: bool = True) -> None:
    """dst = sum of src along `dim`. `T.reduce_sum(P_local, l_local, dim=1)`"""
    _reduce(pb.REDUCE_SUM, src, dst, dim, clear)


def reduce_min(src, dst, dim: int = -1, clear: bool = True) -> None:
    """dst = min of src along `dim`. `T.reduce_min(S_local, lo_local, dim=1)`"""
    _reduce(pb.REDUCE_MIN, src, dst, dim, clear)


def reduce_absmax(src, dst, dim: int = -1, clear: bool = True) -> None:
    """dst = max of |src| along `dim`; with clear=False, the max of that and the old dst (which
    is not made absolute). |x| is taken in dst's dtype; for a signed integer it saturates (the
    most negative value counts as the largest positive one).

    >>> T.reduce_absmax(X_local, amax_local, dim=1)  # per-row scale of an fp8 quantizer
    """
    _reduce(pb.REDUCE_ABSMAX, src, dst, dim, clear)


def cumsum(src, dst=None, dim: int = 0, reverse: bool = False) -> None:
    """Inclusive prefix sum along `dim`: dst[.., i, ..] = src[.., 0, ..] + ... + src[.., i, ..]
    (from the end, src[.., i, ..] + ... + src[.., n-1, ..], when reverse=True). src and dst
    are whole shared or fragment tiles of one shape and dtype; dst defaults to src (in place).
    16- and 8-bit floats keep the running sum in float32 and round each output once.

    >>> T.cumsum(A_shared, dim=0)                   # in place
    >>> T.cumsum(x_frag, y_frag, dim=1, reverse=True)
    """
    dst = src if dst is None else dst
    for role, b in (("src", src), ("dst", dst)):
        if isinstance(b, (RegionRef, Element)):
            raise definition_error(
                f"TileLang feature T.cumsum of a slice is not supported by tiled: its {role} "
                "must be a whole shared or fragment tile; T.copy the slice into one first")
        if not isinstance(b, BufferRef):
            raise definition_error(f"T.cumsum: {role} must be a tile buffer, got "
                                   f"{type(b).__name__}")
        if b.scope not in (pb.SHARED, pb.FRAGMENT):
            raise definition_error(f"T.cumsum: {role} {b.name} must be a shared or fragment "
                                   "tile (T.alloc_shared / T.alloc_fragment)")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise definition_error(f"T.cumsum: dim must be an int, got {dim!r}")
    if not -src.ndim <= dim < src.ndim:
        raise definition_error(f"T.cumsum: dim {dim} is out of range for {src.name}, which "
                               f"has {src.ndim} dims")
    if tuple(dst.shape) != tuple(src.shape):
        raise definition_error(f"T.cumsum: dst {dst.name}{tuple(dst.shape)} must have the "
                               f"shape of src {src.name}{tuple(src.shape)}")
    stmt = pb.Stmt()
    stmt.scan.src, stmt.scan.dst = src.bid, dst.bid
    stmt.scan.dim, stmt.scan.reverse = dim % src.ndim, _flag(reverse, "T.cumsum: reverse")
    current().emit(stmt)


_ORDERS = {None: pb.ORDER_RELAXED, "relaxed": pb.ORDER_RELAXED, "acquire": pb.ORDER_ACQUIRE,
           "release": pb.ORDER_RELEASE, "acq_rel": pb.ORDER_ACQ_REL, "seq_cst": pb.ORDER_SEQ_CST}


def _atomic(op: int, name: str, dst, value, memory_order, return_prev: bool):
    if memory_order not in _ORDERS:
        raise definition_error(f"T.{name}: memory_order must be one of relaxed, acquire, "
                               f"release, acq_rel, seq_cst, got {memory_order!r}")
    if isinstance(dst, (BufferRef, RegionRef)):
        raise definition_error(f"TileLang feature T.{name} on a whole tile is not supported by "
                               f"tiled: name one element, {name}(buf[i, ...], value), inside "
                               "a T.Parallel loop")
    if not isinstance(dst, Element):
        raise definition_error(f"T.{name}: the destination must be an element, buf[i, ...]")
    stmt = pb.Stmt()
    stmt.atomic_add.buffer = dst.buffer.bid
    stmt.atomic_add.op = op
    stmt.atomic_add.order = _ORDERS[memory_order]
    for i in dst.indices:
        stmt.atomic_add.indices.add().CopyFrom(index_expr(i).node)
    stmt.atomic_add.value.CopyFrom(cast(value, dst.buffer.dtype).node)
    prev = None
    if _flag(return_prev, f"T.{name}: return_prev"):
        prev = alloc_var(dst.buffer.dtype)  # the old value, a per-thread scalar
        stmt.atomic_add.has_prev, stmt.atomic_add.prev = True, prev.bid
    current().emit(stmt)
    return prev


def atomic_add(dst, value, memory_order: str | None = None, return_prev: bool = False):
    """dst += value atomically across threads and blocks; `dst` is an element of a global or
    shared buffer. `memory_order` (relaxed by default; acquire, release, acq_rel, seq_cst)
    orders the block's other global memory accesses against other blocks' at device scope:
    outside a T.Parallel loop one thread of the block updates the element, and a release
    covers every access the block made before it, an acquire every one it makes after.
    With `return_prev` it returns the element's value before the update (in every thread).

    >>> T.atomic_add(Out[bx], partial[0])
    >>> done = T.atomic_add(Count[bx], 1, memory_order="acq_rel", return_prev=True)
    """
    return _atomic(pb.ATOMIC_ADD, "atomic_add", dst, value, memory_order, return_prev)


def atomic_max(dst, value, memory_order: str | None = None, return_prev: bool = False):
    """dst = max(dst, value) atomically across threads and blocks; `dst` is an element of a
    global or shared buffer of ints or floats. `value` replaces the stored value only when it
    compares greater, as IEEE compares: a NaN on either side changes nothing, -0.0 equals
    +0.0. `memory_order` and `return_prev` as T.atomic_add's.

    >>> T.atomic_max(AMax[0], T.abs(x_local[i]))
    """
    return _atomic(pb.ATOMIC_MAX, "atomic_max", dst, value, memory_order, return_prev)


def atomic_min(dst, value, memory_order: str | None = None, return_prev: bool = False):
    """dst = min(dst, value) atomically across threads and blocks (as T.atomic_max).

    >>> T.atomic_min(Lo[bx % 4], x_local[i])
    """
    return _atomic(pb.ATOMIC_MIN, "atomic_min", dst, value, memory_order, return_prev)

