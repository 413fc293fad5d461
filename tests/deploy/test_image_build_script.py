"""deploy/image/build.sh's checks before it builds (no buildah needed): where its temporary
files go, and a clear error when the disk lacks the room a build takes."""

import os
import subprocess

from tests.daemon_util import ROOT

BUILD = ROOT / "deploy" / "image" / "build.sh"


def run(tmp_path, **env):
    return subprocess.run([str(BUILD), "localhost/tiled:never"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "TILED_IMAGE_STORE": str(tmp_path / "store"),
                               **env})


def test_too_little_room_names_the_directory_and_what_it_needs(tmp_path):
    r = run(tmp_path, TILED_IMAGE_MIN_FREE_MB=str(1 << 40))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{tmp_path / 'store'} has " in r.stderr and "MiB free" in r.stderr, r.stderr
    assert f"needs about {1 << 40} MiB" in r.stderr, r.stderr
    # buildah's temporary files go beside the store (a commit writes each layer there first),
    # not to /var/tmp
    assert (tmp_path / "store" / "tmp").is_dir()


def test_an_explicit_temporary_directory_is_used_instead(tmp_path):
    r = run(tmp_path, TILED_IMAGE_MIN_FREE_MB=str(1 << 40),
            TILED_IMAGE_TMPDIR=str(tmp_path / "elsewhere"))
    assert r.returncode == 1
    assert (tmp_path / "elsewhere").is_dir() and not (tmp_path / "store" / "tmp").exists()
