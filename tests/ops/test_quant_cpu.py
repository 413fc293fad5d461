"""tiled.ops.linear_w4a16 / linear_w8a16 on CPU tensors (the cpu target) against the dequantized
weights' product in torch; their CUDA kernels compile for sm_90a."""

import pytest

torch = pytest.importorskip("torch")

import tiled.ops as ops
from tiled.ops import quant, quant_words


def gptq_pack(q):
    """int32 [K / 8, N] of 4-bit values q [K, N] (0..15): eight along K a word, the lowest
    nibble first (GPTQ's qweight)."""
    K, N = q.shape
    words = torch.zeros(K // 8, N, dtype=torch.int64)
    for i in range(8):
        words |= q[i::8].to(torch.int64) << (4 * i)
    return (words - ((words >> 31) << 32)).to(torch.int32)  # as signed 32-bit words


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _form_error(cfg, M, K, N, group, dtype="bfloat16", zeros=False, seed=0, select=None,
                layout=None, round_zeros=True) -> float:
    """The relative error against the dequantized product of config `cfg`'s kernel (its
    kind included), run on the cpu target through quant._run as the op runs it, on M tokens
    and random 4-bit weights from `seed`: zero points whole numbers unless `round_zeros` is
    False, the words repacked for the "mma" layout (regs_p's by default). `select`: the M the
    factory selects the config for (default M; the kernel's M is symbolic)."""
    import tiled

    layout = layout or ("mma" if cfg["kind"] == "regs_p" else "gptq")
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=g)
    dt = getattr(torch, dtype)
    s = (torch.rand(K // group, N, generator=g) + 0.5).to(dt)
    if zeros:
        z = torch.rand(K // group, N, generator=g) * 15
        z = (z.round() if round_zeros else z).to(dt)
    else:
        z = torch.zeros(1, dtype=dt)
    x = torch.randn(M, K, generator=g).to(dt)
    words = gptq_pack(q) if layout == "gptq" else ops.repack_w4a16(gptq_pack(q))
    kernel = quant.quant_linear_kernel(select or M, N, K, dtype, dtype, 4, group, zeros, layout,
                                       **cfg)
    y = torch.zeros(M, N, dtype=dt)
    quant._run(tiled.compile(kernel, target="cpu"), cfg, [x, words, s, z, y])
    zz = z.float().repeat_interleave(group, 0) if zeros else 8.0
    w = (q.float() - zz) * s.float().repeat_interleave(group, 0)
    return _rel(y, x.float() @ w)


@pytest.mark.parametrize("layout", ["gptq", "mma"])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("M", [1, 3, 20])
def test_w4a16_matches_the_dequantized_product(M, zeros, layout):
    """GPTQ's words, and the same repacked by repack_w4a16 with layout="mma" (the lanes form
    with X's indices permuted, regs_p from 8 tokens)."""
    g = torch.Generator().manual_seed(M)
    K, N, group = 256, 96, 64
    q = torch.randint(0, 16, (K, N), generator=g)
    scales = (torch.rand(K // group, N, generator=g) + 0.5).to(torch.bfloat16)
    z = (torch.rand(K // group, N, generator=g) * 15).round().to(torch.bfloat16) if zeros \
        else None
    x = torch.randn(M, K, generator=g).to(torch.bfloat16)
    zz = z.float().repeat_interleave(group, 0) if zeros else 8.0
    w = (q.float() - zz) * scales.float().repeat_interleave(group, 0)  # [K, N]
    words = gptq_pack(q) if layout == "gptq" else ops.repack_w4a16(gptq_pack(q))
    y = ops.linear_w4a16(x, words, scales, z, group_size=group, layout=layout)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    assert _rel(y, x.float() @ w) < 1e-2


@pytest.mark.parametrize("splits,wpi,kg,xs", [(1, 1, 1, 0), (2, 2, 1, 0), (2, 2, 2, 1),
                                              (1, 2, 1, 1)])
def test_lanes_read_x_in_the_mma_layouts_order(splits, wpi, kg, xs):
    """The lanes form on "mma" words reads each word's values' tokens at their permuted K
    (quant_words.mma_k), from global memory or staged (XS), over splits and lane groups."""
    cfg = {"kind": "lanes", "BM": 8, "BN": 64, "threads": 32, "splits": splits,
           "WPI": wpi, "KG": kg, "XS": xs}
    assert _form_error(cfg, 5, 512, 64, 128, seed=29, select=8, layout="mma") < 1e-2
    assert sorted(quant_words.mma_k(p) for p in range(64)) == list(range(64))


def test_the_mma_layout_takes_lanes_and_regs_p_only():
    with pytest.raises(ValueError, match="does not take the 'mma' layout"):
        quant.quant_linear_kernel(16, 256, 512, "float16", "float16", 4, 128, False, "mma",
                                  kind="regs_w", BM=16, BN=64)
    with pytest.raises(ValueError, match="does not take the 'gptq' layout"):
        quant.quant_linear_kernel(16, 256, 512, "float16", "float16", 4, 128, False,
                                  kind="regs_p", BM=16, BN=64)
    assert {c.get("kind", "lanes") for c in quant.MMA_CUDA_SPACE} == {"lanes", "regs_p"}


@pytest.mark.parametrize("kind,zeros,splits,kg,xs", [
    ("lanes", False, 1, 1, 0), ("tile", False, 1, 1, 0), ("tile", True, 1, 1, 0),
    ("tile", True, 2, 1, 0), ("lanes", True, 2, 1, 0), ("lanes", False, 2, 2, 0),
    ("lanes", False, 2, 2, 1), ("lanes", True, 1, 1, 1), ("swap", False, 1, 1, 0),
    ("swap", True, 2, 1, 0), ("regs", False, 1, 1, 0), ("regs", True, 2, 1, 0),
    ("regs_g", False, 1, 1, 0), ("regs_g", False, 2, 1, 0), ("regs_w", False, 1, 1, 0),
    ("regs_w", False, 2, 1, 0), ("regs_w", True, 1, 1, 0), ("regs_w", True, 2, 1, 0),
    ("tile", True, 2, 1, "SR"), ("swap", True, 2, 1, "SR"), ("swap", False, 1, 1, "SR"),
    ("regs", True, 2, 1, "SR"), ("regs_g", False, 2, 1, "SR"), ("regs_w", True, 2, 1, "SR"),
    ("regs_w", False, 1, 1, "SR")])
def test_each_w4a16_kernel_form(kind, zeros, splits, kg, xs):
    """The lanes, the tile (dequantized into a shared tile, then T.gemm), the swapped tile
    (W's tile times X's, transposed), the regs (swapped, W's tile a fragment), regs_g (regs,
    scaled per group after the MMA) and regs_w (regs_g with K reordered so that a thread
    unpacks whole words) forms directly, on 40 tokens (a ragged second token
    tile) and 80 columns (a ragged column tile); split over K into float32 partials that
    splitk_sum adds (quant._run, as the op runs them), and over K inside a block (lanes' KG
    lane groups), with the tokens staged in shared (XS); the tile forms also with their group
    scales (and zero points) through shared tiles (SR), the ragged column tile's past N."""
    cfg = ({"BM": 16, "BN": 64, "threads": 32, "splits": splits, "WPI": 2, "KG": kg, "XS": xs}
           if kind == "lanes"
           else {"BM": 32, "BN": 32, "threads": 32, "stages": 2, "splits": splits,
                 **({"SR": 1} if xs == "SR" else {})})
    assert _form_error({"kind": kind, **cfg}, 40, 256, 80, 128, zeros=zeros, seed=11,
                       select=64) < 1e-2


@pytest.mark.parametrize("M", [1, 5])
def test_w8a16_matches_the_dequantized_product(M):
    g = torch.Generator().manual_seed(7)
    K, N = 128, 80
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    s = (torch.rand(N, generator=g) / 64).to(torch.float16)
    x = torch.randn(2, M, K, generator=g).to(torch.float16)  # leading dims are tokens
    y = ops.linear_w8a16(x, q, s)
    assert y.shape == (2, M, N)
    assert _rel(y, x.float() @ (q.float() * s.float()[:, None]).T) < 1e-2


@pytest.mark.parametrize("M,splits,kind,dtype", [
    (1, 1, "tile", "float16"), (40, 2, "tile", "float16"), (1, 1, "swap", "float16"),
    (40, 2, "swap", "float16"), (1, 1, "regs_w", "float16"), (40, 2, "regs_w", "float16"),
    (5, 1, "regs_w", "bfloat16"), (40, 2, "regs_w", "bfloat16")])
def test_the_w8a16_tile_form(M, splits, kind, dtype):
    """int8 W [N, K] copied along K into shared memory, cast to a 16-bit tile, T.gemm, the
    channel scales after the loop: one token (decode) and 40 (a ragged token tile), 80
    columns (a ragged column tile), split over K into float32 partials (quant._run); the
    tile form, the swapped one (W's tile times X's, transposed) and regs_w (the swapped
    tile a register operand, K reordered so a thread unpacks whole words; float16 through
    the bits of 1024.0, bfloat16 through float32's 2^23)."""
    import tiled

    tdt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(5)
    K, N = 256, 80
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    s = (torch.rand(N, generator=g) / 64).to(tdt)
    x = torch.randn(M, K, generator=g).to(tdt)
    cfg = {"BM": 16, "BN": 32, "threads": 32, "stages": 2, "splits": splits}
    kernel = quant.quant_linear_kernel(M, N, K, dtype, dtype, 8, 0, False, kind=kind, **cfg)
    y = torch.zeros(M, N, dtype=tdt)
    quant._run(tiled.compile(kernel, target="cpu"), {"kind": kind, **cfg},
               [x, q.view(torch.int32), s, torch.zeros(1, dtype=tdt), y])
    assert _rel(y, x.float() @ (q.float() * s.float()[:, None]).T) < 1e-2


def test_w8a16_regs_w_decodes_every_byte_exactly():
    """regs_w's byte pairs (bytes 0 and 2, 1 and 3 of a word, or-ed into 1024.0's bits with
    the sign bits flipped; bfloat16 through float32): every int8 value in every byte
    position, times an identity of tokens and unit scales, exactly."""
    import tiled

    K = 256
    q = torch.stack([torch.arange(-128, 128).roll(r) for r in range(32)]).to(torch.int8)
    for dtype in (torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        cfg = {"kind": "regs_w", "BM": 16, "BN": 32, "threads": 32, "stages": 2, "splits": 1}
        kernel = quant.quant_linear_kernel(K, 32, K, name, name, 8, 0, False, **cfg)
        y = torch.zeros(K, 32, dtype=dtype)
        quant._run(tiled.compile(kernel, target="cpu"), cfg,
                   [torch.eye(K).to(dtype), q.view(torch.int32), torch.ones(32, dtype=dtype),
                    torch.zeros(1, dtype=dtype), y])
        assert torch.equal(y, q.T.to(dtype)), name


def test_w8a16_decodes_every_byte_exactly():
    """Every int8 value, in every byte position of its word (sign-extended from the word),
    times an identity of tokens and unit scales."""
    K = 256
    q = torch.stack([torch.arange(-128, 128).roll(r) for r in range(8)]).to(torch.int8)
    y = ops.linear_w8a16(torch.eye(K).to(torch.float16), q, torch.ones(8, dtype=torch.float16))
    assert torch.equal(y, q.T.to(torch.float16))


def test_quantized_linears_refuse_bad_arguments():
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    qw = torch.zeros(32, 64, dtype=torch.int32)
    s = torch.ones(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"not int32 \[K / 8 = 32, N\]"):
        ops.linear_w4a16(x, qw[:16], s)
    with pytest.raises(ValueError, match="group_size 100"):
        ops.linear_w4a16(x, qw, s, group_size=100)
    with pytest.raises(ValueError, match="expected x's"):
        ops.linear_w4a16(x, qw, s.half())
    with pytest.raises(TypeError, match="float32 activations"):
        ops.linear_w4a16(x.float(), qw, s.float())
    with pytest.raises(ValueError, match="not int8"):
        ops.linear_w8a16(x, qw, torch.ones(64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="layout must be 'gptq' or 'mma', not 'marlin'"):
        ops.linear_w4a16(x, qw, s, layout="marlin")
    with pytest.raises(ValueError, match="whole 32-deep chunks"):
        ops.linear_w4a16(x, qw, torch.ones(16, 64, dtype=torch.bfloat16), group_size=16,
                         layout="mma")
    with pytest.raises(ValueError, match="K and N multiples of 32"):
        ops.repack_w4a16(qw[:6])


def test_quantized_custom_ops_pass_opcheck():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 128, generator=g).to(torch.bfloat16)
    qw = gptq_pack(torch.randint(0, 16, (128, 64), generator=g))
    s = torch.rand(1, 64, generator=g).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.tiled.linear_w4a16.default, (x, qw, s))
    torch.library.opcheck(torch.ops.tiled.linear_w4a16.default,
                          (x, ops.repack_w4a16(qw), s, None, 128, "mma"))
    q8 = torch.randint(-128, 128, (64, 128), generator=g, dtype=torch.int8)
    torch.library.opcheck(torch.ops.tiled.linear_w8a16.default,
                          (x, q8, torch.rand(64, generator=g).to(torch.bfloat16)))


def test_quantized_kernels_compile_for_sm90a():
    """Llama-3-8B's gate/up at decode: 16-byte weight loads (four GPTQ words a lane)."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    from tiled.compiler import compile_program

    c = compile_program(quant.quant_linear_kernel(1, 14336, 4096, "bfloat16", "bfloat16", 4,
                                                  128, False, BM=1, BN=512, threads=128,
                                                  splits=2), target="cuda:sm_90a")
    assert "int4" in c.source
    compile_program(quant.quant_linear_kernel(16, 4096, 4096, "float16", "float16", 8, 0,
                                              False, BM=16, BN=512, threads=128),
                    target="cuda:sm_90a")
    tile = compile_program(quant.quant_linear_kernel(64, 4096, 4096, "float16", "float16", 4,
                                                     128, False, kind="tile", BM=64, BN=128,
                                                     threads=128), target="cuda:sm_90a")
    assert "mma" in tile.source
    tile8 = compile_program(quant.quant_linear_kernel(1, 4096, 4096, "float16", "float16", 8, 0,
                                                      False, kind="tile", BM=16, BN=128,
                                                      threads=128, splits=4),
                            target="cuda:sm_90a")
    assert "tiled::gemm_ss" in tile8.source  # the tensor cores (mma.sync at 16 rows)


def test_the_swapped_tiles_take_wgmma_with_16_token_columns(tmp_path):
    """At 16 tokens the tile form's 16-row tile cannot take wgmma (64 rows a warpgroup); the
    swapped form's weight tile is the MMA's rows and the tokens its 16 columns: HGMMA
    64x16x16 on sm_90a, no mma.sync, no local memory; for 4-bit weights each word's values
    stored 8 bytes at a time (not 2: the tile form's STS.U16); for int8 ones too."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass

    kernel = quant.quant_linear_kernel(16, 14336, 4096, "float16", "float16", 4, 128, False,
                                       kind="swap", BM=16, BN=128, threads=128, stages=2,
                                       splits=8)
    text = sass(tiled.compile(kernel, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert "HGMMA.64x16x16.F32" in text and not re.search(r"\bHMMA\b", text)
    assert not re.search(r"\b(LDL|STL)\b", text)
    assert re.search(r"STS\.64", text) and not re.search(r"STS\.U16", text)
    w8 = quant.quant_linear_kernel(1, 14336, 4096, "float16", "float16", 8, 0, False,
                                   kind="swap", BM=16, BN=128, threads=128, stages=2, splits=4)
    text = sass(tiled.compile(w8, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert "HGMMA.64x16x16.F32" in text and not re.search(r"\b(HMMA|LDL|STL)\b", text)


@pytest.mark.parametrize("kind,zeros", [("swap", True), ("regs_g", False), ("regs_w", True)])
def test_group_scales_through_shared_tiles_take_the_producer(tmp_path, kind, zeros):
    """SR=1: each step's group scales (and zero points) are copied beside X and W, so on
    sm_90a every copy of the loop runs ahead on the TMA producer (UTMALDG) and the consumers
    load nothing from global memory (no LDG; with SR=0 their scale loads kept the swapped
    form off the producer); the swapped form still stores a word's values 8 bytes at a time
    (the scale held in a register: STS.64, no STS.U16)."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass

    kernel = quant.quant_linear_kernel(16, 14336, 4096, "float16", "float16", 4, 128, zeros,
                                       kind=kind, BM=16, BN=128, threads=128, stages=2,
                                       splits=8, SR=1)
    text = sass(tiled.compile(kernel, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert "UTMALDG.2D" in text and "HGMMA.64x16x16.F32" in text
    assert not re.search(r"(LDG|LDGSTS|LDL|STL)", text)
    if kind == "swap":
        assert "STS.64" in text and "STS.U16" not in text
    with pytest.raises(ValueError, match="SR"):
        quant.quant_linear_kernel(1, 14336, 4096, "float16", "float16", 4, 128, False,
                                  kind="lanes", SR=1)


@pytest.mark.parametrize("kind,dtype,tokens", [("regs", "float16", 16), ("regs", "bfloat16", 32),
                                               ("regs_g", "float16", 32),
                                               ("regs_g", "bfloat16", 16)])
def test_the_regs_form_unpacks_into_the_wgmma_register_operand(tmp_path, kind, dtype, tokens):
    """The regs forms' weight tile is a fragment, T.gemm's A: wgmma's RS form with the 16 or
    32 tokens as its columns (HGMMA 64x16x16 / 64x32x16 from registers), no 16-bit shared
    tile of W (no shared stores in the loop but the copies'), no mma.sync, no local memory;
    regs_g's 16-bit subtractions two at a time (HADD2 / HFMA2)."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass

    kernel = quant.quant_linear_kernel(tokens, 14336, 4096, dtype, dtype, 4, 128, False,
                                       kind=kind, BM=tokens, BN=128, threads=128, stages=2,
                                       splits=4)
    text = sass(tiled.compile(kernel, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert re.search(rf"HGMMA\.64x{tokens}x16\.F32(\.BF16)? R\d+, R\d+, gdesc", text)
    assert not re.search(r"\b(HMMA|LDL|STL|STS(\.\w+)*)\b", text)
    if kind == "regs_g":
        assert re.search(r"\bH(ADD|FMA)2\b", text)


@pytest.mark.parametrize("dtype,zeros,splits,group,sr", [
    ("float16", False, 1, 128, 0), ("float16", True, 2, 64, 1), ("bfloat16", False, 2, 128, 1),
    ("bfloat16", True, 1, 64, 0)])
def test_regs_p_takes_words_repacked_into_the_mma_order(dtype, zeros, splits, group, sr):
    """mma_order_words moves each 32-deep chunk's nibbles to where regs_w's unpacking reads
    them (a permutation inside the chunk: the same values) and rotates each row's words
    inside 32-column blocks so that a warp's loads (8 columns of 4 rows a load) take 32
    banks; regs_p on the repacked words multiplies X's tile as copied and gives the
    dequantized product, as regs_w does on GPTQ's words, with a ragged column tile."""
    from tiled.ops.quant_words import mma_col, mma_order_words

    K, N = 256, 96
    q = torch.randint(0, 16, (K, N), generator=torch.Generator().manual_seed(17))
    packed = mma_order_words(gptq_pack(q))
    rows, cols = torch.arange(K // 8)[:, None], torch.arange(N)[None, :]
    assert {mma_col(r, base + c) % 32 for r in range(4) for c in range(8)
            for base in (0, 8, 16, 24)} == set(range(32))
    logical = packed.gather(1, mma_col(rows, cols).expand(K // 8, N))
    unpacked = torch.stack([(logical.to(torch.int64) >> (4 * i)) & 15 for i in range(8)], 1)
    chunks = unpacked.reshape(K // 32, 32, N)
    assert torch.equal(chunks.sort(dim=1).values, q.reshape(K // 32, 32, N).sort(dim=1).values)
    assert chunks[0, 8 * 1 + 4 * 1 + 3, 5] == q[16 + 8 + 2 + 1, 5]  # word 1, nibble e 3 + 4
    cfg = {"kind": "regs_p", "BM": 32, "BN": 64, "threads": 32, "stages": 2, "splits": splits,
           "SR": sr}
    assert _form_error(cfg, 24, K, N, group, dtype, zeros, seed=17, select=32) < 1e-2


def test_regs_p_has_no_reordering_in_its_loop(tmp_path):
    """regs_p's sm_90a kernel multiplies X's tile as the producer copied it: no shared
    stores at all (regs_w's reordered copy of X is its only STS) and fewer barriers; the
    words unpacked as regs_w's (HGMMA from registers, HADD2 / HFMA2 pairs), no local memory."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass

    texts = {}
    for kind in ("regs_w", "regs_p"):
        layout = "mma" if kind == "regs_p" else "gptq"
        kernel = quant.quant_linear_kernel(16, 14336, 4096, "float16", "float16", 4, 128, False,
                                           layout, kind=kind, BM=16, BN=128, threads=128,
                                           stages=2, splits=8, SR=1)
        texts[kind] = sass(tiled.compile(kernel, target="cuda:sm_90a", cache=False).artifact,
                           tmp_path)
    w, p = texts["regs_w"], texts["regs_p"]
    assert re.search(r"HGMMA\.64x16x16\.F32 R\d+, R\d+, gdesc", p) and "HFMA2" in p
    assert re.search(r"\bSTS", w) and not re.search(r"\b(STS|LDL|STL)", p)
    assert p.count("BAR.SYNC") < w.count("BAR.SYNC")


@pytest.mark.parametrize("kind,dtype,zeros,group,H,sr,sum", [
    ("regs_w", "float16", False, 128, 2, 0, "kernel"),
    ("regs_w", "bfloat16", True, 128, 4, 1, "kernel"),
    ("regs_w", "float16", True, 64, 2, 1, "last"),
    ("regs_p", "float16", False, 128, 4, 1, "last"),
    ("regs_p", "bfloat16", True, 64, 2, 0, "kernel")])
def test_regs_w_over_slices_of_a_group(kind, dtype, zeros, group, H, sr, sum):
    """regs_w and regs_p with a group's K in H slices (each its own MMA into the group's
    product, slice i + 1 unpacked into the other set of registers): the dequantized product,
    over two splits (added up by splitk_sum or in the kernel), a ragged token tile and a
    ragged column tile."""
    cfg = {"kind": kind, "BM": 32, "BN": 64, "threads": 32, "stages": 2, "splits": 2,
           "SR": sr, "H": H, "sum": sum}
    assert _form_error(cfg, 40, 512, 96, group, dtype, zeros, seed=23, select=32) < 1e-2


def test_slices_of_a_group_are_checked():
    with pytest.raises(ValueError, match="slices of whole 32-wide chunks"):
        quant.quant_linear_kernel(16, 256, 512, "float16", "float16", 4, 64, False,
                                  kind="regs_w", BM=16, BN=64, H=4)
    with pytest.raises(ValueError, match="for the 4-bit regs_w and regs_p forms"):
        quant.quant_linear_kernel(16, 256, 512, "float16", "float16", 4, 128, False,
                                  kind="regs_g", BM=16, BN=64, H=2)


@pytest.mark.parametrize("kind,H", [("regs_p", 2), ("regs_w", 4)])
def test_slices_are_unpacked_while_the_slice_before_is_in_the_mma(tmp_path, kind, H):
    """On sm_90a a slice's register operand is filled while the MMA of the slice before it
    runs: the wait plan retires that MMA only after the next one is issued (retire<1>,
    never retire<0> between them), ptxas serializes no wgmma and injects no wait (no C75xx
    remark), and the SASS has the unpacking's 16-bit pair operations between the first
    HGMMA and the first wait for it; no local memory."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass
    from tests.compiler.test_sm90_sass import _ptxas_remarks

    kernel = quant.quant_linear_kernel(16, 14336, 4096, "float16", "float16", 4, 128, False,
                                       "mma" if kind == "regs_p" else "gptq", kind=kind, BM=16,
                                       BN=128, threads=128, stages=2, splits=4, SR=1, H=H)
    c = tiled.compile(kernel, target="cuda:sm_90a", cache=False)
    loop = c.source[c.source.index("wgmma_rows_rs_issue"):]
    waits = re.findall(r"wgmma_rows_rs_issue|retire<\d>", loop)
    assert waits[:2 * H] == ["wgmma_rows_rs_issue"] + ["wgmma_rows_rs_issue", "retire<1>"] * (
        H - 1) + ["retire<0>"], waits
    assert re.search(r"\(ws1_ptr \+ \d+\) =", loop[:loop.index("retire<1>")])
    assert _ptxas_remarks(c.source, tmp_path) == []
    text = sass(c.artifact, tmp_path)
    first = text.index("HGMMA")
    between = text[first:text.index("WARPGROUP.DEPBAR", first)]
    assert re.search(r"\bH(ADD|FMA)2\b", between)
    assert not re.search(r"\b(LDL|STL)\b", text)


@pytest.mark.parametrize("zeros,splits,group", [(False, 1, 64), (False, 2, 64),
                                                 (True, 1, 128)])
def test_regs_w_in_float16(zeros, splits, group):
    """regs_w's float16 form masks two of a word's nibble pairs in place (1024 + 16 q,
    scaled by 1/16 after): exact, so within float16's rounding of the dequantized product.
    With zero points each value is q exactly, minus its zero point rounded once to float16
    (fractional zero points too), then the group scale after the MMA."""
    cfg = {"kind": "regs_w", "BM": 32, "BN": 32, "threads": 32, "stages": 2, "splits": splits}
    assert _form_error(cfg, 24, 256, 80, group, "float16", zeros, seed=13, select=32,
                       round_zeros=False) < 1e-3  # zero points not integers


@pytest.mark.parametrize("dtype,tokens", [("float16", 16), ("bfloat16", 32)])
def test_regs_w_unpacks_a_word_per_thread_two_values_an_instruction(tmp_path, dtype, tokens):
    """regs_w on sm_90a: wgmma's RS form; each 32-bit register of the operand is one masked
    word (no PRMT repacking two halves), its subtraction two values at once (HADD2 / HFMA2,
    the .BF16_V2 forms for bfloat16); a thread's shared loads of the words a quarter of
    regs_g's (each word read once for its eight values, where regs_g reads it per pair),
    plus X's reordering; no local memory."""
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import re

    import tiled
    from tests.compiler.test_sm90_path import sass

    def compiled(kind):
        k = quant.quant_linear_kernel(tokens, 14336, 4096, dtype, dtype, 4, 128, False,
                                      kind=kind, BM=tokens, BN=128, threads=128, stages=2,
                                      splits=4)
        return sass(tiled.compile(k, target="cuda:sm_90a", cache=False).artifact, tmp_path)

    words, grouped = compiled("regs_w"), compiled("regs_g")
    assert re.search(rf"HGMMA\.64x{tokens}x16\.F32(\.BF16)? R\d+, R\d+, gdesc", words)
    assert not re.search(r"\b(PRMT|HMMA|LDL|STL)\b", words)
    pairs = len(re.findall(r"\bH(ADD|FMA)2(\.BF16_V2)?\b", words))
    assert pairs >= 128 * 128 // 128 // 2  # a thread's 128 values, two an instruction
    word_loads = len(re.findall(r"\bLDS\b", words)) - len(re.findall(r"\bSTS\.U16\b", words))
    assert word_loads * 4 <= len(re.findall(r"\bLDS\b", grouped))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_w8a16_regs_w_unpacks_byte_pairs_in_registers(tmp_path, dtype):
    """8-bit regs_w on sm_90a: wgmma's RS form (no 16-bit shared tile of W, no shared stores
    but X's reordering), no I2F (float16: one LOP3 a byte pair and HADD2; bfloat16: float32
    through 2^23, then pairs rounded two at a time, F2FP), no PRMT, no local memory."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass

    k = quant.quant_linear_kernel(16, 14336, 4096, dtype, dtype, 8, 0, False, kind="regs_w",
                                  BM=16, BN=128, threads=128, stages=2, splits=4)
    text = sass(tiled.compile(k, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert re.search(r"HGMMA\.64x16x16\.F32(\.BF16)? R\d+, R\d+, gdesc", text)
    assert not re.search(r"\b(PRMT|HMMA|LDL|STL)\b", text)
    # the few I2F are the launch's index arithmetic, not the bytes (64 a thread a step)
    assert len(re.findall(r"\bI2F", text)) < 16
    if dtype == "float16":
        assert len(re.findall(r"\bHADD2\b", text)) >= 32
    else:
        assert len(re.findall(r"\bF2FP\.BF16", text)) >= 32
    assert len(re.findall(r"\bSTS", text)) <= 8  # X's reordering: 16 x 64 over 128 threads


@pytest.mark.parametrize("bits,splits", [(4, 2), (4, 4), (8, 2)])
def test_regs_w_adds_its_splits_up_in_the_kernel(bits, splits):
    """regs_w with sum="last" (tiled.ops.split_k): each split writes its float32 partial and
    the tile's last split adds them up into y in the same kernel; launched twice on the same
    counters (each launch leaves them at zero), 40 tokens (a ragged token tile) and 80
    columns (a ragged column tile)."""
    import tiled
    from tiled.ops import split_k

    g = torch.Generator().manual_seed(17)
    M, K, N = 40, 256, 80
    cfg = {"kind": "regs_w", "BM": 32 if bits == 4 else 16, "BN": 32, "threads": 32,
           "stages": 2, "splits": splits, "sum": "last"}
    if bits == 4:
        group, dt = 64, torch.float16
        q = torch.randint(0, 16, (K, N), generator=g)
        s = (torch.rand(K // group, N, generator=g) + 0.5).to(dt)
        qweight, w = gptq_pack(q), (q.float() - 8) * s.float().repeat_interleave(group, 0)
    else:
        group, dt = 0, torch.bfloat16
        q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        s = (torch.rand(N, generator=g) / 64).to(dt)
        qweight, w = q.view(torch.int32), (q.float() * s.float()[:, None]).T
    x = torch.randn(M, K, generator=g).to(dt)
    name = str(dt).removeprefix("torch.")
    kernel = tiled.compile(quant.quant_linear_kernel(64, N, K, name, name, bits, group, False,
                                                     **cfg), target="cpu")
    for _ in range(2):
        y = torch.zeros(M, N, dtype=dt)
        quant._run(kernel, cfg, [x, qweight, s, torch.zeros(1, dtype=dt), y])
        assert _rel(y, x.float() @ w) < (1e-3 if bits == 4 else 1e-2)
    assert not split_k.counters(torch.device("cpu"), 8).any()


def test_sum_last_is_for_regs_w_only():
    with pytest.raises(ValueError, match="regs_w"):
        quant.quant_linear_kernel(16, 256, 256, "float16", "float16", 4, 128, False,
                                  kind="swap", BM=16, BN=64, threads=128, stages=2, splits=2,
                                  sum="last")


def test_regs_w_last_sum_on_sm90a(tmp_path):
    """regs_w with sum="last" on sm_90a: still wgmma's RS form, the tile's count an atomic,
    no local memory."""
    import re
    import shutil

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    import tiled
    from tests.compiler.test_sm90_path import sass

    k = quant.quant_linear_kernel(16, 14336, 4096, "float16", "float16", 4, 128, False,
                                  kind="regs_w", BM=16, BN=128, threads=128, stages=2,
                                  splits=4, sum="last")
    text = sass(tiled.compile(k, target="cuda:sm_90a", cache=False).artifact, tmp_path)
    assert re.search(r"HGMMA\.64x16x16\.F32 R\d+, R\d+, gdesc", text)
    assert re.search(r"\bATOMG\b", text)
    assert not re.search(r"\b(PRMT|LDL|STL)\b", text)


def test_regs_g_refuses_zero_points():
    """regs_g subtracts BASE + 8 in 16-bit arithmetic; a fractional zero point beside BASE
    would round, so it takes symmetric weights only (the tuner skips it elsewhere)."""
    with pytest.raises(ValueError, match="symmetric"):
        quant.quant_linear_kernel(16, 256, 256, "float16", "float16", 4, 128, True,
                                  kind="regs_g", BM=16, BN=64, threads=128, stages=2)


def test_the_space_holds_regs_w_with_group_scales_in_shared_for_4_bit_only():
    """regs_w is in the tuned space twice, with SR for 4-bit weights and without for 8-bit
    ones; each config traces for the bits it is for and the factory refuses it for the other
    (the tuner skips it there, before compiling); regs_g is in it with SR only."""
    sr = [c for c in quant.CUDA_SPACE if c["kind"] == "regs_w" and c.get("SR")]
    plain = [c for c in quant.CUDA_SPACE if c["kind"] == "regs_w" and not c.get("SR")]
    assert len(sr) == len(plain) == len(quant.REGS_W_CONFIGS)
    assert all(c.get("SR") for c in quant.CUDA_SPACE if c["kind"] == "regs_g")
    assert not quant.sr_twins([*sr, *plain[:1]])[1:]  # twins only of configs without SR
    for cfgs, bits in ((sr, 4), (plain, 8)):
        for cfg in cfgs:
            M = next(m for m in (1, 16, 32, 64) if quant._fits(cfg, m, bits))
            kernel = quant.quant_linear_kernel(M, 512, 1024, "float16", "float16", bits,
                                               128 if bits == 4 else 0, False, **cfg)
            assert kernel.ir is not None
    with pytest.raises(ValueError, match="8-bit regs_w"):
        quant.quant_linear_kernel(16, 512, 1024, "float16", "float16", 8, 0, False, **sr[0])
