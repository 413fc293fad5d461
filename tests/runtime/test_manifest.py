"""The manifest schema: round trips, validation messages, the expression language."""

from __future__ import annotations

import json
import pickle

import pytest

from tiled.errors import LaunchError
from tiled.runtime import KernelArg, Manifest, ManifestError, Param, eval_expr
from tiled.runtime.manifest import check_expr

SHA = "ab" * 32


def gemm_dict(**changes) -> dict:
    d = {
        "manifest_version": 1, "name": "gemm", "program_digest": "cd" * 32,
        "target": "cuda:sm_90a", "backend": "cuda", "arch": "sm_90a",
        "artifact_format": "cubin", "artifact_sha256": SHA, "symbol": "gemm_kernel",
        "params": [
            {"name": "A", "kind": "tensor", "dtype": "float16", "shape": ["M", 1024], "align": 16},
            {"name": "B", "kind": "tensor", "dtype": "float16", "shape": [1024, "N"]},
            {"name": "C", "kind": "tensor", "dtype": "float32", "shape": ["M", "N"]},
            {"name": "alpha", "kind": "scalar", "dtype": "float32"},
        ],
        "kernel_args": [{"kind": "tensor", "param": 0}, {"kind": "tensor", "param": 1},
                        {"kind": "tensor", "param": 2}, {"kind": "scalar", "param": 3},
                        {"kind": "dim", "name": "M", "dtype": "int32"}],
        "grid": [["ceildiv", "N", 128], ["ceildiv", "M", 128], 1], "block": [128, 1, 1],
        "dynamic_smem_bytes": 49152, "cluster": [1, 1, 1],
    }
    d.update(changes)
    return d


def test_round_trip_is_exact():
    d = gemm_dict()
    m = Manifest.from_dict(d)
    assert m.to_dict() == d
    assert Manifest.from_json(m.to_json()) == m
    assert json.loads(m.to_json()) == d
    assert m.to_json() == Manifest.from_dict(json.loads(json.dumps(d, indent=2))).to_json()
    assert list(json.loads(m.to_json())) == sorted(d)  # sorted keys
    assert Manifest.coerce(m.to_json()) == Manifest.coerce(d) == Manifest.coerce(m)
    assert hash(m) == hash(Manifest.from_json(m.to_json()))
    assert pickle.loads(pickle.dumps(m)) == m


def test_parsed_fields():
    m = Manifest.from_dict(gemm_dict())
    assert m.dims == ("M", "N")
    assert m.params[0] == Param("A", "tensor", "float16", ("M", 1024), 16)
    assert m.params[0].alignment == 16 and m.params[1].alignment == 2  # default: element size
    assert m.kernel_args[4] == KernelArg("dim", name="M", dtype="int32")
    assert m.grid[0] == ("ceildiv", "N", 128)


def test_cpu_manifest_defaults():
    d = gemm_dict(target="cpu", backend="cpu", arch="x86_64", artifact_format="so",
                  symbol="__tvm_ffi_gemm")
    for key in ("kernel_args", "grid", "block", "dynamic_smem_bytes", "cluster"):
        del d[key]
    m = Manifest.from_dict(d)
    assert m.kernel_args == () and m.grid == (1, 1, 1) and m.cluster == (1, 1, 1)
    assert Manifest.from_json(m.to_json()) == m


def test_direct_construction_is_validated():
    m = Manifest.from_dict(gemm_dict())
    args = {k: getattr(m, k) for k in ("name", "program_digest", "target", "backend", "arch",
                                       "artifact_format", "artifact_sha256", "symbol")}
    built = Manifest(**args, params=[p.to_dict() for p in m.params],
                     kernel_args=list(m.kernel_args), grid=[["ceildiv", "N", 128],
                                                            ["ceildiv", "M", 128], 1],
                     block=[128, 1, 1], dynamic_smem_bytes=49152)
    assert built == m
    with pytest.raises(ManifestError, match=r"params\[0\].dtype: unknown dtype 'half4'"):
        Manifest(**args, params=[Param("A", "tensor", "half4", ("M",))])


@pytest.mark.parametrize("change, message", [
    ({"manifest_version": 2}, r"manifest_version: this runtime reads version 1, got 2"),
    ({"artifact_sha256": "xyz"}, r"artifact_sha256: expected 64 lowercase hex"),
    ({"program_digest": "AB" * 32}, r"program_digest: expected 64 lowercase hex"),
    ({"name": ""}, r"name: expected a non-empty string"),
    ({"target": "cpu"}, r"target: 'cpu' does not belong to backend 'cuda'"),
    ({"artifact_format": "so"}, r"artifact_format: backend 'cuda' produces 'cubin', got 'so'"),
    ({"extra_field": 1}, r"unknown field\(s\) extra_field"),
    ({"grid": [1, 1]}, r"grid: expected 3 entries, got 2"),
    ({"grid": [["pow", "M", 2], 1, 1]}, r"grid\[0\]: unknown operator 'pow'"),
    ({"grid": [["add", "K", 2], 1, 1]}, r"grid\[0\]: uses \['K'\], which no tensor parameter"),
    ({"grid": [1.5, 1, 1]}, r"grid\[0\]: expected an int, a dim name or \[op, a, b\]"),
    ({"block": [True, 1, 1]}, r"block\[0\]: expected an int"),
    ({"cluster": [0, 1, 1]}, r"cluster: expected 3 ints >= 1"),
    ({"dynamic_smem_bytes": -1}, r"dynamic_smem_bytes: expected an int >= 0"),
    ({"params": {}}, r"params: expected a list"),
    ({"kernel_args": [{"kind": "tensor", "param": 9}]}, r"kernel_args\[0\]: param index 9 out"),
    ({"kernel_args": [{"kind": "scalar", "param": 0}]},
     r"kernel_args\[0\]: kind 'scalar' but params\[0\] \(A\) is a tensor"),
    ({"kernel_args": [{"kind": "dim", "name": "Q", "dtype": "int32"}]},
     r"kernel_args\[0\]: dim 'Q' is not a dim of any tensor parameter"),
    ({"kernel_args": [{"kind": "dim", "name": "M", "dtype": "float32"}]},
     r"kernel_args\[0\].dtype: expected int32 or int64"),
    ({"kernel_args": [{"kind": "pointer", "param": 0}]},
     r"kernel_args\[0\].kind: expected one of 'tensor', 'scalar', 'dim', 'tensor_map'"),
])
def test_validation_names_the_field(change, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(gemm_dict(**change))


@pytest.mark.parametrize("param, message", [
    ({"name": "A", "kind": "tensor", "dtype": "float16"}, r"params\[0\]: missing field 'shape'"),
    ({"name": "A", "kind": "vector", "dtype": "float16"}, r"params\[0\].kind: expected"),
    ({"name": "A", "kind": "tensor", "dtype": "float16", "shape": [-1]},
     r"params\[0\].shape\[0\]: expected an int >= 0 or a dim name"),
    ({"name": "A", "kind": "tensor", "dtype": "float16", "shape": ["1M"]},
     r"params\[0\].shape\[0\]: expected an identifier"),
    ({"name": "A", "kind": "tensor", "dtype": "float16", "shape": [4], "align": 3},
     r"params\[0\].align: expected a power of two"),
    ({"name": "a b", "kind": "scalar", "dtype": "float16"}, r"params\[0\].name: expected an id"),
    ({"name": "s", "kind": "scalar", "dtype": "float16", "shape": []},
     r"params\[0\]: unexpected field\(s\) \['shape'\] for a scalar"),
    ({"kind": "scalar", "dtype": "int32"}, r"params\[0\]: missing field 'name'"),
])
def test_param_validation(param, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(gemm_dict(params=[param], kernel_args=[], grid=[1, 1, 1]))


def test_duplicate_names_and_bad_json():
    p = {"name": "A", "kind": "scalar", "dtype": "int32"}
    with pytest.raises(ManifestError, match=r"params\[1\].name: duplicate parameter name 'A'"):
        Manifest.from_dict(gemm_dict(params=[p, p], kernel_args=[], grid=[1, 1, 1]))
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.from_json("{")
    with pytest.raises(ManifestError, match="missing field"):
        Manifest.from_dict({"manifest_version": 1})
    with pytest.raises(ManifestError, match="expected a JSON object"):
        Manifest.from_json("[]")
    assert issubclass(ManifestError, LaunchError)


@pytest.mark.parametrize("expr, value", [
    (7, 7), ("M", 1000), (["add", "M", 24], 1024), (["sub", 3, "M"], -997),
    (["mul", "M", "N"], 64000), (["floordiv", "M", 128], 7), (["floordiv", -1, 2], -1),
    (["floormod", "M", 128], 104), (["floormod", -1, 128], 127), (["ceildiv", "M", 128], 8),
    (["ceildiv", 1024, 128], 8), (["ceildiv", 0, 128], 0), (["min", "M", "N"], 64),
    (["max", "M", "N"], 1000), (["mul", ["ceildiv", "M", 128], ["ceildiv", "N", 64]], 8),
])
def test_eval_expr(expr, value):
    assert eval_expr(expr, {"M": 1000, "N": 64}) == value
    assert eval_expr(check_expr(expr, "x"), {"M": 1000, "N": 64}) == value  # tuple form


@pytest.mark.parametrize("expr, message", [
    (["pow", 2, 3], r"unknown operator 'pow'"),
    ("K", r"uses dim 'K', which no argument binds \(bound: M\)"),
    (["floordiv", "M", 0], "division by zero"),
    (["ceildiv", "M", ["sub", "M", "M"]], "division by zero"),
    (["add", 1], "malformed expression"),
    (1.0, "malformed expression"),
    (True, "malformed expression"),
])
def test_eval_expr_rejects(expr, message):
    with pytest.raises(LaunchError, match=message):
        eval_expr(expr, {"M": 5})


# --- tensor_map: a TMA descriptor of a 2-D tensor param --------------------------------------


def tma(param=0, box=(64, 128), swizzle=128, **extra) -> dict:
    return {"kind": "tensor_map", "param": param, "box": list(box), "swizzle": swizzle, **extra}


def test_tensor_map_round_trip():
    d = gemm_dict(kernel_args=[tma(0), tma(1, box=(8, 256), swizzle=0),
                               {"kind": "tensor", "param": 2}, tma(2, box=(32, 1), swizzle=128)])
    m = Manifest.from_dict(d)
    assert m.to_dict() == d
    assert Manifest.from_json(m.to_json()) == m
    assert pickle.loads(pickle.dumps(m)) == m
    assert m.kernel_args[0] == KernelArg("tensor_map", param=0, box=(64, 128), swizzle=128)
    assert m.kernel_args[0].to_dict() == tma(0)
    built = Manifest(**{**{k: v for k, v in d.items() if k != "manifest_version"},
                        "kernel_args": [KernelArg("tensor_map", param=0, box=[64, 128],
                                                  swizzle=128)]})
    assert built.kernel_args[0].box == (64, 128)  # normalized to a tuple: hashable
    hash(built)


@pytest.mark.parametrize("arg, message", [
    (tma(box=(0, 64)), r"kernel_args\[0\].box\[0\]: expected an int in 1..256 \(TMA box limit\)"),
    (tma(box=(64, 257)), r"kernel_args\[0\].box\[1\]: expected an int in 1..256 .*, got 257"),
    (tma(box=(64, True)), r"kernel_args\[0\].box\[1\]: expected an int in 1..256 .*, got True"),
    (tma(box=(64, 1, 1, 1, 1, 1)), r"kernel_args\[0\].box: expected \[inner, ..., outer\] \(1 to "
                                   r"5 ints, one per dim\)"),
    ({**tma(), "box": 64}, r"kernel_args\[0\].box: expected \[inner, ..., outer\]"),
    (tma(box=(64,)), r"kernel_args\[0\].box: params\[0\] \(A\) has shape \['M', 1024\] \(2-D\) "
                     r"but the box has 1 entries; a tensor_map needs one per dim"),
    (tma(swizzle=16), r"kernel_args\[0\].swizzle: expected one of 0, 32, 64, 128 \(bytes\), "
                      r"got 16"),
    (tma(swizzle="128B"), r"kernel_args\[0\].swizzle: expected one of"),
    (tma(param="A"), r"kernel_args\[0\].param: expected an int, got 'A'"),
    (tma(param=7), r"kernel_args\[0\]: param index 7 out of range \(0..3\)"),
    (tma(param=3), r"kernel_args\[0\].param: a tensor_map needs a tensor, but params\[3\] "
                   r"\(alpha\) is a scalar"),
    ({k: v for k, v in tma().items() if k != "swizzle"},
     r"kernel_args\[0\]: a tensor_map entry has exactly the fields kind, param, box, swizzle"),
    (tma(name="M"), r"kernel_args\[0\]: a tensor_map entry has exactly the fields"),
    # A is float16: 65 elements are 130 bytes, 128 elements 256 bytes
    (tma(box=(65, 64), swizzle=0), r"kernel_args\[0\].box\[0\]: 65 float16 elements are 130 "
                                   r"bytes; TMA needs the box's inner extent to be a multiple of "
                                   r"16 bytes \(a multiple of 8 elements\)"),
    (tma(box=(128, 64), swizzle=128), r"kernel_args\[0\].box\[0\]: 128 float16 elements are "
                                      r"256 bytes, more than the 128-byte swizzle span; use "
                                      r"box\[0\] <= 64 or a wider swizzle"),
    (tma(2, box=(16, 64), swizzle=32), r"box\[0\]: 16 float32 elements are 64 bytes, more than "
                                       r"the 32-byte swizzle span; use box\[0\] <= 8"),
])
def test_tensor_map_validation_names_the_field(arg, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(gemm_dict(kernel_args=[arg]))


def test_tensor_map_box_has_one_entry_per_dim():
    params = [{"name": "X", "kind": "tensor", "dtype": "float16", "shape": ["B", "M", 64]}]
    with pytest.raises(ManifestError, match=r"kernel_args\[0\].box: params\[0\] \(X\) has shape "
                                            r"\['B', 'M', 64\] \(3-D\) but the box has 2 entries"):
        Manifest.from_dict(gemm_dict(params=params, kernel_args=[tma(0)], grid=[1, 1, 1]))
    ok = {**tma(0), "box": [64, 128, 1]}
    m = Manifest.from_dict(gemm_dict(params=params, kernel_args=[ok], grid=[1, 1, 1]))
    assert m.kernel_args[0].box == (64, 128, 1)
    assert issubclass(ManifestError, LaunchError)


def test_persistent_grid_may_use_the_sm_count_only_in_the_grid():
    from tiled.runtime.launch import LaunchPlan
    from tiled.runtime.manifest import SM_COUNT_DIM

    blocks = ["mul", ["ceildiv", "N", 128], ["ceildiv", "M", 128]]
    m = Manifest.from_dict(gemm_dict(grid=[["min", blocks, SM_COUNT_DIM], 1, 1]))
    plan = LaunchPlan(m)
    assert plan.uses_sm_count and not LaunchPlan(Manifest.from_dict(gemm_dict())).uses_sm_count
    assert plan.geometry({"M": 4096, "N": 4096, SM_COUNT_DIM: 132})[0] == (132, 1, 1)
    assert plan.geometry({"M": 256, "N": 256, SM_COUNT_DIM: 132})[0] == (4, 1, 1)
    with pytest.raises(ManifestError, match="block"):
        Manifest.from_dict(gemm_dict(block=[SM_COUNT_DIM, 1, 1]))


def test_clustered_persistent_grid_is_whole_clusters():
    """The sm_90a path's grid with 2-CTA clusters (tiled.compiler.manifest): 2 * min(tile
    pairs, max(1, SMs // 2)), always a multiple of the cluster, which the launch checks."""
    from tiled.runtime.launch import LaunchPlan
    from tiled.runtime.manifest import SM_COUNT_DIM

    pairs = ["mul", ["ceildiv", "N", 256], ["ceildiv", ["ceildiv", "M", 128], 2]]
    grid = [["mul", 2, ["min", pairs, ["max", 1, ["floordiv", SM_COUNT_DIM, 2]]]], 1, 1]
    plan = LaunchPlan(Manifest.from_dict(gemm_dict(grid=grid, cluster=[2, 1, 1])))
    for m, n, sms, blocks in [(4096, 4096, 132, 132), (4096, 4096, 131, 130),
                              (384, 256, 132, 4), (100, 100, 132, 2), (4096, 4096, 1, 2),
                              (0, 4096, 132, 0)]:
        assert plan.geometry({"M": m, "N": n, SM_COUNT_DIM: sms})[0] == (blocks, 1, 1)
    odd = LaunchPlan(Manifest.from_dict(gemm_dict(grid=[["min", pairs, SM_COUNT_DIM], 1, 1],
                                                  cluster=[2, 1, 1])))
    with pytest.raises(LaunchError, match="not a multiple of the cluster size 2"):
        odd.geometry({"M": 128, "N": 256, SM_COUNT_DIM: 132})  # one pair: grid 1


FALLBACK = {"symbol": "gemm_fallback_kernel", "kernel_args": gemm_dict()["kernel_args"],
            "grid": [["ceildiv", "N", 64], "M", 1], "block": [64, 1, 1],
            "dynamic_smem_bytes": 0, "cluster": [1, 1, 1]}


def test_preconditions_and_fallback_round_trip():
    d = gemm_dict(requires=[["floormod", ["mul", 2, "N"], 16]], fallback=FALLBACK)
    m = Manifest.from_dict(d)
    assert m.to_dict() == d and Manifest.from_json(m.to_json()) == m
    assert m.requires == (("floormod", ("mul", 2, "N"), 16),)
    fb = m.fallback_manifest()
    assert (fb.symbol, fb.block, fb.requires, fb.fallback) == \
        ("gemm_fallback_kernel", (64, 1, 1), (), None)
    assert fb.params == m.params and fb.artifact_sha256 == m.artifact_sha256
    assert hash(m) == hash(Manifest.from_json(m.to_json()))


@pytest.mark.parametrize("change, message", [
    ({"requires": [["floormod", "Q", 16]]}, r"requires\[0\]: uses \['Q'\]"),
    ({"requires": [["mod", "M", 16]]}, r"requires\[0\]: unknown operator 'mod'"),
    ({"fallback": {"symbol": "x"}}, r"fallback: expected an object with the fields"),
    ({"fallback": {**FALLBACK, "dynamic_smem_bytes": -1}},
     r"manifest fallback\.dynamic_smem_bytes"),
    ({"fallback": {**FALLBACK, "grid": ["Z", 1, 1]}}, r"manifest fallback\.grid\[0\]"),
])
def test_bad_preconditions_and_fallbacks(change, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(gemm_dict(**change))
