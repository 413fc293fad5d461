"""The `tiled` command line, run as a real subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # as an installed tiled would be


def tiled_cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "tiled.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, check=check, env=ENV)


def test_compile_cpu_writes_artifact_and_manifest(tmp_path):
    out = tiled_cli("compile", "examples/elementwise.py:add", "--target", "cpu", "--out",
                    str(tmp_path))
    assert "vadd" in out.stdout
    manifest = json.loads((tmp_path / "vadd.manifest.json").read_text())
    assert manifest["backend"] == "cpu" and manifest["symbol"] == "__tvm_ffi_vadd"
    assert (tmp_path / "vadd.so").stat().st_size > 0


@pytest.mark.skipif(subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0,
                    reason="nvcc not installed")
def test_compile_cuda_sm90a(tmp_path):
    tiled_cli("compile", "examples/softmax.py:softmax", "--target", "cuda:sm_90a", "--out",
              str(tmp_path), "--source")
    manifest = json.loads((tmp_path / "row_softmax.manifest.json").read_text())
    assert manifest["arch"] == "sm_90a" and manifest["artifact_format"] == "cubin"
    assert (tmp_path / "row_softmax.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "row_softmax_kernel" in (tmp_path / "row_softmax.cu").read_text()


def test_compile_rocm_gfx942(tmp_path):
    tiled_cli("compile", "examples/softmax.py:softmax", "--target", "rocm:gfx942", "--out",
              str(tmp_path), "--source")
    manifest = json.loads((tmp_path / "row_softmax.manifest.json").read_text())
    assert manifest["arch"] == "gfx942" and manifest["artifact_format"] == "hsaco"
    assert manifest["code_object"]["wavefront_size"] == 64
    assert (tmp_path / "row_softmax.hsaco").read_bytes()[:4] == b"\x7fELF"
    assert "row_softmax_kernel" in (tmp_path / "row_softmax.hip").read_text()


def test_compile_metal(tmp_path):
    out = tiled_cli("compile", "examples/softmax.py:softmax", "--target", "metal", "--out",
                    str(tmp_path))
    manifest = json.loads((tmp_path / "row_softmax.manifest.json").read_text())
    assert manifest["target"] == "metal:apple7" and manifest["artifact_format"] == "msl"
    assert manifest["metal"]["language_version"] == "3.0"
    assert "kernel void row_softmax_kernel(" in (tmp_path / "row_softmax.metal").read_text()
    assert "row_softmax.metal" in out.stdout


def test_ir_prints_program_and_digest():
    out = tiled_cli("ir", "examples/softmax.py:softmax")
    assert "row_softmax" in out.stdout and "# digest" in out.stdout


def test_bad_target_is_a_clear_error(tmp_path):
    out = tiled_cli("compile", "examples/elementwise.py:add", "--target", "cuda:sm_75",
                    "--out", str(tmp_path), check=False)
    assert out.returncode == 2 and "sm_75 is not supported" in out.stderr


def test_examples_check_themselves_on_cpu():
    for script in ("elementwise.py", "softmax.py"):
        out = subprocess.run([sys.executable, f"examples/{script}"], cwd=ROOT,
                             capture_output=True, text=True, check=True, env=ENV)
        assert "ok" in out.stdout
