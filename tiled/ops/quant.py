"""Weight-only quantized linears in tiled.ops (this module, tiled.ops.quant): 16-bit activations
times 4- or 8-bit weights, dequantized in the main loop.

    linear_w4a16(x, qweight, scales, zeros=None, group_size=128) -> x @ W.T
        qweight int32 [K / 8, N], GPTQ's packing: word [k8, n] holds W[n, 8 k8 .. 8 k8 + 7]
        as eight 4-bit values, the lowest nibble first; scales [K / group_size, N] in x's
        dtype; W[n, k] = (q - z) * scales[k / group_size, n] with z = 8 when `zeros` is None
        (symmetric: vLLM's uint4b8), else zeros[k / group_size, n] (unpacked zero points, in
        the scales' dtype).
    linear_w8a16(x, qweight, scales) -> x @ W.T
        qweight int8 [N, K] (F.linear's layout), scales [N] per output channel:
        W[n, k] = qweight[n, k] * scales[n].

Kernels (tuned by tiled.autotune per token bucket, the token count symbolic):
- `lanes`: each lane owns consecutive output columns and walks K, unpacking its 16-byte
  weight vectors in registers and multiplying them by the block's tokens in float32 (no MMA:
  for decode the weights' bytes are the cost); `splits` > 1 splits K over a grid axis into
  float32 partials that tiled.ops' splitk_sum adds up, as tiled.ops.linear does;
- `tile` (4-bit from 8 tokens, 8-bit from 1): the weights of each 64-deep K step unpacked
  into a 16-bit shared tile that T.gemm multiplies with the tokens' tile (8-bit: the
  channel scales applied after the loop); `splits` as the lanes form;
- `swap` (as `tile`): the tile form transposed, Y^T = W X^T, the weights' tile the MMA's
  rows and the tokens its 16 to 64 columns (wgmma on sm_90a, where a 16-token tile of the
  tile form takes mma.sync);
- `regs` (4-bit, as `swap`): the weights unpacked straight into the MMA's register operand
  (a fragment: wgmma's RS form on sm_90a), no 16-bit shared tile, no barrier between the
  unpacking and the MMA;
- `regs_g` (4-bit symmetric, as `regs`): one group of K per step, its values unpacked as
  q - 8 in 16-bit arithmetic, exactly, with no float32 work per weight; the group's product
  is scaled once per output element after the MMA (_w4_group_kernel).
All unpack a nibble without an int-to-float conversion (`_nibble`, the 16-bit magic of
_MAGIC16).
"""

import tiled
import tiled.lang as T
from tiled.ops.gemm import run_split_k, token_bucket
from tiled.ops.tuned import TunedOp

# lanes (CUDA cores): BM tokens per block, BN columns per block, threads, splits, WPI: 32-bit
# words per column and step (8 * WPI K values for w4, 4 * WPI for w8), KG: lane groups that
# each take 1 / KG of a split's K (threads = KG * BN / 4), XS: the split's tokens staged in
# shared memory as float32 (4-bit: scaled for _nibble_at, with their 8-sums). tile (w4 only): BM x
# BN output tiles over 64-deep K steps (split `splits` ways), the weights dequantized into a
# 16-bit shared tile that T.gemm multiplies (tensor cores); swap: the same transposed, BN x BM
# tiles of Y^T = W X^T (_w4_tile_kernel, _w8_tile_kernel).
CUDA_SPACE = [*({"kind": "lanes", "BM": bm, "BN": bn, "threads": t, "splits": s, "WPI": 2}
                for bm in (1, 2, 4, 8, 16) for bn, t in ((512, 128), (1024, 256))
                for s in (1, 2, 4, 8)),
              # decode: more blocks (16, 32 splits), more bytes in flight per lane (4 words),
              # more warps per block (KG lane groups over a split's K, summed in shared)
              *({"kind": "lanes", "BM": bm, "BN": bn, "threads": t, "splits": s, "WPI": wpi}
                for bm in (1, 2) for bn, t in ((512, 128), (1024, 256))
                for s, wpi in ((16, 2), (32, 2), (4, 4), (8, 4), (16, 4))),
              *({"kind": "lanes", "BM": bm, "BN": bn, "threads": t, "splits": s, "WPI": 2,
                 "KG": kg, "XS": xs}
                for bm in (1, 2) for bn, t, kg in ((512, 256, 2), (512, 512, 4), (1024, 512, 2),
                                                    (512, 1024, 8), (256, 512, 8))
                for s in (4, 8, 16) for xs in (0, 1)),
              # twice the bytes in flight a lane, tokens staged
              *({"kind": "lanes", "BM": 1, "BN": bn, "threads": t, "splits": s, "WPI": 4,
                 "KG": kg, "XS": 1}
                for bn, t, kg in ((512, 512, 4), (512, 1024, 8), (256, 512, 8))
                for s in (2, 4, 8, 16)),
              *({"kind": "tile", "BM": bm, "BN": bn, "threads": t, "stages": 2, "splits": s}
                for bm in (16, 64, 128) for bn, t in ((128, 128), (256, 256))
                for s in (1, 4, 8)),
              # swapped tiles: BN weight columns as the MMA's rows (wgmma on sm_90a from 16
              # tokens), BM tokens as its columns
              *({"kind": "swap", "BM": bm, "BN": bn, "threads": t, "stages": 2, "splits": s}
                for bm in (16, 32, 64) for bn, t in ((64, 128), (128, 128), (128, 256))
                for s in (1, 4, 8)),
              # swapped, the weights unpacked into the MMA's register operand and scaled per
              # group after it (the plain regs form, never the fastest of the three forms on
              # the H100: results/w4_regs_g_probe_h100.json, is not in the space)
              *({"kind": "regs_g", "BM": bm, "BN": bn, "threads": t, "stages": 2, "splits": s}
                for bm in (16, 32, 64) for bn, t in ((64, 128), (128, 128), (128, 256))
                for s in (1, 4, 8))]
CPU_SPACE = [*({"kind": "lanes", "BM": bm, "BN": 64, "threads": 32, "splits": 1, "WPI": 1}
               for bm in (1, 2, 4, 8, 16)),
             {"kind": "lanes", "BM": 4, "BN": 64, "threads": 32, "splits": 2, "WPI": 2},
             {"kind": "lanes", "BM": 1, "BN": 64, "threads": 32, "splits": 2, "WPI": 1, "KG": 2},
             {"kind": "lanes", "BM": 2, "BN": 64, "threads": 32, "splits": 2, "WPI": 2, "KG": 2,
              "XS": 1},
             {"kind": "tile", "BM": 16, "BN": 32, "threads": 32, "stages": 2},
             {"kind": "tile", "BM": 16, "BN": 32, "threads": 32, "stages": 2, "splits": 2}]
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


def _fits(cfg: dict, M: int, bits: int) -> bool:
    """lanes: BM the power of two covering M (16 past 16 tokens); tile, swap: BM at most twice M's
    bucket, from 8 tokens for 4-bit weights (lanes read them at the memory's speed below
    that) and from 1 for 8-bit ones (lanes walk a row of W [N, K] per lane: uncoalesced)."""
    if cfg.get("kind", "lanes") in ("tile", "swap", "regs", "regs_g"):
        return (M >= 8 or bits == 8) and cfg["BM"] <= max(16, 2 * M)
    m = min(M, 16)
    return m <= cfg["BM"] < 2 * m


def _output(Md, N: int, out_dtype: str, splits: int):
    """(Y's tensor type, the grid's extra axis): Y [M, N] in out_dtype, or with `splits` > 1
    float32 partials [splits, M, N] over a third grid axis."""
    if splits == 1:
        return T.Tensor((Md, N), out_dtype), ()
    return T.Tensor((splits, Md, N), "float32"), (splits,)


def quant_linear_kernel(M, N, K, dtype, out_dtype, bits, group_size, zeros, kind="lanes",
                        BM=1, BN=512, threads=128, splits=1, WPI=2, stages=2, KG=1, XS=0):
    """The kernel of one config (M only selects: the kernel's M is symbolic). bits 4: GPTQ
    words [K / 8, N] with group scales (and zeros); bits 8: int8 [N, K] with channel
    scales."""
    if not _fits({"kind": kind, "BM": BM}, M, bits):
        raise ValueError(f"a {kind} {BM}-token tile is not for M = {M}")
    if kind in ("regs", "regs_g") and bits != 4:
        raise ValueError(f"the {kind} form takes 4-bit weights")
    if kind == "regs_g":
        return _w4_group_kernel(N, K, dtype, out_dtype, group_size, zeros, BM, BN, threads,
                                stages, splits)
    if kind in ("tile", "swap") and bits == 8:
        return _w8_tile_kernel(N, K, dtype, out_dtype, BM, BN, threads, stages, splits,
                               swap=kind == "swap")
    if kind in ("tile", "swap", "regs"):
        return _w4_tile_kernel(N, K, dtype, out_dtype, bits, group_size, zeros, BM, BN,
                               threads, stages, splits, swap=kind != "tile",
                               regs=kind == "regs")
    per_word = 8 if bits == 4 else 4  # K values per 32-bit word
    if K % (per_word * WPI * splits * KG):
        raise ValueError(f"K = {K} does not split into {splits} x {KG} x {WPI}-word steps")
    if bits == 4 and (group_size % (per_word * WPI) or K % group_size):
        raise ValueError(f"group size {group_size} does not hold whole {WPI}-word steps of K "
                         f"= {K}")
    Md = T.dyn("M")
    KW = K // per_word
    per = KW // WPI // splits  # steps per split
    KS = K // splits  # K values per split
    if XS and (bits != 4 or BM * KS * 4 * 9 // 8 > 96 << 10):
        raise ValueError(f"XS stages 4-bit tokens' {BM} x {KS} split in shared memory: "
                         "too large" if bits == 4 else "XS is for 4-bit weights")
    out, extra = _output(Md, N, out_dtype, splits)
    if bits == 4:
        G = K // group_size
        wt, st = T.Tensor((KW, N), "int32"), T.Tensor((G, N), dtype)
        zt = T.Tensor((G, N), dtype) if zeros else T.Tensor((1,), dtype)
    else:
        wt, st, zt = T.Tensor((N, KW), "int32"), T.Tensor((N,), dtype), T.Tensor((1,), dtype)

    @tiled.kernel
    def linear_wq(X: T.Tensor((Md, K), dtype), Wq: wt, S: st, Z: zt, Y: out):
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(Md, BM), *extra, threads=threads) as g:
            bx, by = g[0], g[1]
            bz = g[2] if splits > 1 else 0
            acc = T.alloc_fragment((BM, BN) if KG == 1 else (KG, BM, BN), "float32")
            T.clear(acc)
            if XS:  # the split's tokens in float32, nibble-scaled, and their 8-sums
                xs = T.alloc_shared((BM, KS), "float32")
                xsum = T.alloc_shared((BM, KS // 8), "float32")
                for m, k in T.Parallel(BM, KS):
                    j = k % 8
                    j = T.if_then_else(j < 5, j, j - 5)  # the nibble's place in _nibble_at
                    xs[m, k] = T.cast(X[by * BM + m, bz * KS + k], "float32") * \
                        T.reinterpret("float32", (127 - 4 * j) << 23)  # 16^-j
                for m, k8 in T.Parallel(BM, KS // 8):
                    t = 0.0
                    for i in range(8):
                        t = t + T.cast(X[by * BM + m, bz * KS + k8 * 8 + i], "float32")
                    xsum[m, k8] = t

            magic = _magic(Md)

            def term(step, kg, m, n):
                """This step's sum of (dequantized weight x token) for column n, token m."""
                col = bx * BN + n
                row = by * BM + m
                total = 0.0
                for u in range(WPI):
                    # the word's index along K: split bz, lane group kg, step, word u
                    w = (bz * per + kg * (per // KG) + step) * WPI + u
                    k0 = w * per_word
                    if bits == 4 and XS:
                        word = Wq[w, col]
                        zero = T.cast(Z[k0 // group_size, col], "float32") if zeros else 8.0
                        kl = k0 - bz * KS  # in the split's staged tokens
                        part = 0.0
                        for i in range(8):
                            part = part + _nibble_at(word, i, magic) * xs[m, kl + i]
                        part = part - zero * xsum[m, kl // 8]
                        total = total + part * T.cast(S[k0 // group_size, col], "float32")
                    elif bits == 4:
                        word = Wq[w, col]
                        zero = T.cast(Z[k0 // group_size, col], "float32") if zeros else None
                        part = 0.0
                        for i in range(8):
                            part = part + _nibble(word, i, zero, magic) * \
                                T.cast(X[row, k0 + i], "float32")
                        total = total + part * T.cast(S[k0 // group_size, col], "float32")
                    else:
                        word = Wq[col, w]
                        for i in range(4):  # sign-extended bytes, lowest first
                            q = T.cast(((word << (24 - 8 * i)) >> 24), "float32")
                            total = total + q * T.cast(X[row, k0 + i], "float32")
                return total

            for step in T.serial(per // KG):
                if KG == 1:
                    for m, n in T.Parallel(BM, BN):
                        acc[m, n] += term(step, 0, m, n)
                else:  # KG lane groups, each over its own part of the split's K
                    for kg, m, n in T.Parallel(KG, BM, BN):
                        acc[kg, m, n] += term(step, kg, m, n)
            if KG > 1:  # the lane groups' sums through shared memory
                red = T.alloc_shared((KG, BM, BN), "float32")
                T.copy(acc, red)
            for m, n in T.Parallel(BM, BN):
                v = acc[m, n] if KG == 1 else red[0, m, n]
                for kg in range(1, KG):
                    v = v + red[kg, m, n]
                if bits == 8:
                    v = v * T.cast(S[bx * BN + n], "float32")
                if splits > 1:
                    Y[bz, by * BM + m, bx * BN + n] = v
                else:
                    Y[by * BM + m, bx * BN + n] = T.cast(v, out_dtype)

    return linear_wq


def _w4_tile_kernel(N, K, dtype, out_dtype, bits, group_size, zeros, BM, BN, threads, stages,
                    splits=1, swap=False, regs=False):
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
            acc = T.alloc_fragment((BN, BM) if swap else (BM, BN), "float32")
            T.clear(acc)
            magic = _magic(Md)
            for kk in T.Pipelined(per, num_stages=stages):
                k = bz * per + kk
                T.copy(X[by * BM, k * TILE_BK], xs)
                T.copy(Wq[k * (TILE_BK // 8), bx * BN], wq)
                g = k * TILE_BK // group_size
                if regs:  # value by value, over the fragment's own elements
                    for n, kq in T.Parallel(BN, TILE_BK):
                        col = T.min(bx * BN + n, N - 1)
                        q = (wq[kq // 8, n] >> (kq % 8 * 4)) & 15
                        f = T.reinterpret("float32", q | magic) - 8388608.0  # q, exactly
                        zero = T.cast(Z[g, col], "float32") if zeros else 8.0
                        ws[n, kq] = T.cast((f - zero) * T.cast(S[g, col], "float32"), dtype)
                else:
                    for kw, n in T.Parallel(TILE_BK // 8, BN):
                        word = wq[kw, n]  # one shared load for the word's eight values
                        col = T.min(bx * BN + n, N - 1)
                        scale = T.cast(S[g, col], "float32")
                        zs = scale * (T.cast(Z[g, col], "float32") if zeros else 8.0)
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


# 16-bit floats whose bits or-ed with a nibble q read as BASE + q, exactly (float16: 1024 + q,
# 0x6400; bfloat16: 128 + q, 0x4300: both have the mantissa bits for it).
_MAGIC16 = {"float16": (0x6400, 1024.0), "bfloat16": (0x4300, 128.0)}


def _w4_group_kernel(N, K, dtype, out_dtype, group_size, zeros, BM, BN, threads, stages,
                     splits=1):
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
            T.clear(acc)
            for kk in T.Pipelined(per, num_stages=stages):
                g = bz * per + kk
                T.copy(X[by * BM, g * group_size], xs)
                T.copy(Wq[g * (group_size // 8), bx * BN], wq)
                for n, kq in T.Parallel(BN, group_size):
                    q = (wq[kq // 8, n] >> (kq % 8 * 4)) & 15
                    ws[n, kq] = T.reinterpret(dtype, T.cast(q | magic, "int16")) - \
                        T.cast(base + 8.0, dtype)
                T.gemm(ws, xs, part, transpose_B=True, clear_accum=True)
                for n, m in T.Parallel(BN, BM):
                    acc[n, m] += part[n, m] * T.cast(S[g, T.min(bx * BN + n, N - 1)],
                                                     "float32")
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


def _bucket(M, N, K, dtype, out_dtype, bits, group_size, zeros):
    return (*token_bucket(M, N, K, dtype, out_dtype), bits, group_size, zeros)


def _inputs(M, N, K, dtype, out_dtype, bits, group_size, zeros, **config):
    import torch

    from tiled.jit import _torch_dtype

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    dt = _torch_dtype(torch, dtype)
    x = torch.randn(M, K, device=dev, generator=g).to(dt)
    if bits == 4:
        w = torch.randint(-2**31, 2**31 - 1, (K // 8, N), device=dev, generator=g,
                          dtype=torch.int32)
        s = (torch.rand(K // group_size, N, device=dev, generator=g) / K ** 0.5).to(dt)
        z = (torch.rand(K // group_size, N, device=dev, generator=g) * 15).to(dt) if zeros \
            else torch.zeros(1, device=dev, dtype=dt)
    else:
        w = torch.randint(-2**31, 2**31 - 1, (N, K // 4), device=dev, generator=g,
                          dtype=torch.int32)
        s = (torch.rand(N, device=dev, generator=g) / K ** 0.5).to(dt)
        z = torch.zeros(1, device=dev, dtype=dt)
    return [x, w, s, z, torch.zeros(M, N, device=dev, dtype=_torch_dtype(torch, out_dtype))]


def _run(kernel, config, args):
    """y by `kernel` of `config` into args' y: with splits, float32 partials that splitk_sum
    adds up (tiled.ops.gemm.run_split_k, as tiled.ops.linear's split-K)."""
    x, w, s, z, y = args
    return run_split_k(y, config.get("splits", 1), lambda out: kernel(x, w, s, z, out))


QUANT_LINEAR = TunedOp("quant_linear", quant_linear_kernel,
                       {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                       key=["M", "N", "K", "dtype", "out_dtype", "bits", "group_size", "zeros"],
                       bucket=_bucket, inputs=_inputs, run=_run)


def _activations(op: str, x, scales):
    from tiled.ops import _dtype, _rows

    dtype = _dtype(x, op)
    if dtype == "float32":
        raise TypeError(f"tiled.ops.{op}: float32 activations are not supported (bf16 or fp16)")
    if scales.dtype != x.dtype or scales.device != x.device:
        raise ValueError(f"tiled.ops.{op}: scales are {scales.dtype} on {scales.device}; "
                         f"expected x's {x.dtype} on {x.device}")
    return _rows(x.contiguous(), op), dtype


def _launch(op, x, x2, dtype, N, K, bits, group, zeros_t, qweight, scales):
    import torch

    M = x2.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M:
        tuned = QUANT_LINEAR.tuned(x, M, N, K, dtype, dtype, bits, group, zeros_t is not None)
        z = zeros_t if zeros_t is not None else scales.new_empty(1)  # (unread placeholder)
        _run(tuned.compiled, tuned.config, [x2, qweight.contiguous(), scales.contiguous(),
                                            z.contiguous(), y])
    return y.view(*x.shape[:-1], N)


def linear_w4a16(x, qweight, scales, zeros=None, group_size: int = 128):
    """x @ W.T for GPTQ-packed 4-bit W (module docstring), in x's dtype."""
    import torch

    op = "linear_w4a16"
    x2, dtype = _activations(op, x, scales)
    K = x.shape[-1]
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or qweight.shape[0] * 8 != K:
        raise ValueError(f"tiled.ops.{op}: qweight {tuple(qweight.shape)} {qweight.dtype} is "
                         f"not int32 [K / 8 = {K // 8}, N] for x's K = {K}")
    N = qweight.shape[1]
    if not isinstance(group_size, int) or group_size < 8 or group_size % 8 or K % group_size:
        raise ValueError(f"tiled.ops.{op}: group_size {group_size!r} is not a multiple of 8 "
                         f"dividing K = {K}")
    G = K // group_size
    if tuple(scales.shape) != (G, N):
        raise ValueError(f"tiled.ops.{op}: scales {tuple(scales.shape)}, expected {(G, N)}")
    if zeros is not None and (tuple(zeros.shape) != (G, N) or zeros.dtype != scales.dtype or
                              zeros.device != x.device):
        raise ValueError(f"tiled.ops.{op}: zeros {tuple(zeros.shape)} {zeros.dtype}, expected "
                         f"{(G, N)} {scales.dtype} (unpacked zero points) on {x.device}")
    if qweight.device != x.device:
        raise ValueError(f"tiled.ops.{op}: qweight is on {qweight.device}, x on {x.device}")
    return _launch(op, x, x2, dtype, N, K, 4, group_size, zeros, qweight, scales)


def linear_w8a16(x, qweight, scales):
    """x @ W.T for int8 W [N, K] with per-output-channel scales [N], in x's dtype."""
    import torch

    op = "linear_w8a16"
    x2, dtype = _activations(op, x, scales)
    K = x.shape[-1]
    if qweight.dtype != torch.int8 or qweight.dim() != 2 or qweight.shape[1] != K or K % 4:
        raise ValueError(f"tiled.ops.{op}: qweight {tuple(qweight.shape)} {qweight.dtype} is "
                         f"not int8 [N, K = {K}] (K a multiple of 4)")
    N = qweight.shape[0]
    if tuple(scales.shape) != (N,):
        raise ValueError(f"tiled.ops.{op}: scales {tuple(scales.shape)}, expected ({N},)")
    if qweight.device != x.device:
        raise ValueError(f"tiled.ops.{op}: qweight is on {qweight.device}, x on {x.device}")
    words = qweight.contiguous().view(torch.int32)  # [N, K / 4]: four bytes a word
    return _launch(op, x, x2, dtype, N, K, 8, 0, None, words, scales)
