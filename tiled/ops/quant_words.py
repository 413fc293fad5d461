"""The register forms of the quantized GEMMs whose K is reordered so that a thread unpacks
whole words (`regs_w`, tiled.ops.quant): 4-bit GPTQ words (_w4_words_kernel: a word's eight
values are the eight operand positions a thread holds in a 32-wide chunk of K) and int8
words (_w8_words_kernel: four bytes over 16-deep blocks), both swapped (Y^T = W X^T, the
weights wgmma's register operand) and built by _swapped, which also adds split partials up
in the kernel (sum="last")."""

import tiled
import tiled.lang as T
from tiled.ops.quant_tiles import _MAGIC16, TILE_BK, _GroupRows, _output
from tiled.ops.split_k import add_up_last


def _pair_of(p):
    """regs_w's order of K inside each 32-wide chunk of a step: which of its word's four nibble
    pairs (e: nibbles e and e + 4, at bits 4e and 4e + 16) position p of the MMA's K takes.
    wgmma's register operand gives a thread, in each 16-deep K block, positions 2i, 2i + 1
    and 2i + 8, 2i + 9 (i its lane in the quad), each pair one 32-bit register; e walks them,
    so the thread's eight positions of a 32-wide chunk hold one word's eight values."""
    return (p % 32) // 16 * 2 + (p % 16) // 8


def _word_of(p):
    """The word (within the step's K / 8 of a column) whose nibble position p holds."""
    return p // 32 * 4 + (p % 8) // 2


def _k_of(p):
    """The K index (within the step) that position p of the MMA's K holds in regs_w's order:
    nibble e + 4 (p % 2) of word _word_of(p), the low half of the register pair the nibble
    pair e, the high half nibble e + 4."""
    return _word_of(p) * 8 + _pair_of(p) + p % 2 * 4


def mma_k(p):
    """The K index whose value position p of the "mma" layout's words holds (p = 8 w + s:
    word w's nibble s; mma_order_words): in its 32-deep chunk, word i's nibble e + 4h holds
    K position 16 (e // 2) + 8 (e % 2) + 2i + h. Python ints, DSL expressions or torch
    tensors."""
    s, i = p % 8, (p % 32) // 8
    return p // 32 * 32 + (s % 4) // 2 * 16 + s % 2 * 8 + 2 * i + s // 4


def mma_col(row, n):
    """Where the "mma" layout stores column n's word of row `row` (the row's index along
    K / 8): inside each 32-column block, rotated by 8 columns a row (row % 4). A warp of the
    regs_p form reads, per load, 8 columns (its quads) of 4 consecutive rows (a quad's lanes:
    a word a lane, rows 128 words apart in the shared tile); unrotated, the four rows' words
    of a column share a bank (4-way conflicts), rotated, the 32 lanes take 32 banks. The
    lanes form reads rotated rows too: runs of 8 columns stay together (16-byte loads)."""
    return n // 32 * 32 + (n % 32 + 8 * (row % 4)) % 32


def mma_order_words(qweight):
    """GPTQ's 4-bit words (int32 [K / 8, N], eight values along K a word, the lowest nibble
    first) with the nibbles of each 32-deep chunk of a column moved to where regs_w's
    unpacking takes them (the `regs_p` form): word i of the chunk holds, at nibble e + 4h,
    the value of K position 16 (e // 2) + 8 (e % 2) + 2i + h, which is the MMA position that
    nibble feeds, so X's tile needs no reordering; and each row's words rotated inside their
    32-column blocks (mma_col), so that the form's shared loads meet no bank conflict. Done
    once, at load time (as serving stacks repack GPTQ weights for Marlin-style kernels); a
    torch tensor like qweight's, on its device. N a multiple of 32. The scales and zero
    points keep their layout (a group holds whole chunks)."""
    import torch

    K8, N = qweight.shape
    if (8 * K8) % 32 or N % 32:
        raise ValueError(f"K = {8 * K8} and N = {N} must be whole numbers of 32-deep chunks "
                         "and 32-column blocks")
    w = qweight.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(8, device=w.device) * 4
    nibbles = ((w[:, None, :] >> shifts[None, :, None]) & 15).reshape(8 * K8, N)  # [K, N]
    src = mma_k(torch.arange(8 * K8, device=w.device))  # each destination's K
    moved = nibbles[src].reshape(K8, 8, N) << shifts[None, :, None]
    words = moved.sum(dim=1)  # disjoint nibbles: the sum is their or
    rows = torch.arange(K8, device=w.device)[:, None]
    out = torch.empty_like(words)
    out.scatter_(1, mma_col(rows, torch.arange(N, device=w.device)[None, :]).expand(K8, N),
                 words)
    return (out - ((out >> 31) << 32)).to(torch.int32)


def _w4_words_kernel(N, K, dtype, out_dtype, group_size, zeros, BM, BN, threads, stages,
                     splits=1, sum="kernel", SR=0, packed=False, H=1):
    """regs_g with K reordered so that a thread unpacks whole words, two values an
    instruction: within each 32-wide chunk of a step, the MMA's K positions a thread holds in
    its register operand (_pair_of) take the eight values of one word, positions 2i and 2i + 1
    nibbles e and e + 4, so one mask of the word (`& 0x000F000F`, the nibbles at bits 0 and
    16), or-ed into the bits of BASE in both halves, is the register's two 16-bit values
    BASE + q (the CUDA lowering stores such a pair as one 32-bit value: targets/cuda/halves.py)
    and one HADD2 (HFMA2) makes them q - 8. For float16 the pairs at bits 4-7 / 20-23 are
    masked in place and scaled by 1/16 (1024 + 16q is exact), so a word takes one shift, four
    masks and four 16-bit pair operations; bfloat16's 7 mantissa bits take each pair shifted
    down. X's tile is reordered the same way (a shared-to-shared copy per step: the sum over
    K does not depend on its order); the group's product is scaled after the MMA as regs_g's.
    With `zeros` each pair is q exactly (minus BASE / 16^j), then minus its column's zero
    point, rounded once to the 16-bit dtype (as the other forms round (q - z) * scale once).
    Group size 64 or 128 (the K step). `sum` as _swapped's. `packed` (the `regs_p` form): the
    words come in the MMA's order already (mma_order_words, once at load time) and X's tile
    is used as copied, without the per-step reordering. `H`: the group's K in H slices
    (1, 2 or 4), each its own MMA on one product, slice i + 1 unpacked into a second set of
    registers while slice i's MMA runs (tiled.compiler's wgmma wait plan keeps it in flight
    over code that fills another gemm's register operand)."""
    if H not in (1, 2, 4) or group_size % (32 * H):
        raise ValueError(f"regs_w takes a group's K in 1, 2 or 4 slices of whole 32-wide "
                         f"chunks; {H} slices of a group of {group_size}")
    if group_size not in (64, 128) or K % (group_size * splits):
        raise ValueError(f"regs_w steps over whole groups of 64 or 128; group size "
                         f"{group_size}, K = {K}, {splits} splits")
    if dtype not in _MAGIC16:
        raise ValueError(f"regs_w unpacks into float16 or bfloat16, not {dtype}")
    magic, base = _MAGIC16[dtype]
    in_place = dtype == "float16"  # 10 mantissa bits: a nibble at bits 4-7 stays in them
    Md = T.dyn("M")
    KW, G = K // 8, K // group_size
    per = G // splits
    hk = group_size // H  # K of a slice (whole 32-wide chunks)

    def unpack(wq, i, ws, rows, both):
        """ws (BN x hk, the MMA's K order) from slice i's words in wq (the group's)."""
        for n, p in T.Parallel(BN, hk):
            e = _pair_of(p)
            row = i * (hk // 8) + _word_of(p)
            word = wq[row, mma_col(row, n) if packed else n]
            if in_place:  # pairs 0, 1 of the word, then 2, 3 of it shifted by 8
                j = e % 2
                src = T.if_then_else(e < 2, word, word >> 8)
            else:
                j = 0
                src = word >> (e * 4)
            pair = (src & (0x000F000F << (j * 4))) | both
            h = T.reinterpret(dtype, T.cast(pair >> (p % 2 * 16), "int16"))
            scaled = h * T.if_then_else(j == 0, T.cast(1.0, dtype), T.cast(1.0 / 16, dtype))
            if zeros:  # (BASE + 16^j q) / 16^j - BASE / 16^j: q exactly; minus z, rounded
                ws[n, p] = (scaled - T.if_then_else(j == 0, T.cast(base, dtype),
                                                    T.cast(base / 16, dtype))) - rows.zero(n)
            else:  # (BASE + 16^j q) / 16^j - (BASE / 16^j + 8): q - 8, exactly
                ws[n, p] = scaled - T.if_then_else(j == 0, T.cast(base + 8.0, dtype),
                                                   T.cast(base / 16 + 8.0, dtype))

    @T.macro
    def words(X, Wq, S, Z, acc, bx, by, bz):
        def tag(i, name):  # H = 1: the buffer names (so the kernels) of the form before H
            return name if H == 1 else f"{name}{i}"

        # X's tile: as copied (one a slice when packed, whose order is the MMA's), and in
        # the MMA's K order, a tile a slice (the gemm's shared operand)
        xs = None if packed else T.alloc_shared((BM, group_size), dtype, name="xs")
        xk = [T.alloc_shared((BM, hk), dtype, name=tag(i, "xs" if packed else "xk"))
              for i in range(H)]
        wq = T.alloc_shared((group_size // 8, BN), "int32", name="wq")
        # two sets of registers at most: slice i + 1 is unpacked while slice i's MMA runs
        ws = [T.alloc_fragment((BN, hk), dtype, name=tag(i, "ws")) for i in range(min(H, 2))]
        part = T.alloc_fragment((BN, BM), "float32", name="part")
        rows = _GroupRows(S, Z, N, BN, dtype, zeros, SR)
        T.clear(acc)
        # BASE's bits in both halves, in a register (as _magic: one LOP3 a pair)
        both = T.min(Md - 1, 0) + (magic << 16 | magic)
        for kk in T.Pipelined(per, num_stages=stages):
            g = bz * per + kk
            if packed:
                for i in range(H):
                    T.copy(X[by * BM, g * group_size + i * hk], xk[i])
            else:
                T.copy(X[by * BM, g * group_size], xs)
            T.copy(Wq[g * (group_size // 8), bx * BN], wq)
            rows.step(g, bx * BN)
            if not packed:
                for i in range(H):
                    for t, p in T.Parallel(BM, hk):
                        xk[i][t, p] = xs[t, i * hk + _k_of(p)]
            for i in range(H):
                unpack(wq, i, ws[i % 2], rows, both)
                T.gemm(ws[i % 2], xk[i], part, transpose_B=True, clear_accum=i == 0)
            for n, m in T.Parallel(BN, BM):
                acc[n, m] += part[n, m] * T.cast(rows.scale(n), "float32")

    types = (T.Tensor((Md, K), dtype), T.Tensor((KW, N), "int32"), T.Tensor((G, N), dtype),
             T.Tensor((G, N) if zeros else (1,), dtype))
    return _swapped("linear_w4a16_mma_words" if packed else "linear_w4a16_words", types, words,
                    Md, N, BM, BN, threads, splits, out_dtype, sum)


def _k8_of(p):
    """The K index (within a 16-deep block) that position p of the MMA's K holds in the 8-bit
    regs_w order: a thread's four positions of the block (2i, 2i + 1, 2i + 8, 2i + 9; i its
    lane in the quad) take word i's four bytes, positions 2i and 2i + 1 bytes 0 and 2 (bits
    0 and 16), positions 2i + 8 and 2i + 9 bytes 1 and 3."""
    return p // 16 * 16 + (p % 8) // 2 * 4 + (p % 16) // 8 + p % 2 * 2


def _w8_words_kernel(N, K, dtype, out_dtype, BM, BN, threads, stages, splits=1,
                     sum="kernel"):
    """Y^T = W X^T for int8 W [N, K] (as int32 words [N, K / 4]) with W's tile T.gemm's
    register operand (wgmma's RS form on sm_90a), K reordered inside each 16-deep block so
    that a thread's operand values there are one word's four bytes (_k8_of). float16: a mask
    of the word, bytes 0 and 2 (or 1 and 3, shifted down by 8), its sign bits flipped and the
    bits of 1024.0 set in both halves (`^ 0x64806480`: one LOP3), reads as the register's
    pair 1024 + 128 + b; one HADD2 makes them b, exactly. bfloat16 (7 mantissa bits, too few
    for a byte): each byte made a float32 through the bits of 2^23 (`_nibble`'s trick) and
    rounded to bfloat16 exactly. X's tile is reordered the same way in shared memory; the
    channel scales are applied after the loop (as _w8_tile_kernel's). `sum` as _swapped's."""
    if K % (TILE_BK * splits):
        raise ValueError(f"K = {K} does not hold whole {TILE_BK}-deep steps in {splits} splits")
    if dtype not in _MAGIC16:
        raise ValueError(f"regs_w unpacks into float16 or bfloat16, not {dtype}")
    Md = T.dyn("M")
    KW, WB = K // 4, TILE_BK // 4  # words per row of W, per step
    per = K // TILE_BK // splits
    halves = dtype == "float16"

    @T.macro
    def words(X, Wq, S, Z, acc, bx, by, bz):
        xs = T.alloc_shared((BM, TILE_BK), dtype)
        xk = T.alloc_shared((BM, TILE_BK), dtype)  # xs in the MMA's K order
        wq = T.alloc_shared((BN, WB), "int32")
        ws = T.alloc_fragment((BN, TILE_BK), dtype)
        T.clear(acc)
        # in a register (as _magic): float16's 1024.0 in both halves with the bytes' sign
        # bits, float32's 2^23 with the byte's
        flip = T.min(Md - 1, 0) + (0x64806480 if halves else 0x4B000080)
        for kk in T.Pipelined(per, num_stages=stages):
            k = bz * per + kk
            T.copy(X[by * BM, k * TILE_BK], xs)
            T.copy(Wq[bx * BN, k * WB], wq)
            for t, p in T.Parallel(BM, TILE_BK):
                xk[t, p] = xs[t, _k8_of(p)]
            for n, p in T.Parallel(BN, TILE_BK):
                word = wq[n, p // 16 * 4 + (p % 8) // 2]
                h = (p % 16) // 8  # bytes h and h + 2
                if halves:
                    pair = ((word >> (h * 8)) & 0x00FF00FF) ^ flip
                    ws[n, p] = T.reinterpret(
                        dtype, T.cast(pair >> (p % 2 * 16), "int16")) - T.cast(1152.0, dtype)
                else:
                    bits = ((word >> ((h + p % 2 * 2) * 8)) & 0xFF) ^ flip
                    ws[n, p] = T.cast(T.reinterpret("float32", bits) - 8388736.0, dtype)
            T.gemm(ws, xk, acc, transpose_B=True)

    types = (T.Tensor((Md, K), dtype), T.Tensor((N, KW), "int32"), T.Tensor((N,), dtype),
             T.Tensor((1,), dtype))
    return _swapped("linear_w8a16_words", types, words, Md, N, BM, BN, threads, splits,
                    out_dtype, sum, scale=True)


def _swapped(name, types, product, Md, N, BM, BN, threads, splits, out_dtype, sum="kernel",
             scale=False):
    """The kernel of a swapped form whose `product(X, Wq, S, Z, acc, bx, by, bz)` macro leaves
    Y^T's BN x BM tile in acc (float32; `scale`: times S's column scales after it): Y, or with
    `splits` > 1 float32 partials for a `splitk_sum` kernel (sum="kernel"), or partials the
    tile's last split adds up into Y in the same kernel (sum="last": the parameters Y, P, C of
    tiled.ops.split_k.add_up_last)."""
    if sum not in ("kernel", "last"):
        raise ValueError(f"sum must be 'kernel' or 'last', got {sum!r}")
    x_t, w_t, s_t, z_t = types
    tiles_n = -(-N // BN)

    def value(S, acc, n, m, bx):
        if scale:
            return acc[n, m] * T.cast(S[T.min(bx * BN + n, N - 1)], "float32")
        return acc[n, m]

    if splits > 1 and sum == "last":
        def last(X: x_t, Wq: w_t, S: s_t, Z: z_t, Y: T.Tensor((Md, N), out_dtype),
                 P: T.Tensor((splits, Md, N), "float32"), C: T.Tensor((T.dyn("tiles"),), "int32")):
            with T.Kernel(tiles_n, T.ceildiv(Md, BM), splits, threads=threads) as (bx, by, bz):
                acc = T.alloc_fragment((BN, BM), "float32")
                product(X, Wq, S, Z, acc, bx, by, bz)
                for n, m in T.Parallel(BN, BM):  # rows past M or N: the guards drop them
                    P[bz, by * BM + m, bx * BN + n] = value(S, acc, n, m, bx)
                add_up_last(P, C, Y, by * tiles_n + bx, by * BM, bx * BN, BM, BN, splits,
                            out_dtype)
        last.__name__ = last.__qualname__ = name + "_last"
        return tiled.kernel(last)
    out, extra = _output(Md, N, out_dtype, splits)

    def plain(X: x_t, Wq: w_t, S: s_t, Z: z_t, Y: out):
        with T.Kernel(tiles_n, T.ceildiv(Md, BM), *extra, threads=threads) as grid:
            bx, by = grid[0], grid[1]
            bz = grid[2] if splits > 1 else 0
            acc = T.alloc_fragment((BN, BM), "float32")
            product(X, Wq, S, Z, acc, bx, by, bz)
            for n, m in T.Parallel(BN, BM):
                if splits > 1:
                    Y[bz, by * BM + m, bx * BN + n] = value(S, acc, n, m, bx)
                else:
                    Y[by * BM + m, bx * BN + n] = T.cast(value(S, acc, n, m, bx), out_dtype)
    plain.__name__ = plain.__qualname__ = name
    return tiled.kernel(plain)
