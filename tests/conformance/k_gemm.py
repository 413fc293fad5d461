"""GEMM kernels the way TileLang's gemm examples write them: the tiled pipelined GEMM with a
swizzled block order and layout hint, an NT GEMM with a warp policy, split-K and stream-K
with atomic adds, fp8 inputs, and a GEMM whose A operand lives in registers."""

import tiled
import tiled.lang as T
from tests.conformance.cases import Case, register, zeros_like_inputs


def _mm_inputs(rng, s, dtype="float16", b_nk=False):
    b_shape = (s["N"], s["K"]) if b_nk else (s["K"], s["N"])
    return [(rng.standard_normal((s["M"], s["K"])), dtype), (rng.standard_normal(b_shape), dtype)]


def _mm_work(s):
    return "flop", 2 * s["M"] * s["N"] * s["K"]


@tiled.jit(out_idx=[-1])
def matmul(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=3, dtype="float16",
           accum_dtype="float", threads=128):
    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.annotate_layout({A_shared: T.make_swizzled_layout(A_shared)})
            T.use_swizzle(panel_size=10, enable=True)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm


register(Case(
    "gemm", "gemm",
    ("prim_func", "jit", "copy_g2s", "gemm_ss", "copy_f2g", "pipelined", "use_swizzle",
     "annotate_layout"),
    factory=matmul, inputs=_mm_inputs, reference=lambda x, s: x[0] @ x[1], tol=2e-3,
    cpu={"M": 200, "N": 136, "K": 96, "block_M": 64, "block_N": 64},
    gpu={"M": 4096, "N": 4096, "K": 4096, "block_K": 64, "num_stages": 4, "block_N": 256,
         "threads": 256},
    work=_mm_work, torch_op=lambda torch, x, s: (lambda: torch.matmul(x[0], x[1]))))


@tiled.jit(out_idx=[-1])
def matmul_nt(M, N, K, block_M=64, block_N=64, block_K=32, dtype="bfloat16", threads=128):
    Mdyn = T.dyn("M")

    @T.prim_func
    def gemm_nt(A: T.Tensor((Mdyn, K), dtype), B: T.Tensor((N, K), dtype),
                C: T.Tensor((Mdyn, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(Mdyn, block_M), threads=threads) as (
                bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M:(by + 1) * block_M, k * block_K:(k + 1) * block_K],
                       A_shared)
                T.copy(B[bx * block_N:(bx + 1) * block_N, k * block_K:(k + 1) * block_K],
                       B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True, clear_accum=k == 0,
                       policy=T.GemmWarpPolicy.FullCol)
            T.copy(C_local, C[by * block_M:(by + 1) * block_M, bx * block_N:(bx + 1) * block_N])

    return gemm_nt


register(Case(
    "gemm_nt", "gemm",
    ("transpose", "gemm_policy", "clear_accum", "slice", "symbolic", "copy_g2s", "gemm_ss",
     "copy_f2g", "if", "jit"),
    factory=matmul_nt, inputs=lambda rng, s: _mm_inputs(rng, s, "bfloat16", b_nk=True),
    reference=lambda x, s: x[0] @ x[1].T, tol=1e-3,
    cpu={"M": 100, "N": 128, "K": 96},
    gpu={"M": 4096, "N": 4096, "K": 4096, "block_M": 128, "block_N": 256, "block_K": 64,
         "threads": 256},
    work=_mm_work, torch_op=lambda torch, x, s: (lambda: torch.matmul(x[0], x[1].T))))


def _tf32_mm(torch, x):
    def run():  # cuBLAS in tf32, as the kernel computes, then back to torch's default
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return torch.matmul(x[0], x[1].T)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
    return run


register(Case(
    "gemm_nt_tf32", "gemm",
    ("transpose", "gemm_policy", "clear_accum", "slice", "symbolic", "copy_g2s", "gemm_ss",
     "copy_f2g", "if", "jit"),
    factory=matmul_nt, inputs=lambda rng, s: _mm_inputs(rng, s, "float32", b_nk=True),
    reference=lambda x, s: x[0] @ x[1].T, tol=3e-3,
    cpu={"M": 100, "N": 128, "K": 128, "block_K": 32, "dtype": "float32"},
    gpu={"M": 4096, "N": 4096, "K": 4096, "block_M": 128, "block_N": 256, "block_K": 32,
         "threads": 256, "dtype": "float32"},
    work=_mm_work, torch_op=lambda torch, x, s: _tf32_mm(torch, x),
    notes="float32 inputs: T.gemm is tf32 on the tensor cores (as TileLang's); timed beside "
          "cuBLAS in tf32"))


@tiled.jit
def matmul_splitk(M, N, K, block_M=64, block_N=64, block_K=32, split_k=4, dtype="float16",
                  threads=128):
    k_per_split = K // split_k

    @T.prim_func
    def splitk(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
               C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k,
                      threads=threads) as (bx, by, bz):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(k_per_split, block_K), num_stages=2):
                k0 = bz * k_per_split + ko * block_K
                T.copy(A[by * block_M, k0], A_shared)
                T.copy(B[k0, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local)
            for i, j in T.Parallel(block_M, block_N):
                T.atomic_add(C[by * block_M + i, bx * block_N + j], C_local[i, j])

    return splitk


def _splitk_call(kernel, x, s):
    """Split-K accumulates into C: the caller passes it zeroed (out_idx would not)."""
    c = zeros_like_inputs(x, (s["M"], s["N"]), "float32")
    kernel(*x, c)
    return c


register(Case(
    "gemm_splitk", "gemm_splitk", ("atomic_add", "pipelined", "gemm_ss", "jit"),
    factory=matmul_splitk, call=_splitk_call, inputs=_mm_inputs,
    reference=lambda x, s: x[0] @ x[1], tol=2e-3,
    cpu={"M": 128, "N": 64, "K": 256},
    gpu={"M": 4096, "N": 4096, "K": 16384, "block_M": 128, "block_N": 128, "block_K": 64},
    work=_mm_work, torch_op=lambda torch, x, s: (lambda: torch.matmul(x[0], x[1]))))


@tiled.jit
def matmul_streamk(M, N, K, block_M=64, block_N=64, block_K=32, units=8, dtype="float16",
                   threads=128, num_stages=3):
    """Stream-K as TileLang's example splits it: `units` persistent blocks first share the
    (tile, k-step) iterations of the last one or two waves' tiles in even runs, adding each
    run's partial tile into C (zeroed by the caller), then take the remaining whole waves a
    tile each. A unit's run crosses at most `runs` tiles: the walk TileLang writes as
    `while start < last` is a bounded T.serial loop with `if`s here (the Tile IR has no loop
    of unknown trip count)."""
    tiles_n = T.ceildiv(N, block_N)
    tiles = T.ceildiv(M, block_M) * tiles_n
    k_steps = T.ceildiv(K, block_K)
    sk_tiles = tiles % units
    if tiles - sk_tiles > units:
        sk_tiles += units
    waves = (tiles - sk_tiles) // units
    per_unit, extra = divmod(sk_tiles * k_steps, units)
    runs = T.ceildiv(per_unit + 1, k_steps) + 1

    @T.prim_func
    def streamk(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                C: T.Tensor((M, N), "float32")):
        with T.Kernel(units, threads=threads) as pid:
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            start = T.alloc_var("int32")
            tile = T.alloc_var("int32")
            kb = T.alloc_var("int32")
            ke = T.alloc_var("int32")
            start = pid * per_unit + T.min(pid, extra)
            last = (pid + 1) * per_unit + T.min(pid + 1, extra)
            for s in T.serial(runs + waves):
                if s < runs:  # the unit's stream-K run, one tile's part at a time
                    tile = start // k_steps
                    kb = start % k_steps
                    ke = T.min(kb + last - start, k_steps)
                    start = start + ke - kb
                else:  # a whole tile of the data-parallel waves
                    tile = sk_tiles + (s - runs) * units + pid
                    kb = 0
                    ke = k_steps
                if kb < ke:
                    ty, tx = tile // tiles_n, tile % tiles_n
                    T.clear(C_local)
                    for k in T.Pipelined(ke - kb, num_stages=num_stages):
                        T.copy(A[ty * block_M, (kb + k) * block_K], A_shared)
                        T.copy(B[(kb + k) * block_K, tx * block_N], B_shared)
                        T.gemm(A_shared, B_shared, C_local)
                    if kb == 0 and ke == k_steps:  # the whole tile here: no other unit adds
                        T.copy(C_local, C[ty * block_M, tx * block_N])
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            T.atomic_add(C[ty * block_M + i, tx * block_N + j], C_local[i, j])

    return streamk


register(Case(
    "gemm_streamk", "gemm_streamk", ("atomic_add", "if", "alloc_var", "pipelined", "gemm_ss", "jit",
                                     "prim_func"),
    factory=matmul_streamk, call=_splitk_call, inputs=_mm_inputs,
    reference=lambda x, s: x[0] @ x[1], tol=2e-3,
    cpu={"M": 128, "N": 128, "K": 160, "units": 3},
    gpu={"M": 4096, "N": 4096, "K": 4096, "units": 132, "block_M": 128, "block_N": 256,
         "block_K": 64, "threads": 256},
    work=_mm_work, torch_op=lambda torch, x, s: (lambda: torch.matmul(x[0], x[1]))))


@tiled.jit(out_idx=[-1])
def matmul_fp8(M, N, K, block_M=64, block_N=64, block_K=64, in_dtype="float8_e4m3",
               threads=128):
    dt = T.float8_e4m3 if in_dtype == "float8_e4m3" else T.float8_e5m2

    @T.prim_func
    def gemm_fp8(A: T.Tensor((M, K), dt), B: T.Tensor((N, K), dt),
                 C: T.Tensor((M, N), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dt)
            B_shared = T.alloc_shared((block_N, block_K), dt)
            C_local = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True, k_pack=1)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm_fp8


register(Case(
    "gemm_fp8_e4m3", "gemm_fp8", ("fp8", "k_pack", "transpose", "gemm_ss", "jit", "prim_func"),
    factory=matmul_fp8,
    inputs=lambda rng, s: [(rng.standard_normal((s["M"], s["K"])), "float8_e4m3"),
                           (rng.standard_normal((s["N"], s["K"])), "float8_e4m3")],
    # 1e-3: Hopper's float8 wgmma accumulates with fewer bits than float32 (2e-4 measured at
    # K = 256 on the H200); the cpu target is exact.
    reference=lambda x, s: x[0] @ x[1].T, tol=1e-3,
    cpu={"M": 64, "N": 128, "K": 256, "block_K": 128},  # whole 128-byte rows: wgmma on sm_90a
    gpu={"M": 4096, "N": 4096, "K": 4096, "block_M": 128, "block_N": 128, "block_K": 128},
    work=_mm_work, torch_op=lambda torch, x, s: _fp8_mm(torch, x),
    notes="timed beside torch._scaled_mm (unit scales, float32 out)"))


def _fp8_mm(torch, x):
    """torch's fp8 GEMM: torch._scaled_mm(A, B^T) with unit scales, B^T column-major as it
    wants (B is [N, K] row-major). Where it has none (a CPU build), the float32 product."""
    a, b = x
    if not a.is_cuda:
        return lambda: a.float() @ b.float().T
    one = torch.ones((), device=a.device, dtype=torch.float32)
    return lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                    out_dtype=torch.float32)


@tiled.jit(out_idx=[-1])
def matmul_rs(M, N, K, block_M=64, block_N=64, block_K=32, dtype="float16", threads=128):
    """A's tile is loaded into registers (a fragment) and fed to T.gemm from there."""

    @T.prim_func
    def gemm_rs(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
                C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_frag = T.alloc_fragment((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            C_cast = T.alloc_fragment((block_M, block_N), dtype)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, k * block_K], A_frag)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm(A_frag, B_shared, C_local)
            T.copy(C_local, C_cast)
            T.copy(C_cast, C[by * block_M, bx * block_N])

    return gemm_rs


register(Case(
    "gemm_rs", "gemm", ("gemm_rs", "copy_g2f", "copy_f2f_cast", "copy_f2g", "jit", "prim_func"),
    factory=matmul_rs, inputs=_mm_inputs, reference=lambda x, s: x[0] @ x[1], tol=2e-3,
    cpu={"M": 130, "N": 64, "K": 96},
    gpu={"M": 4096, "N": 4096, "K": 4096, "block_M": 128, "block_N": 128},
    work=_mm_work, torch_op=lambda torch, x, s: (lambda: torch.matmul(x[0], x[1]))))
