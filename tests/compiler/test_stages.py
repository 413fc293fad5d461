"""Compile stage timing (tiled.compiler.stages): exclusive nested times, and every backend's
compile reporting the stages the daemon exports."""

import sys
import time

import pytest

import tiled
from tests.daemon_util import ROOT
from tiled.compiler.stages import STAGES, recording, timed

sys.path.insert(0, str(ROOT / "examples"))
import elementwise


def test_nested_stages_are_exclusive_and_add_up():
    t0 = time.perf_counter()
    with recording() as got:
        with timed("lower"):
            time.sleep(0.02)
            with timed("codegen"):
                time.sleep(0.05)
        with timed("toolchain"):
            time.sleep(0.01)
        with timed("toolchain"):  # a stage entered twice adds up
            time.sleep(0.01)
    wall = time.perf_counter() - t0
    assert set(got) == {"lower", "codegen", "toolchain"}
    assert 0.02 <= got["lower"] < 0.05  # the nested codegen is not counted again
    assert got["codegen"] >= 0.05 and got["toolchain"] >= 0.02
    assert sum(got.values()) <= wall


def test_outside_recording_nothing_is_kept_and_unknown_stages_raise():
    with timed("lower"):
        pass
    with recording() as got:
        pass
    assert got == {}
    with pytest.raises(ValueError, match="linking"):
        with timed("linking"):
            pass


def test_recordings_nest_without_mixing():
    with recording() as outer:
        with timed("lower"):
            with recording() as inner:
                with timed("codegen"):
                    pass
    assert set(inner) == {"codegen"} and set(outer) == {"lower"}


def test_cpu_compile_reports_lower_codegen_toolchain():
    kernel = tiled.compile(elementwise.add(block=64), target="cpu", cache=False)
    assert {"verify", "lower", "codegen", "toolchain"} <= set(kernel.stages) <= set(STAGES)
    assert all(v >= 0 for v in kernel.stages.values())


def test_cuda_compile_reports_lower_codegen_toolchain():
    kernel = tiled.compile(elementwise.add(block=256, threads=128), target="cuda:sm_90a",
                           cache=False)
    assert {"verify", "lower", "codegen", "toolchain"} <= set(kernel.stages) <= set(STAGES)
