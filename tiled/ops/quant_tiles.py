"""The tensor-core forms of tiled.ops.quant's weight-only linears (`tile`, `swap`, `regs`,
`regs_g` for 4-bit GPTQ weights; `tile`, `swap` for 8-bit ones: see tiled.ops.quant for what
each does and how they are tuned), and the nibble arithmetic every form shares: a 4-bit value
made a float without an int-to-float conversion (`_nibble`, `_nibble_at`; `_MAGIC16` for
16-bit arithmetic)."""

import tiled
import tiled.lang as T

TILE_BK = 64  # K values per tile step: eight GPTQ words


def _magic(Md):
    """The bits of the float 2^23 (0x4B000000) as a value the CUDA compiler cannot fold: a
    nibble masked and or-ed with it is one LOP3 when the constant sits in a register (two
    when both the mask and the constant are immediates, as ptxas leaves them: 130 LOP3 for
    the 64 nibbles of a decode loop iteration instead of 66). min(M - 1, 0) is 0 in every
    launched block (M >= 1 there) and TVM, knowing only M >= 0, keeps it."""
    return T.min(Md - 1, 0) + 0x4B000000


def _nibble(word, i: int, zero, magic):
    """(q - zero) in float32 for the i-th nibble q of an int32 GPTQ word; zero None: 8. The
    nibble or-ed into the bits of the float 2^23 (`magic`, _magic) reads as 2^23 + q, so one
    subtraction gives it, exactly, without an int-to-float conversion (a quarter-rate
    instruction on NVIDIA GPUs, the bound of a dequantizing GEMV's inner loop)."""
    q = ((word >> (4 * i)) & 15) if i else (word & 15)
    f = T.reinterpret("float32", q | magic)
    return f - 8388616.0 if zero is None else (f - 8388608.0) - zero


def _nibble_at(word, i: int, magic):
    """q * 16^j for the i-th nibble q of an int32 word, j = i for i < 5, else i - 5: the
    nibble masked in place (the low three shifted down by 20 first) and or-ed into the bits of
    the float 2^23 (`magic`), minus 2^23, exactly; one integer instruction for most nibbles.
    XS's tokens are staged times 16^-j to match."""
    src, j = (word, i) if i < 5 else (word >> 20, i - 5)
    f = T.reinterpret("float32", (src & (15 << (4 * j))) | magic)
    return f - 8388608.0


def _output(Md, N: int, out_dtype: str, splits: int):
    """(Y's tensor type, the grid's extra axis): Y [M, N] in out_dtype, or with `splits` > 1
    float32 partials [splits, M, N] over a third grid axis."""
    if splits == 1:
        return T.Tensor((Md, N), out_dtype), ()
    return T.Tensor((splits, Md, N), "float32"), (splits,)


def _w4_tile_kernel(N, K, dtype, out_dtype, bits, group_size, zeros, BM, BN, threads, stages,
                    splits=1, swap=False, regs=False, SR=0):
    """Y = X @ W.T in BM x BN tiles: per 64-deep K step, X's tile and W's eight words per
    column copied to shared memory (cp.async: the T.Pipelined loop runs them `stages` ahead),
    the words unpacked, scaled and cast into a 16-bit shared tile of W, then T.gemm (tensor
    cores) accumulates in float32; `splits` > 1 splits K over a grid axis into float32
    partials (as the lanes form).

    `swap`: Y^T = W X^T in BN x BM tiles, so that the weights fill the MMA's rows and a few
    tokens its columns (on sm_90a: wgmma with N = BM, 16 or 32, where an unswapped 16-token
    tile cannot take wgmma, whose rows come 64 a warpgroup). W's tile is then [BN, 64], K
    contiguous as a K-major operand wants it, so each word's eight values land side by side
    in one row (8-byte stores in the SASS) where the unswapped [64, BN] tile takes eight
    2-byte ones.

    `regs` (with `swap`): W's tile a fragment instead, each value unpacked from its word
    where T.gemm's register operand wants it (wgmma's RS form on sm_90a): no shared tile of
    W, no barrier between unpacking and MMA; a thread reads each word for the two values of
    it it holds."""
    if bits != 4:
        raise ValueError("the tile form takes 4-bit weights")
    if K % (TILE_BK * splits) or group_size % TILE_BK:
        raise ValueError(f"K = {K} / group size {group_size} do not hold whole {TILE_BK}-deep "
                         f"steps in {splits} splits")
    Md = T.dyn("M")
    KW, G = K // 8, K // group_size
    per = K // TILE_BK // splits  # steps per split
    zt = T.Tensor((G, N), dtype) if zeros else T.Tensor((1,), dtype)
    out, extra = _output(Md, N, out_dtype, splits)

    @tiled.kernel
    def linear_w4a16_tile(X: T.Tensor((Md, K), dtype), Wq: T.Tensor((KW, N), "int32"),
                          S: T.Tensor((G, N), dtype), Z: zt, Y: out):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), *extra, threads=threads) as grid:
            bx, by = grid[0], grid[1]
            bz = grid[2] if splits > 1 else 0
            xs = T.alloc_shared((BM, TILE_BK), dtype)
            wq = T.alloc_shared((TILE_BK // 8, BN), "int32")
            if regs:
                ws = T.alloc_fragment((BN, TILE_BK), dtype)
            else:
                ws = T.alloc_shared((BN, TILE_BK) if swap else (TILE_BK, BN), dtype)
            word = T.alloc_var("int32")
            rows = _GroupRows(S, Z, N, BN, dtype, zeros, SR)
            if SR:  # the scale in registers before the stores: read from shared memory
                # between them, nvcc would not merge a word's eight 2-byte stores
                scale, zs = T.alloc_var("float32"), T.alloc_var("float32")
            acc = T.alloc_fragment((BN, BM) if swap else (BM, BN), "float32")
            T.clear(acc)
            magic = _magic(Md)
            for kk in T.Pipelined(per, num_stages=stages):
                k = bz * per + kk
                T.copy(X[by * BM, k * TILE_BK], xs)
                T.copy(Wq[k * (TILE_BK // 8), bx * BN], wq)
                g = k * TILE_BK // group_size
                rows.step(g, bx * BN)
                if regs:  # value by value, over the fragment's own elements
                    for n, kq in T.Parallel(BN, TILE_BK):
                        q = (wq[kq // 8, n] >> (kq % 8 * 4)) & 15
                        f = T.reinterpret("float32", q | magic) - 8388608.0  # q, exactly
                        zero = T.cast(rows.zero(n), "float32") if zeros else 8.0
                        ws[n, kq] = T.cast((f - zero) * T.cast(rows.scale(n), "float32"), dtype)
                else:
                    for kw, n in T.Parallel(TILE_BK // 8, BN):
                        word = wq[kw, n]  # one shared load for the word's eight values
                        scale = T.cast(rows.scale(n), "float32")
                        zs = scale * (T.cast(rows.zero(n), "float32") if zeros else 8.0)
                        for i in range(8):
                            # (q * 16^j) * (scale * 16^-j) - zero * scale: (q - zero) * scale
                            # (j as in _nibble_at; one rounding for the symmetric zero 8)
                            j = i if i < 5 else i - 5
                            w = T.cast(_nibble_at(word, i, magic) * (scale * (1.0 / 16 ** j)) - zs,
                                       dtype)
                            if swap:
                                ws[n, kw * 8 + i] = w
                            else:
                                ws[kw * 8 + i, n] = w
                if swap:
                    T.gemm(ws, xs, acc, transpose_B=True)
                else:
                    T.gemm(xs, ws, acc)
            if swap:  # over acc's own rows and columns (its layout)
                for n, m in T.Parallel(BN, BM):
                    if splits > 1:
                        Y[bz, by * BM + m, bx * BN + n] = acc[n, m]
                    else:
                        Y[by * BM + m, bx * BN + n] = T.cast(acc[n, m], out_dtype)
            elif splits > 1:
                T.copy(acc, Y[bz, by * BM, bx * BN])
            else:
                T.copy(acc, Y[by * BM, bx * BN])

    return linear_w4a16_tile


class _GroupRows:
    """A K step's scales (and zero points) of a tile's BN columns, for group g: read from
    global memory where the step uses them (SR=0), or (SR=1) copied into shared tiles in the
    pipelined loop beside X and W, so that a TMA producer loads them stages ahead and the
    consumers read shared memory where a global load waited out its latency in the step (on
    sm_90a such a loop's copies all run ahead: the form takes the warp-specialized path).
    Made inside the kernel (its shared tiles); step() inside the loop, before the reads."""

    def __init__(self, S, Z, N, BN, dtype, zeros, ring):
        self.S, self.Z, self.N, self.ring = S, Z, N, ring
        self.ss = T.alloc_shared((BN,), dtype) if ring else None
        self.zz = T.alloc_shared((BN,), dtype) if ring and zeros else None
        self.g = self.n0 = None

    def step(self, g, n0):
        self.g, self.n0 = g, n0
        if self.ring:
            T.copy(self.S[g, n0], self.ss)
            if self.zz is not None:
                T.copy(self.Z[g, n0], self.zz)

    def scale(self, n):
        return self.ss[n] if self.ring else self.S[self.g, T.min(self.n0 + n, self.N - 1)]

    def zero(self, n):
        return self.zz[n] if self.ring else self.Z[self.g, T.min(self.n0 + n, self.N - 1)]


# 16-bit floats whose bits or-ed with a nibble q read as BASE + q, exactly (float16: 1024 + q,
# 0x6400; bfloat16: 128 + q, 0x4300: both have the mantissa bits for it).
_MAGIC16 = {"float16": (0x6400, 1024.0), "bfloat16": (0x4300, 128.0)}


def _w4_group_kernel(N, K, dtype, out_dtype, group_size, zeros, BM, BN, threads, stages,
                     splits=1, SR=0):
    """Y^T = W X^T as the regs form (BN x BM tiles, W's tile T.gemm's register operand),
    one quantization group per K step: each value is the nibble or-ed into a 16-bit float's
    bits (_MAGIC16: BASE + q) minus BASE + zero, q - zero exactly in 16-bit arithmetic, with
    no float32 work per weight; the group's product (float32, cleared each step) is then
    scaled by its column's scale once per output element. group_size 64 or 128 (the K
    step); symmetric weights only (zero 8: BASE + 8 is exact, a fractional zero point next
    to BASE would not be)."""
    if group_size not in (64, 128) or K % (group_size * splits):
        raise ValueError(f"regs_g steps over whole groups of 64 or 128; group size "
                         f"{group_size}, K = {K}, {splits} splits")
    if dtype not in _MAGIC16:
        raise ValueError(f"regs_g unpacks into float16 or bfloat16, not {dtype}")
    if zeros:  # BASE + zero would round a fractional zero point to an integer
        raise ValueError("regs_g takes symmetric weights (zeros=None) only")
    magic, base = _MAGIC16[dtype]
    Md = T.dyn("M")
    KW, G = K // 8, K // group_size
    per = G // splits  # groups (steps) per split
    out, extra = _output(Md, N, out_dtype, splits)

    @tiled.kernel
    def linear_w4a16_group(X: T.Tensor((Md, K), dtype), Wq: T.Tensor((KW, N), "int32"),
                           S: T.Tensor((G, N), dtype), Z: T.Tensor((1,), dtype), Y: out):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), *extra, threads=threads) as grid:
            bx, by = grid[0], grid[1]
            bz = grid[2] if splits > 1 else 0
            xs = T.alloc_shared((BM, group_size), dtype)
            wq = T.alloc_shared((group_size // 8, BN), "int32")
            ws = T.alloc_fragment((BN, group_size), dtype)
            part = T.alloc_fragment((BN, BM), "float32")
            acc = T.alloc_fragment((BN, BM), "float32")
            rows = _GroupRows(S, Z, N, BN, dtype, False, SR)
            T.clear(acc)
            for kk in T.Pipelined(per, num_stages=stages):
                g = bz * per + kk
                T.copy(X[by * BM, g * group_size], xs)
                T.copy(Wq[g * (group_size // 8), bx * BN], wq)
                rows.step(g, bx * BN)
                for n, kq in T.Parallel(BN, group_size):
                    q = (wq[kq // 8, n] >> (kq % 8 * 4)) & 15
                    ws[n, kq] = T.reinterpret(dtype, T.cast(q | magic, "int16")) - \
                        T.cast(base + 8.0, dtype)
                T.gemm(ws, xs, part, transpose_B=True, clear_accum=True)
                for n, m in T.Parallel(BN, BM):
                    acc[n, m] += part[n, m] * T.cast(rows.scale(n), "float32")
            for n, m in T.Parallel(BN, BM):
                if splits > 1:
                    Y[bz, by * BM + m, bx * BN + n] = acc[n, m]
                else:
                    Y[by * BM + m, bx * BN + n] = T.cast(acc[n, m], out_dtype)

    return linear_w4a16_group


def _w8_tile_kernel(N, K, dtype, out_dtype, BM, BN, threads, stages, splits=1, swap=False):
    """Y = X @ W.T for int8 W [N, K] (as int32 words [N, K / 4]) in BM x BN tiles: per 64-deep
    K step, X's tile and W's 64 bytes per row copied to shared memory (coalesced along K;
    the T.Pipelined loop runs them `stages` ahead), the bytes cast into a 16-bit [BN, 64]
    tile (exact: int8 values are 16-bit floats), T.gemm (tensor cores) with float32
    accumulation, and each column's scale applied once, after the loop (per-channel scales
    commute with the sum over K); `splits` > 1 as the other forms. `swap`: Y^T = W X^T, the
    weight tile as the MMA's rows and the BM tokens as its columns (as _w4_tile_kernel's)."""
    if K % (TILE_BK * splits):
        raise ValueError(f"K = {K} does not hold whole {TILE_BK}-deep steps in {splits} splits")
    Md = T.dyn("M")
    KW, WB = K // 4, TILE_BK // 4  # words per row of W, per step
    per = K // TILE_BK // splits  # steps per split
    out, extra = _output(Md, N, out_dtype, splits)

    @tiled.kernel
    def linear_w8a16_tile(X: T.Tensor((Md, K), dtype), Wq: T.Tensor((N, KW), "int32"),
                          S: T.Tensor((N,), dtype), Z: T.Tensor((1,), dtype), Y: out):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), *extra, threads=threads) as grid:
            bx, by = grid[0], grid[1]
            bz = grid[2] if splits > 1 else 0
            xs = T.alloc_shared((BM, TILE_BK), dtype)
            wq = T.alloc_shared((BN, WB), "int32")
            ws = T.alloc_shared((BN, TILE_BK), dtype)
            word = T.alloc_var("int32")
            acc = T.alloc_fragment((BN, BM) if swap else (BM, BN), "float32")
            T.clear(acc)
            for kk in T.Pipelined(per, num_stages=stages):
                k = bz * per + kk
                T.copy(X[by * BM, k * TILE_BK], xs)
                T.copy(Wq[bx * BN, k * WB], wq)
                for n, kw in T.Parallel(BN, WB):
                    word = wq[n, kw]  # one shared load for the word's four values
                    for i in range(4):  # sign-extended bytes, lowest first
                        ws[n, kw * 4 + i] = T.cast((word << (24 - 8 * i)) >> 24, dtype)
                if swap:
                    T.gemm(ws, xs, acc, transpose_B=True)
                else:
                    T.gemm(xs, ws, acc, transpose_B=True)

            def put(m, n, a):
                v = a * T.cast(S[T.min(bx * BN + n, N - 1)], "float32")
                if splits > 1:
                    Y[bz, by * BM + m, bx * BN + n] = v
                else:
                    Y[by * BM + m, bx * BN + n] = T.cast(v, out_dtype)

            if swap:  # over acc's own rows and columns (its layout)
                for n, m in T.Parallel(BN, BM):
                    put(m, n, acc[n, m])
            else:
                for m, n in T.Parallel(BM, BN):
                    put(m, n, acc[m, n])

    return linear_w8a16_tile
