"""rec_sdk.base.atomic_dir, the one way checkpoints and serving updates publish: a directory
appears whole or not at all, what was there is moved aside first, and only the temporaries
of writers that are gone are deleted."""

import os
import subprocess
import sys

from rec_sdk.base import atomic_dir


def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_publish_dir_replaces_the_target_whole(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old").write_text("old")
    staged = tmp_path / "ckpt.tmp"
    staged.mkdir()
    (staged / "new").write_text("new")
    atomic_dir.publish_dir(str(staged), str(final), aside=str(tmp_path / "ckpt.old"))
    assert sorted(os.listdir(final)) == ["new"]
    assert sorted(os.listdir(tmp_path / "ckpt.old")) == ["old"]
    assert not staged.exists()


def test_publish_dir_without_aside_refuses_an_existing_target(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "MANIFEST").write_text("published")
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "x").write_text("x")
    try:
        atomic_dir.publish_dir(str(tmp_path / "staged"), str(tmp_path / "v1"))
    except OSError:
        pass  # rename onto a non-empty directory fails
    assert (tmp_path / "v1" / "MANIFEST").read_text() == "published"


def test_replace_file_leaves_no_temporary(tmp_path):
    path = tmp_path / "BASE"
    path.write_bytes(b"one")
    atomic_dir.replace_file(str(path), b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["BASE"]


def test_only_temporaries_of_gone_writers_are_removed(tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    for name in ("t-%d" % dead, "t-%d" % alive, "t-%d" % os.getpid(), "keep"):
        (tmp_path / name).mkdir()

    def writer_of(entry):
        return int(entry[2:]) if entry.startswith("t-") else None

    atomic_dir.remove_dead_writers(str(tmp_path), writer_of)
    assert sorted(os.listdir(tmp_path)) == sorted(["t-%d" % alive, "t-%d" % os.getpid(), "keep"])
    assert not atomic_dir.pid_alive(dead) and atomic_dir.pid_alive(os.getpid())
    atomic_dir.remove_dead_writers(str(tmp_path / "missing"), writer_of)  # no such directory
