"""Weight-only quantized linears in tiled.ops (this module, tiled.ops.quant): 16-bit activations
times 4- or 8-bit weights, dequantized in the main loop.

    linear_w4a16(x, qweight, scales, zeros=None, group_size=128, layout="gptq") -> x @ W.T
        qweight int32 [K / 8, N], GPTQ's packing: word [k8, n] holds W[n, 8 k8 .. 8 k8 + 7]
        as eight 4-bit values, the lowest nibble first; scales [K / group_size, N] in x's
        dtype; W[n, k] = (q - z) * scales[k / group_size, n] with z = 8 when `zeros` is None
        (symmetric: vLLM's uint4b8), else zeros[k / group_size, n] (unpacked zero points, in
        the scales' dtype). layout="mma": qweight as repack_w4a16 made it from GPTQ's words
        (once, at load time: each 32-deep chunk's nibbles in the order the MMA's register
        operand takes them, each row's words rotated inside 32-column blocks), which the
        lanes form reads with X's indices permuted the same way and the regs_p form unpacks
        without reordering X and without shared-memory bank conflicts; K and N multiples of
        32.
    repack_w4a16(qweight) -> GPTQ words in the "mma" layout (quant_words.mma_order_words)
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
  is scaled once per output element after the MMA (_w4_group_kernel);
- `regs_w` (as `regs_g`, also with zero points): K reordered inside each 32-wide chunk so
  that the register operand's values a thread holds are one word's eight, unpacked two an
  instruction (one mask of the word is a register's pair of 16-bit values), the tokens'
  tile reordered to match (_w4_words_kernel); for 8-bit weights (int8 W [N, K]) likewise
  over 16-deep blocks, a thread's operand values there one word's four bytes, unpacked two
  an instruction into float16 (bfloat16: through float32), the channel scales after the
  loop (_w8_words_kernel);
- `regs_p` (4-bit, as `regs_w`, layout="mma" only): the words repacked once into the MMA's
  order (quant_words.mma_order_words), so X's tile needs no reordering.
regs_w and regs_p take `H` 2 or 4: a group's K in H slices, each unpacked into a second set of
registers while the slice before it is in the MMA. The "mma" layout's space is the lanes
configs and regs_p's (MMA_CUDA_SPACE); neither regs_p nor H has been timed on a GPU yet.
The 4-bit tile forms take `SR` 1: each step's group scales (and zero points) copied into
shared tiles beside X and W (quant_tiles._GroupRows), which regs_g and regs_w do in the space.
All unpack a nibble without an int-to-float conversion (`_nibble`, the 16-bit magic of
_MAGIC16). The tensor-core forms and the nibble arithmetic live in tiled.ops.quant_tiles, the
regs_w forms in tiled.ops.quant_words.
"""

import tiled
import tiled.lang as T
from tiled.ops.gemm import token_bucket
from tiled.ops.quant_tiles import (
    _magic,
    _nibble,
    _nibble_at,
    _output,
    _w4_group_kernel,
    _w4_tile_kernel,
    _w8_tile_kernel,
)
from tiled.ops.quant_words import (
    _w4_words_kernel,
    _w8_words_kernel,
    mma_col,
    mma_k,
    mma_order_words,
)
from tiled.ops.split_k import run_split
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
              # the H100: results/w4_regs_g_probe_h100.json, is not in the space), the group
              # scales through shared tiles (SR: faster in all 6 rows of
              # results/w4_sr_probe_h100.json, 16 and 64 tokens at three shapes)
              *({"kind": "regs_g", "BM": bm, "BN": bn, "threads": t, "stages": 2, "splits": s,
                 "SR": 1}
                for bm in (16, 32, 64) for bn, t in ((64, 128), (128, 128), (128, 256))
                for s in (1, 4, 8))]
# regs_w (split configs with either sum): 4-bit with its group scales through shared tiles
# (SR: faster than without in all 6 rows of results/w4_sr_probe_h100.json), 8-bit without
# (its channel scales come after the loop; the 4-bit form skips those configs, as the 8-bit
# one skips the SR ones). On an H100 the tuner took regs_w at 16 tokens for every 4-bit
# shape and at 1 and 16 tokens for every 8-bit one (results/quant_rs_h100.json,
# quant_rw8_h100.json).
REGS_W_CONFIGS = [{"kind": "regs_w", "BM": bm, "BN": bn, "threads": t, "stages": 2,
                   "splits": s, "sum": sm}
                  for bm in (16, 32, 64) for bn, t in ((64, 128), (128, 128), (128, 256))
                  for s in (1, 4, 8) for sm in (("kernel", "last") if s > 1 else ("kernel",))]
CUDA_SPACE += [*({**c, "SR": 1} for c in REGS_W_CONFIGS), *REGS_W_CONFIGS]


def sr_twins(space: list) -> list:
    """The SR=1 twins of `space`'s 4-bit tile-form configs without it (group scales through
    shared tiles: quant_tiles._GroupRows), outside the space: tile and swap (the swapped form
    so takes the TMA producer and read slower in 5 of 6 rows of
    results/w4_sr_probe_h100.json). QUANT_SR=1 builds them into benchmarks/gpu/quant.py's
    bundle."""
    return [{**c, "SR": 1} for c in space
            if c.get("kind", "lanes") != "lanes" and not c.get("SR")]


CPU_SPACE = [*({"kind": "lanes", "BM": bm, "BN": 64, "threads": 32, "splits": 1, "WPI": 1}
               for bm in (1, 2, 4, 8, 16)),
             {"kind": "lanes", "BM": 4, "BN": 64, "threads": 32, "splits": 2, "WPI": 2},
             {"kind": "lanes", "BM": 1, "BN": 64, "threads": 32, "splits": 2, "WPI": 1, "KG": 2},
             {"kind": "lanes", "BM": 2, "BN": 64, "threads": 32, "splits": 2, "WPI": 2, "KG": 2,
              "XS": 1},
             {"kind": "tile", "BM": 16, "BN": 32, "threads": 32, "stages": 2},
             {"kind": "tile", "BM": 16, "BN": 32, "threads": 32, "stages": 2, "splits": 2}]


# The "mma" layout (linear_w4a16's layout="mma": words from repack_w4a16): the lanes configs
# (X's indices permuted) and regs_p, regs_w's twin on these words, whole or in H slices; not
# timed on a GPU yet (benchmarks/gpu/probes/w4_regs_probe.py builds regs_p and H).
MMA_CUDA_SPACE = [*(c for c in CUDA_SPACE if c.get("kind", "lanes") == "lanes"),
                  *({**c, "kind": "regs_p", "SR": 1, **({"H": h} if h > 1 else {})}
                    for c in REGS_W_CONFIGS for h in (1, 2, 4))]
MMA_CPU_SPACE = [*(c for c in CPU_SPACE if c.get("kind", "lanes") == "lanes"),
                 {"kind": "regs_p", "BM": 16, "BN": 32, "threads": 32, "stages": 2}]


def _fits(cfg: dict, M: int, bits: int) -> bool:
    """lanes: BM the power of two covering M (16 past 16 tokens); tile, swap: BM at most twice M's
    bucket, from 8 tokens for 4-bit weights (lanes read them at the memory's speed below
    that) and from 1 for 8-bit ones (lanes walk a row of W [N, K] per lane: uncoalesced)."""
    if cfg.get("kind", "lanes") in ("tile", "swap", "regs", "regs_g", "regs_w", "regs_p"):
        return (M >= 8 or bits == 8) and cfg["BM"] <= max(16, 2 * M)
    m = min(M, 16)
    return m <= cfg["BM"] < 2 * m


def quant_linear_kernel(M, N, K, dtype, out_dtype, bits, group_size, zeros, layout="gptq",
                        kind="lanes", BM=1, BN=512, threads=128, splits=1, WPI=2, stages=2,
                        KG=1, XS=0, sum="kernel", SR=0, H=1):
    """The kernel of one config (M only selects: the kernel's M is symbolic). bits 4: GPTQ
    words [K / 8, N] with group scales (and zeros); bits 8: int8 [N, K] with channel
    scales. `sum` (regs_w with splits): "kernel" adds the partials up in a `splitk_sum`
    kernel, "last" in the GEMM kernel itself (tiled.ops.split_k). `SR` 1 (4-bit tile forms):
    each step's group scales through the pipelined loop's shared tiles (quant_tiles._GroupRows).
    `H` (4-bit regs_w / regs_p): a group's K in H slices, each slice unpacked while the one
    before it is in the MMA (quant_words._w4_words_kernel). `layout` "mma" (4-bit): the
    words as repack_w4a16 leaves them, for the lanes form (X's indices permuted: quant_words.mma_k)
    and regs_p, which takes nothing else."""
    if layout not in ("gptq", "mma"):
        raise ValueError(f"layout must be 'gptq' or 'mma', not {layout!r}")
    mismatched = (layout == "mma") != (kind == "regs_p") and kind != "lanes"
    if mismatched or (layout == "mma" and (bits != 4 or K % 32 or group_size % 32 or N % 32)):
        raise ValueError(f"the {bits}-bit {kind} form with group {group_size}, K = {K}, N = {N} "
                         f"does not take the {layout!r} layout (mma: 4-bit lanes and regs_p, "
                         "32-deep chunks in whole groups, 32-column blocks)")
    if not _fits({"kind": kind, "BM": BM}, M, bits):
        raise ValueError(f"a {kind} {BM}-token tile is not for M = {M}")
    if sum != "kernel" and kind not in ("regs_w", "regs_p"):
        raise ValueError(f"sum={sum!r} is for the regs_w form, not {kind}")
    if SR and (bits != 4 or kind == "lanes"):
        raise ValueError("SR (group scales through shared tiles) is for the 4-bit tile forms, "
                         f"not {bits}-bit {kind}")
    if kind in ("regs", "regs_g", "regs_p") and bits != 4:
        raise ValueError(f"the {kind} form takes 4-bit weights")
    if H != 1 and (bits != 4 or kind not in ("regs_w", "regs_p")):
        raise ValueError(f"H (a group's K in slices) is for the 4-bit regs_w and regs_p forms, "
                         f"not {bits}-bit {kind}")
    if kind == "regs_w" and bits == 8:
        return _w8_words_kernel(N, K, dtype, out_dtype, BM, BN, threads, stages, splits, sum)
    if kind in ("regs_w", "regs_p"):  # regs_p: words in the MMA's order (mma_order_words)
        return _w4_words_kernel(N, K, dtype, out_dtype, group_size, zeros, BM, BN, threads,
                                stages, splits, sum, SR, packed=kind == "regs_p", H=H)
    if kind == "regs_g":
        return _w4_group_kernel(N, K, dtype, out_dtype, group_size, zeros, BM, BN, threads,
                                stages, splits, SR)
    if kind in ("tile", "swap") and bits == 8:
        return _w8_tile_kernel(N, K, dtype, out_dtype, BM, BN, threads, stages, splits,
                               swap=kind == "swap")
    if kind in ("tile", "swap", "regs"):
        return _w4_tile_kernel(N, K, dtype, out_dtype, bits, group_size, zeros, BM, BN,
                               threads, stages, splits, swap=kind != "tile",
                               regs=kind == "regs", SR=SR)
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
    kx = mma_k if layout == "mma" else (lambda k: k)  # X's index of a word's value
    wcol = mma_col if layout == "mma" else (lambda w, n: n)  # where a row's word of n is
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
                    xs[m, k] = T.cast(X[by * BM + m, kx(bz * KS + k)], "float32") * \
                        T.reinterpret("float32", (127 - 4 * j) << 23)  # 16^-j
                for m, k8 in T.Parallel(BM, KS // 8):
                    t = 0.0
                    for i in range(8):
                        t = t + T.cast(X[by * BM + m, kx(bz * KS + k8 * 8 + i)], "float32")
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
                        word = Wq[w, wcol(w, col)]
                        zero = T.cast(Z[k0 // group_size, col], "float32") if zeros else 8.0
                        kl = k0 - bz * KS  # in the split's staged tokens
                        part = 0.0
                        for i in range(8):
                            part = part + _nibble_at(word, i, magic) * xs[m, kl + i]
                        part = part - zero * xsum[m, kl // 8]
                        total = total + part * T.cast(S[k0 // group_size, col], "float32")
                    elif bits == 4:
                        word = Wq[w, wcol(w, col)]
                        zero = T.cast(Z[k0 // group_size, col], "float32") if zeros else None
                        part = 0.0
                        for i in range(8):
                            part = part + _nibble(word, i, zero, magic) * \
                                T.cast(X[row, kx(k0 + i)], "float32")
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



def _bucket(M, N, K, dtype, out_dtype, bits, group_size, zeros, layout="gptq"):
    return (*token_bucket(M, N, K, dtype, out_dtype), bits, group_size, zeros) + \
        ((layout,) if layout != "gptq" else ())


def _inputs(M, N, K, dtype, out_dtype, bits, group_size, zeros, layout="gptq", **config):
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
    adds up (tiled.ops.split_k.run_split, as tiled.ops.linear's split-K)."""
    x, w, s, z, y = args
    return run_split(y, config, lambda *out: kernel(x, w, s, z, *out))


QUANT_LINEAR = TunedOp("quant_linear", quant_linear_kernel,
                       {"cuda": CUDA_SPACE, "cpu": CPU_SPACE},
                       key=["M", "N", "K", "dtype", "out_dtype", "bits", "group_size", "zeros"],
                       bucket=_bucket, inputs=_inputs, run=_run)
# the "mma" layout's tuner (its own spaces; layout="mma" in its key)
QUANT_LINEAR_MMA = TunedOp("quant_linear", quant_linear_kernel,
                           {"cuda": MMA_CUDA_SPACE, "cpu": MMA_CPU_SPACE},
                           key=["M", "N", "K", "dtype", "out_dtype", "bits", "group_size",
                                "zeros", "layout"],
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


def _launch(op, x, x2, dtype, N, K, bits, group, zeros_t, qweight, scales, layout="gptq"):
    import torch

    M = x2.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if M:
        key = (x, M, N, K, dtype, dtype, bits, group, zeros_t is not None)
        tuned = QUANT_LINEAR.tuned(*key) if layout == "gptq" else \
            QUANT_LINEAR_MMA.tuned(*key, layout)
        z = zeros_t if zeros_t is not None else scales.new_empty(1)  # (unread placeholder)
        _run(tuned.compiled, tuned.config, [x2, qweight.contiguous(), scales.contiguous(),
                                            z.contiguous(), y])
    return y.view(*x.shape[:-1], N)


def repack_w4a16(qweight):
    """GPTQ's 4-bit words (int32 [K / 8, N]) in the "mma" layout that linear_w4a16(...,
    layout="mma") takes: within each 32-deep chunk of a column the nibbles moved to where
    the tensor-core form's register operand takes them (quant_words.mma_order_words). Once,
    at load time; the scales and zero points keep their layout."""
    import torch

    if qweight.dtype != torch.int32 or qweight.dim() != 2 or qweight.shape[0] % 4 or \
            qweight.shape[1] % 32:
        raise ValueError(f"tiled.ops.repack_w4a16: qweight {tuple(qweight.shape)} "
                         f"{qweight.dtype} is not int32 [K / 8, N] with K and N multiples "
                         "of 32")
    return mma_order_words(qweight.contiguous())


def linear_w4a16(x, qweight, scales, zeros=None, group_size: int = 128, layout: str = "gptq"):
    """x @ W.T for GPTQ-packed 4-bit W (module docstring), in x's dtype; layout="mma": qweight
    from repack_w4a16."""
    import torch

    op = "linear_w4a16"
    if layout not in ("gptq", "mma"):
        raise ValueError(f"tiled.ops.{op}: layout must be 'gptq' or 'mma', not {layout!r}")
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
    if layout == "mma" and (K % 32 or group_size % 32 or N % 32):
        raise ValueError(f"tiled.ops.{op}: the mma layout needs K ({K}) and group_size "
                         f"({group_size}) in whole 32-deep chunks, N ({N}) in 32-column "
                         "blocks")
    return _launch(op, x, x2, dtype, N, K, 4, group_size, zeros, qweight, scales, layout)


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
