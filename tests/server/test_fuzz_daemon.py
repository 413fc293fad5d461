"""Zero INTERNAL over 20,000 mutated programs sent to a real daemon (issue 10, finding 8: the
verifier is the contract; anything it accepts compiles or fails with a located error).

The sample programs (tests/ir/programs.py) and the examples' kernels are mutated (ints,
dtypes, operators, indices, extents, statements dropped, duplicated, swapped or wrapped,
names, shapes, float constants), deterministically from one seed, and sent as CompileRequests
over the daemon's Unix socket by several client threads, with a few request-level oddities
(targets, options, raw bytes cut or flipped). Most mutants are rejected by the verifier (cheap);
those that verify are a bounded set, sent many times (the repeats are cache hits), mostly for
`cpu` and a handful for `cuda:sm_80` / `cuda:sm_90a` (each costs an nvcc run). Every gRPC
status is counted and printed; INTERNAL and UNKNOWN must not occur. A failure lists the first
requests that got one, printed, so each is a reproducer.
"""

from __future__ import annotations

import collections
import concurrent.futures
import random
import re
import sys
import time
from pathlib import Path

import grpc

from tests.daemon_util import running_daemon
from tests.ir import programs as P
from tiled.errors import VerifyError
from tiled.ir import Program, verify_program
from tiled.v1 import compile_pb2 as cpb
from tiled.v1 import tile_ir_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261201
REQUESTS = 20_000
THREADS = 8
ACCEPTED = 400  # distinct mutants that verify: each is compiled once for cpu, then hit
REJECTED = 3000  # distinct mutants the verifier refuses
CUDA_PROGRAMS = 6  # of the accepted ones, compiled for each cuda arch too (nvcc: ~1 s each)
ODD_PROGRAMS = 5  # of the accepted ones, sent with other valid options (one compile each)

FLOATS = (pb.FLOAT16, pb.BFLOAT16, pb.FLOAT32, pb.FLOAT64, pb.FLOAT8_E4M3, pb.FLOAT8_E5M2)
DTYPES = (pb.BOOL, pb.INT8, pb.INT16, pb.INT32, pb.INT64, pb.UINT8, pb.UINT16, pb.UINT32,
          pb.UINT64, *FLOATS)
INT_OPS = (pb.ADD, pb.SUB, pb.MUL, pb.DIV, pb.MIN, pb.MAX, pb.FLOOR_DIV, pb.FLOOR_MOD,
           pb.BIT_AND, pb.BIT_OR, pb.BIT_XOR, pb.SHL, pb.SHR)
CMP_OPS = (pb.EQ, pb.NE, pb.LT, pb.LE, pb.GT, pb.GE)
UNARY = (pb.NEG, pb.EXP, pb.EXP2, pb.LOG, pb.LOG2, pb.SQRT, pb.RSQRT, pb.TANH, pb.ABS,
         pb.SIGMOID, pb.FLOOR, pb.CEIL, pb.ERF, pb.SIN, pb.COS)
INTS = (0, 1, -1, 2, 3, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 255, 256,
        777, 1000, 1023, 1024, 4096, 65536, (1 << 31) - 1, -(1 << 31))
NAMES = ("", "1abc", "int", "x" * 70, "A_ptr", "M", "N", "d0", "d1", "tiled_x", "main", "exp",
         "__x", "bx", "k", "\u00e9", "a.b", "A", "B", "X", "Y", "float", "uint", "threadIdx",
         "i", "s", "out")
FLOAT_VALUES = (0.0, -0.0, 1.0, -1.0, 0.5, 1e30, -1e30, float("inf"), float("-inf"),
                float("nan"), 1e-40, 65504.0, 448.0, 1e300)
TARGETS = ("", "local", "CPU", "cuda", "cuda:sm_90", "cuda:sm_999", "rocm:gfx942", "metal",
           "cpu:arm64", "cuda:" + "9" * 100, "x" * 300)
OPTIONS = ("", "{}", "[]", "{", "null", '{"cuda_compiler": "nvrtc"}', '{"nope": 1}',
           '{"safe_access": false}', '{"safe_access": "yes"}', "[" * 400 + "]" * 400,
           '{"a": ' * 150 + "1" + "}" * 150)
VALID_OPTIONS = ('{"safe_access": false}', "{}")


# -- the mutator ------------------------------------------------------------------------------

def _walk(msg, out: list) -> list:
    out.append(msg)
    for field, value in msg.ListFields():
        if field.type == field.TYPE_MESSAGE:
            for item in value if field.is_repeated else [value]:
                _walk(item, out)
    return out


def _of(p: pb.Program, name: str) -> list:
    return [m for m in _walk(p, []) if m.DESCRIPTOR.name == name]


def _copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _int_expr(rng: random.Random, p: pb.Program, depth: int = 2) -> pb.Expr:
    vids = [v.id for v in p.vars if v.dtype == pb.INT32]
    if depth == 0 or rng.random() < 0.35:
        if vids and rng.random() < 0.6:
            return pb.Expr(dtype=pb.INT32, var=rng.choice(vids))
        return P.const(rng.choice(INTS[:24]))
    if rng.random() < 0.85:
        return P.binary(rng.choice(INT_OPS), _int_expr(rng, p, depth - 1),
                        _int_expr(rng, p, depth - 1))
    cond = P.binary(rng.choice(CMP_OPS), _int_expr(rng, p, 0), _int_expr(rng, p, 0))
    return P.select(cond, _int_expr(rng, p, depth - 1), _int_expr(rng, p, depth - 1))


def _perturbed(rng: random.Random, p: pb.Program, e: pb.Expr) -> pb.Expr:
    if rng.random() < 0.25 or e.dtype != pb.INT32:
        return _int_expr(rng, p)
    op = rng.choice((pb.ADD, pb.ADD, pb.SUB, pb.MUL, pb.MIN, pb.MAX, pb.FLOOR_DIV,
                     pb.FLOOR_MOD))
    return P.binary(op, _copy(e), P.const(rng.choice((1, 2, 3, 8, 32, 100, 1000, 1024, -1))))


def m_int(rng, p):
    slots = []
    for m in _walk(p, []):
        kind = m.DESCRIPTOR.name
        if kind == "Expr" and m.WhichOneof("kind") == "int_value":
            slots.append((m, "int_value", None))
        elif kind == "Dim" and m.WhichOneof("kind") == "size":
            slots.append((m, "size", None))
        elif kind == "Kernel":
            slots.append((m, "threads", None))
        elif kind == "For" and m.kind == pb.PIPELINED:
            slots.append((m, "num_stages", None))
        elif kind == "Reduce":
            slots.append((m, "dim", None))
        elif kind == "Region":
            slots += [(m, "extents", i) for i in range(len(m.extents))]
    if not slots:
        return
    m, field, i = rng.choice(slots)
    now = getattr(m, field)[i] if i is not None else getattr(m, field)
    value = rng.choice((*INTS, now + 1, now - 1, now * 2, now // 2))
    try:
        if i is not None:
            getattr(m, field)[i] = value
        else:
            setattr(m, field, value)
    except (ValueError, TypeError):  # out of the field's range: no mutation
        pass


def m_retype(rng, p):
    """Every use of one dtype becomes another: keeps the program's typing consistent."""
    typed = [m for m in _walk(p, []) if m.DESCRIPTOR.name in ("Expr", "Buffer", "Var")]
    old, new = rng.choice(sorted({m.dtype for m in typed})), rng.choice(DTYPES)
    for m in typed:
        if m.dtype != old:
            continue
        m.dtype = new
        if m.DESCRIPTOR.name == "Expr" and m.WhichOneof("kind") in ("int_value", "float_value"):
            value = getattr(m, m.WhichOneof("kind"))
            if new in FLOATS:
                m.float_value = float(value)
            else:
                m.int_value = int(value) if value == value and abs(value) < 1e18 else 0


def m_op(rng, p):
    exprs = [e for e in _of(p, "Expr") if e.WhichOneof("kind") in ("binary", "call")]
    m = rng.choice(exprs + _of(p, "For") + _of(p, "Reduce") + list(p.buffers) + _of(p, "Gemm"))
    kind = m.DESCRIPTOR.name
    if kind == "Expr" and m.WhichOneof("kind") == "binary":
        for group in (INT_OPS, CMP_OPS, (pb.AND, pb.OR)):
            if m.binary.op in group:
                m.binary.op = rng.choice(group)
    elif kind == "Expr" and len(m.call.args) == 1:
        m.call.op = rng.choice(UNARY)
    elif kind == "For":
        m.kind = rng.choice((pb.SERIAL, pb.PARALLEL, pb.PIPELINED, pb.UNROLL))
        m.num_stages = rng.choice((1, 2, 3)) if m.kind == pb.PIPELINED else 0
    elif kind == "Reduce":
        m.kind = rng.choice((pb.REDUCE_SUM, pb.REDUCE_MAX, pb.REDUCE_MIN))
        m.clear = rng.random() < 0.5
    elif kind == "Buffer" and m.scope not in (pb.GLOBAL, pb.BARRIER):
        m.scope = rng.choice((pb.SHARED, pb.FRAGMENT, pb.LOCAL))
    elif kind == "Gemm":
        field = rng.choice(("transpose_a", "transpose_b", "clear_accum"))
        setattr(m, field, not getattr(m, field))


def m_index(rng, p):
    slots = []
    for m in _walk(p, []):
        kind = m.DESCRIPTOR.name
        if kind in ("Load", "Store", "AtomicAdd"):
            slots += list(m.indices)
        elif kind == "Region":
            slots += list(m.offsets)
    if slots:
        e = rng.choice(slots)
        e.CopyFrom(_perturbed(rng, p, e))


def m_extent(rng, p):
    loops = _of(p, "For")
    if loops and rng.random() < 0.6:
        f = rng.choice(loops)
        f.extent.CopyFrom(_perturbed(rng, p, f.extent) if rng.random() < 0.5 else
                          P.const(rng.choice(INTS[:26])))
    else:
        g = rng.choice(p.kernel.grid)
        g.CopyFrom(_perturbed(rng, p, g) if rng.random() < 0.5 else
                   P.const(rng.choice(INTS[:24])))


def m_stmt(rng, p):
    seqs = [s for s in _of(p, "Seq") if s.stmts]
    if not seqs:
        return
    s = rng.choice(seqs)
    i, r = rng.randrange(len(s.stmts)), rng.random()
    if r < 0.35:
        del s.stmts[i]
    elif r < 0.55:
        s.stmts.add().CopyFrom(s.stmts[i])
    elif r < 0.7:
        j = rng.randrange(len(s.stmts))
        a, b = _copy(s.stmts[i]), _copy(s.stmts[j])
        s.stmts[i].CopyFrom(b)
        s.stmts[j].CopyFrom(a)
    elif r < 0.85:
        cond = P.binary(rng.choice(CMP_OPS), _int_expr(rng, p, 1), _int_expr(rng, p, 0))
        s.stmts[i].CopyFrom(P.if_(cond, _copy(s.stmts[i])))
    else:  # wrapped in a loop over a fresh var
        vid = max([v.id for v in p.vars], default=-1) + 1
        p.vars.add(id=vid, name=f"w{vid}", dtype=pb.INT32)
        s.stmts[i].CopyFrom(P.loop(vid, rng.choice((0, 1, 2, 4)), _copy(s.stmts[i]),
                                   rng.choice((pb.SERIAL, pb.UNROLL))))


def m_name(rng, p):
    r = rng.random()
    if r < 0.4:
        rng.choice(p.vars).name = rng.choice(NAMES)
    elif r < 0.8:
        rng.choice(p.params).name = rng.choice(NAMES)
    elif r < 0.9:
        p.name = rng.choice((*NAMES, "int", "a" * 120))
    else:
        rng.choice(p.buffers).name = rng.choice(NAMES)


def m_shape(rng, p):
    """A dim of a global tensor, static <-> symbolic."""
    d = rng.choice([d for b in p.buffers if b.scope == pb.GLOBAL for d in b.shape])
    if d.WhichOneof("kind") == "var":
        d.size = rng.choice((1, 7, 16, 100, 128, 777, 1000, 1024))
        return
    dims = sorted({x.var for b in p.buffers for x in b.shape if x.WhichOneof("kind") == "var"})
    if dims and rng.random() < 0.6:
        d.var = rng.choice(dims)
    else:
        vid = max([v.id for v in p.vars], default=-1) + 1
        p.vars.add(id=vid, name=rng.choice(("K", "L", "", "S")), dtype=pb.INT32)
        d.var = vid


def m_float(rng, p):
    floats = [e for e in _of(p, "Expr") if e.WhichOneof("kind") == "float_value"]
    if floats:
        rng.choice(floats).float_value = rng.choice(FLOAT_VALUES)


MUTATORS = (m_int, m_int, m_int, m_retype, m_retype, m_op, m_op, m_index, m_index, m_index,
            m_extent, m_extent, m_stmt, m_stmt, m_name, m_shape, m_float)


def mutant(rng: random.Random, seed: pb.Program) -> pb.Program:
    p = _copy(seed)
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        rng.choice(MUTATORS)(rng, p)
    return p


# -- the request stream -----------------------------------------------------------------------

def seed_programs() -> list[pb.Program]:
    sys.path.insert(0, str(ROOT / "examples"))
    import elementwise
    import flash_attention
    import gemm
    import softmax

    import tiled.lang as T

    kernels = [elementwise.add(block=256), elementwise.add("float16", 512, 128),
               softmax.softmax(N=64), gemm.matmul(M=T.dyn("M"), N=256, K=192, block_M=64,
                                                  block_N=64, block_K=32, num_stages=2),
               flash_attention.flash_attention(1, 2, 1, 100, 100, 64)]
    samples = [make() for _, make in sorted(P.SAMPLES.items())]
    return samples + [P.gemm(64, 64, 32, 2, 256, 256)] + [k.ir.proto for k in kernels]


def mutant_pools(rng: random.Random) -> tuple[list[pb.Program], list[pb.Program]]:
    """(distinct mutants that verify, distinct mutants the verifier refuses)."""
    seeds = seed_programs()
    accepted: dict[bytes, pb.Program] = {}
    rejected: dict[bytes, pb.Program] = {}
    for _ in range(60 * (ACCEPTED + REJECTED)):
        if len(accepted) >= ACCEPTED and len(rejected) >= REJECTED:
            break
        p = mutant(rng, rng.choice(seeds))
        data = p.SerializeToString(deterministic=True)
        if data in accepted or data in rejected:
            continue
        try:
            verify_program(Program(p))
        except VerifyError:
            if len(rejected) < REJECTED:
                rejected[data] = p
            continue
        if len(accepted) < ACCEPTED:
            accepted[data] = p
    return list(accepted.values()), list(rejected.values())


def _raw_request(rng: random.Random, p: pb.Program, target: str) -> bytes:
    """A CompileRequest whose program bytes are cut, flipped or spliced."""
    data = bytearray(p.SerializeToString())
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(max(len(data), 1))
        op = rng.random()
        if op < 0.4 and data:
            data[pos] ^= rng.randint(1, 255)
        elif op < 0.6:
            del data[pos:]
        elif op < 0.8:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del data[pos:pos + rng.randint(1, 8)]
    head = cpb.CompileRequest(target=target).SerializeToString()
    n, size = len(data), bytearray()
    while True:  # field 1 (program), length-delimited
        size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    return head + b"\x0a" + bytes(size) + bytes(data)


def request_stream(rng: random.Random, accepted: list, rejected: list) -> list[tuple]:
    """REQUESTS (kind, request, description); kind "msg" (a CompileRequest) or "raw"."""
    cuda, odd = accepted[:CUDA_PROGRAMS], accepted[CUDA_PROGRAMS:CUDA_PROGRAMS + ODD_PROGRAMS]
    out = []
    for _ in range(REQUESTS):
        r = rng.random()
        if r < 0.03:
            p = rng.choice(accepted + rejected)
            out.append(("raw", _raw_request(rng, p, "cpu"), "cpu, program bytes damaged"))
            continue
        if r < 0.05:  # odd target or options on a program the verifier refuses
            req = cpb.CompileRequest(program=rng.choice(rejected), target=rng.choice(TARGETS),
                                     options_json=rng.choice(OPTIONS),
                                     cache_only=rng.random() < 0.2)
        elif r < 0.06:  # other options, or an odd request, on a program that compiles
            req = cpb.CompileRequest(program=rng.choice(odd),
                                     target=rng.choice(("cpu", "local")),
                                     options_json=rng.choice(VALID_OPTIONS + OPTIONS[:5]),
                                     inline_limit=rng.choice((0, 1, 1 << 20)),
                                     cache_only=rng.random() < 0.2)
        elif r < 0.065:
            req = cpb.CompileRequest(program=rng.choice(cuda),
                                     target=rng.choice(("cuda:sm_80", "cuda:sm_90a")))
        elif r < 0.40:
            req = cpb.CompileRequest(program=rng.choice(accepted), target="cpu")
        else:
            req = cpb.CompileRequest(program=rng.choice(rejected),
                                     target=rng.choice(("cpu", "cpu", "cpu", "cuda:sm_80")))
        out.append(("msg", req, f"target {req.target[:40]!r}, options "
                                f"{req.options_json[:40]!r}, cache_only {req.cache_only}"))
    return out


def describe(kind: str, req, what: str) -> str:
    if kind == "raw":
        return f"{what} ({len(req)} bytes)"
    text = str(Program(req.program))
    return f"{what}\n{text if len(text) < 4000 else text[:4000] + ' ...'}"


def test_zero_internal_over_mutated_programs(tmp_path, library_memo, capsys):
    t0 = time.perf_counter()
    rng = random.Random(SEED)
    accepted, rejected = mutant_pools(rng)
    stream = request_stream(rng, accepted, rejected)
    t_built = time.perf_counter() - t0
    counts: collections.Counter = collections.Counter()
    bad: list[tuple[int, str, str]] = []
    with running_daemon(tmp_path, library_memo=library_memo) as d:
        raw_compile = d["channel"].unary_unary(
            "/tiled.v1.Compiler/Compile", request_serializer=None,
            response_deserializer=cpb.CompileResponse.FromString)

        def send(i: int) -> None:
            kind, req, _ = stream[i]
            try:
                if kind == "raw":
                    raw_compile(req, timeout=300)
                else:
                    d["stub"].Compile(req, timeout=300)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
                if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
                    bad.append((i, code.name, e.details() or ""))
            counts[code.name] += 1

        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(send, range(len(stream))))
        caps = d["stub"].Capabilities(cpb.CapabilitiesRequest(), timeout=30)  # still serving
    elapsed = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\nfuzzed daemon: {len(stream)} requests ({len(accepted)} distinct programs "
              f"that verify, {len(rejected)} that do not; mutants built in {t_built:.1f} s), "
              f"{elapsed:.0f} s in all, {caps.compiles_total} compiles, "
              f"{caps.compile_failures_total} failed compiles")
        for name, n in counts.most_common():
            print(f"  {name:20s} {n}")
    assert sum(counts.values()) == REQUESTS
    assert counts["OK"] > 1000 and counts["INVALID_ARGUMENT"] > 1000, counts
    kinds: dict[str, list] = {}  # one reproducer per kind of failure
    for i, code, details in sorted(bad):
        kinds.setdefault(re.sub(r"0x[0-9a-f]+|\d+", "N", f"{code}: {details}")[:160], []).append(i)
    shown = "\n\n".join(f"{len(ids)} x {kind}\nrequest {ids[0]}: {describe(*stream[ids[0]])}"
                        for kind, ids in kinds.items())
    assert not bad, (f"{len(bad)} requests got INTERNAL or UNKNOWN, of {len(kinds)} kinds:\n\n"
                     f"{shown}"
                     "\n\nthe daemon's last log lines:\n" +
                     "".join(line[:400] + "\n" for line in d["log"].lines()[-8:]))
