"""The daemon image (Dockerfile) built here, as an operator would run it: deploy/image/build.sh
makes the Debian base with debootstrap and builds with `buildah bud --isolation chroot`; then
`tiled serve` runs inside the built image (as its non-root user, socket and cache on host
directories) and a client outside compiles through the socket: a CPU kernel that then runs
here, and a cuda:sm_90a kernel compiled by NVRTC inside the image.

Needs root, buildah and debootstrap (scripts/test.sh installs them); without them the test
fails, as CI must build the image. Took 7 minutes here (the build 3-5 of them; debootstrap
another 1 on a first run)."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.daemon_util import ROOT, DaemonLog, free_port
from tiled.client.client import compile_request
from tiled.runtime import load
from tiled.runtime.cpu_levels import host_level
from tiled.v1 import compile_pb2_grpc

sys.path.insert(0, str(ROOT / "examples"))
import elementwise

TAG = "localhost/tiled:ci"
UID = 10001  # the image's user (Dockerfile)
STORE = ROOT / "build" / "image" / "store"  # kept between runs: the base image is reused


def buildah(*args: str, check: bool = True, timeout: float = 120) -> str:
    cmd = ["buildah", "--storage-driver", "vfs", "--root", str(STORE / "root"), "--runroot",
           str(STORE / "run"), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "TMPDIR": str(STORE / "tmp")})  # as build.sh's
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout.strip()


@pytest.fixture(scope="module")
def image():
    missing = [t for t in ("buildah", "debootstrap") if shutil.which(t) is None]
    assert not missing, (f"{', '.join(missing)} missing: apt-get install buildah debootstrap "
                         "(scripts/test.sh does)")
    assert os.geteuid() == 0, "building the image with buildah and debootstrap needs root"
    t0 = time.monotonic()
    r = subprocess.run([str(ROOT / "deploy" / "image" / "build.sh"), TAG], cwd=ROOT,
                       env={**os.environ, "TILED_IMAGE_STORE": str(STORE)},
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"image build failed:\n{r.stdout}\n{r.stderr[-6000:]}"
    print(f"\n{r.stdout.strip()} (whole build {time.monotonic() - t0:.0f} s)")
    yield json.loads(buildah("inspect", "--type", "image", TAG))
    buildah("rmi", "--force", TAG, check=False)  # the base image stays for the next run


@contextlib.contextmanager
def daemon_in(image_name: str, *serve_args: str):
    """`tiled serve` inside a working container of the image, its /run/tiled and
    /var/cache/tiled bind-mounted from host directories owned by the image's user."""
    ctr = working_container(image_name)
    run_dir, cache_dir = (Path(tempfile.mkdtemp(prefix=f"tiled-image-{n}-")) for n in
                          ("run", "cache"))
    for d in (run_dir, cache_dir):
        os.chown(d, UID, UID)
        d.chmod(0o755)
    port = free_port()
    home = home_files(Path(buildah("mount", ctr)))
    cmd = ["buildah", "--storage-driver", "vfs", "--root", str(STORE / "root"), "--runroot",
           str(STORE / "run"), "run", "--isolation", "chroot", "-v", f"{run_dir}:/run/tiled",
           "-v", f"{cache_dir}:/var/cache/tiled", ctr, "--", "tiled", "serve",
           "--metrics-port", str(port), "--metrics-addr", "0.0.0.0", *serve_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = DaemonLog(proc.stdout)
    sock = run_dir / "tiled.sock"
    channel = grpc.insecure_channel(f"unix://{sock}")
    d = {"proc": proc, "log": log, "sock": sock, "ctr": ctr, "metrics": port, "home": home,
         "stub": compile_pb2_grpc.CompilerStub(channel), "cache": cache_dir}
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=120)
        except grpc.FutureTimeoutError:
            raise AssertionError(f"the daemon in the image did not start:\n{log.text()}") \
                from None
        yield d
    finally:
        channel.close()
        serve_pid = _serve_pid(proc.pid)
        if serve_pid is not None:
            os.kill(serve_pid, signal.SIGTERM)  # the daemon itself: a clean shutdown
        try:
            d["exit"] = proc.wait(60 if serve_pid is not None else 0)
        except subprocess.TimeoutExpired:  # a daemon would outlive buildah: end it first
            if serve_pid is not None:
                os.kill(serve_pid, signal.SIGKILL)
            proc.kill()
            d["exit"] = proc.wait(60)
        buildah("rm", ctr, check=False)
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(cache_dir, ignore_errors=True)


def home_files(root: Path) -> dict[str, int]:
    """{path: mtime_ns} of everything under the image user's home in a mounted rootfs."""
    home = root / "var" / "lib" / "tiled"
    return {str(p.relative_to(home)): p.lstat().st_mtime_ns for p in home.rglob("*")}


def working_container(image_name: str) -> str:
    """A working container of the image whose -v binds are what it sees: buildah run mounts
    the image's VOLUMEs over binds of the same paths (in an order that varies), so they are
    dropped from this container's config."""
    ctr = buildah("from", "--pull=never", "-q", image_name)
    buildah("config", "--volume", "/run/tiled-", "--volume", "/var/cache/tiled-", ctr)
    return ctr


def _serve_pid(root: int) -> int | None:
    """The `tiled serve` Python process under `root` (buildah run -> chroot runtime -> chroot
    exec -> python): chroot isolation shares the host's PID namespace, so it is visible here.
    Parents are read from every /proc/PID/stat (buildah, a Go program, forks from any of its
    threads, so one task's `children` list misses them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo = [root]
    while todo:
        pid = todo.pop(0)
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"python3") and b"serve" in argv:
            return pid
        todo += children.get(pid, [])
    return None


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found is None:  # the dev extra's nvidia-cuda-cuobjdump wheel
        import nvidia

        found = next(str(p) for root in nvidia.__path__ for p in Path(root).glob(
            "*/bin/cuobjdump"))
    return found


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


@pytest.mark.timeout(1800)  # the build (in the fixture): 3-8 minutes on 2 busy cores
def test_image_config(image):
    config = image["Docker"]["config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["tiled", "serve"]
    assert set(config["Volumes"]) == {"/run/tiled", "/var/cache/tiled"}
    assert config["Healthcheck"]["Test"][:4] == ["CMD", "tiled", "status", "--probe"]
    assert config["Labels"]["org.opencontainers.image.title"] == "tiled"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["TILED_SOCKET"] == "/run/tiled/tiled.sock"
    # the CA bundle pip may need was a secret mount of the build stage, which the image
    # does not contain
    history = json.dumps(image["Docker"]["history"])
    assert "pip_ca" not in history and "PIP_CERT" not in history


@pytest.mark.timeout(900)
def test_daemon_in_the_image_compiles_for_a_client_outside(image):
    with daemon_in(TAG, "--workers", "2") as d:
        kernel = elementwise.add(block=256, threads=128)
        t0 = time.monotonic()
        cpu = d["stub"].Compile(compile_request(kernel, "cpu"), timeout=300)
        print(f"cpu compile in the image: {time.monotonic() - t0:.1f} s")
        assert not cpu.cache_hit and cpu.resolved_target == f"cpu:{host_level().name}"
        vadd = load(cpu.artifact, cpu.manifest_json)  # linked in the image, run here
        a, b = np.random.rand(1000).astype(np.float32), np.random.rand(1000).astype(np.float32)
        c = np.zeros_like(a)
        vadd(a, b, c)
        np.testing.assert_allclose(c, a + b, rtol=1e-6)
        assert d["stub"].Compile(compile_request(kernel, "cpu"), timeout=60).cache_hit

        t0 = time.monotonic()
        cuda = d["stub"].Compile(compile_request(kernel, "cuda:sm_90a"), timeout=300)
        print(f"cuda:sm_90a compile in the image (NVRTC): {time.monotonic() - t0:.1f} s")
        manifest = json.loads(cuda.manifest_json)
        assert manifest["target"] == "cuda:sm_90a" and manifest["artifact_format"] == "cubin"
        cubin = d["cache"].parent / f"{d['cache'].name}.cubin"
        cubin.write_bytes(cuda.artifact)
        try:
            header = subprocess.run([_cuobjdump(), "-elf", str(cubin)], capture_output=True,
                                    text=True, timeout=60).stdout.splitlines()[:3]
        finally:
            cubin.unlink()
        assert any("ET_EXEC" in line and "sm=90a" in line for line in header), header

        # A serving pod: another container of the image, its uid, the socket directory
        # mounted read-only; the image's HEALTHCHECK command, then tiled's own client.
        pod = working_container(TAG)
        try:
            mounts = ["-v", f"{d['sock'].parent}:/run/tiled:ro",
                      "-v", f"{Path(__file__).parent}:/probe:ro"]
            probe = buildah("run", "--isolation", "chroot", *mounts, pod, "--",
                            *image["Docker"]["config"]["Healthcheck"]["Test"][1:])
            assert probe.endswith(": SERVING"), probe
            out = buildah("run", "--isolation", "chroot", *mounts, "--env",
                          "TILED_SERVER=unix:///run/tiled/tiled.sock", pod, "--", "python3",
                          "/probe/serving_client.py", timeout=300)
            assert json.loads(out.splitlines()[-1]) == {"ok": True, "cache_hit": False,
                                                        "health": "SERVING"}, out
        finally:
            buildah("rm", pod, check=False)
        # Nothing was written outside /tmp and the volumes (the DaemonSet runs the image with
        # a read-only root and an empty home): the home the image made is unchanged.
        root = Path(buildah("mount", d["ctr"]))
        assert home_files(root) == d["home"]
        text = metrics_text(d["metrics"])  # served on 0.0.0.0 inside: reachable from here
        assert 'result="compiled"' in text and 'result="hit"' in text
        assert list((d["cache"]).iterdir()), "the cache volume stayed empty"
        assert all(p.stat().st_uid == UID for p in d["cache"].iterdir())
    assert d["exit"] == 0, d["log"].text()
    assert "stopped in" in d["log"].text()
    assert not d["sock"].exists()
