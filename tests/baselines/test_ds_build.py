"""DeepSpeed's JIT builds: the line before a build, and a dead build's lock (no build is run here)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from superoffload import ds_build


@pytest.fixture
def ext_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


def _lock(ext_dir, name="cpu_adam", age_s=0.0):
    d = ext_dir / name
    d.mkdir(parents=True, exist_ok=True)
    lock = d / "lock"
    lock.touch()
    if age_s:
        t = time.time() - age_s
        os.utime(lock, (t, t))
    return lock


def test_build_directory_follows_torch_extensions_dir(ext_dir):
    assert ds_build.build_directory("cpu_adam") == ext_dir / "cpu_adam"


def test_announces_a_build_when_nothing_is_cached(ext_dir):
    said = []
    assert ds_build.prepare_op("cpu_adam", say=said.append) is True
    assert len(said) == 1 and "building DeepSpeed's CPU op cpu_adam" in said[0] and "~1-2 min" in said[0]


def test_quiet_when_the_op_is_cached(ext_dir):
    (ext_dir / "cpu_adam").mkdir()
    (ext_dir / "cpu_adam" / "cpu_adam.so").write_bytes(b"")
    said = []
    assert ds_build.prepare_op("cpu_adam", say=said.append) is False
    assert said == []


def test_stale_lock_without_owner_is_removed_with_one_warning(ext_dir):
    lock = _lock(ext_dir, age_s=3600)
    said = []
    assert ds_build.clear_stale_lock(lock.parent, stale_s=300, poll_s=0.01, say=said.append) == "removed"
    assert not lock.exists()
    assert len(said) == 1 and said[0].startswith("warning: removed the stale build lock") and str(lock) in said[0]


def test_young_lock_without_owner_is_removed_once_old_enough(ext_dir):
    lock = _lock(ext_dir)
    said = []
    t0 = time.monotonic()
    assert ds_build.clear_stale_lock(lock.parent, stale_s=0.3, poll_s=0.05, say=said.append) == "removed"
    assert time.monotonic() - t0 >= 0.25 and not lock.exists()
    assert len(said) == 2 and "Delete it to go on now" in said[0] and str(lock) in said[0]


def _needs_proc(ext_dir) -> None:
    if ds_build.lock_holders(ext_dir / "x") is None:
        pytest.skip("no /proc: holders cannot be seen")


def test_a_live_build_is_waited_for_with_a_line_now_and_then(ext_dir):
    """A lock held open (torch's FileBaton while it builds) is left alone, however old, and waited for with a
    heartbeat line, until the builder removes it."""
    _needs_proc(ext_dir)
    lock = _lock(ext_dir, age_s=3600)
    fd = os.open(lock, os.O_RDONLY)
    assert ds_build.lock_holders(lock) == [os.getpid()]

    def finish() -> None:  # what the builder does at the end: close, then remove
        os.close(fd)
        lock.unlink()

    threading.Timer(0.35, finish).start()
    said = []
    t0 = time.monotonic()
    assert ds_build.clear_stale_lock(lock.parent, stale_s=0, poll_s=0.01, say=said.append, heartbeat_s=0.1) == "free"
    assert time.monotonic() - t0 >= 0.3
    assert f"waiting for process {os.getpid()}, which is building cpu_adam" in said[0]
    assert len(said) >= 2 and all(m.startswith(f"still waiting for process {os.getpid()}") for m in said[1:])
    assert not any("removed" in m for m in said)


def test_a_build_that_dies_while_waited_for_leaves_a_lock_that_is_removed(ext_dir):
    _needs_proc(ext_dir)
    lock = _lock(ext_dir, age_s=3600)
    fd = os.open(lock, os.O_RDONLY)
    threading.Timer(0.2, os.close, (fd,)).start()  # the builder killed: the file stays, nobody holds it
    said = []
    assert ds_build.clear_stale_lock(lock.parent, stale_s=300, poll_s=0.01, say=said.append) == "removed"
    assert not lock.exists() and said[0].startswith("waiting for process")
    assert said[-1].startswith("warning: removed the stale build lock")


def test_a_lock_released_while_waiting_is_free(ext_dir):
    lock = _lock(ext_dir)
    threading.Timer(0.1, lock.unlink).start()
    assert ds_build.clear_stale_lock(lock.parent, stale_s=60, poll_s=0.02, say=lambda m: None) == "free"


def test_prepare_op_clears_the_lock_then_announces(ext_dir):
    lock = _lock(ext_dir, age_s=3600)
    said = []
    assert ds_build.prepare_op("cpu_adam", stale_s=300, say=said.append) is True
    assert not lock.exists() and len(said) == 2 and "building" in said[1]


def test_stale_after_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(ds_build.STALE_ENV, "12.5")
    assert ds_build.stale_after_s() == 12.5
    monkeypatch.setenv(ds_build.STALE_ENV, "soon")
    with pytest.raises(ValueError, match=ds_build.STALE_ENV):
        ds_build.stale_after_s()


def test_deepspeed_ops_of_this_accelerator(ext_dir, needs_deepspeed):
    """With nothing cached, the ops this DeepSpeed builds just in time are announced (and nothing is built)."""
    from deepspeed.git_version_info import installed_ops

    said = []
    building = ds_build.prepare_deepspeed_ops(say=said.append)
    assert ("cpu_adam" in building) != bool(installed_ops.get("cpu_adam")) and len(said) == len(building)
    assert not list(ext_dir.rglob("*.so"))  # announced, not built


def test_the_ninja_beside_this_python_comes_first_on_path(tmp_path, monkeypatch):
    """Two ninjas hash command lines differently: every process must find the same one, whatever its PATH."""
    venv_bin, system_bin = tmp_path / "venv-bin", tmp_path / "usr-bin"
    for d in (venv_bin, system_bin):
        d.mkdir()
        (d / "ninja").write_text("#!/bin/sh\n")
        (d / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(system_bin), str(venv_bin), "/bin"]))
    assert ds_build.pin_ninja(venv_bin) == str(venv_bin / "ninja")
    assert os.environ["PATH"].split(os.pathsep) == [str(venv_bin), str(system_bin), "/bin"]
    assert ds_build.pin_ninja(venv_bin) == str(venv_bin / "ninja")  # once is enough: no duplicate entries
    assert os.environ["PATH"].split(os.pathsep) == [str(venv_bin), str(system_bin), "/bin"]
    # a Python with no ninja beside it leaves PATH as it was
    assert ds_build.pin_ninja(tmp_path) == str(venv_bin / "ninja")
    assert os.environ["PATH"].split(os.pathsep) == [str(venv_bin), str(system_bin), "/bin"]


def test_outside_a_virtual_environment_path_is_left_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path), "/bin"]))
    ds_build.pin_ninja()
    assert os.environ["PATH"] == os.pathsep.join([str(tmp_path), "/bin"])


def test_the_default_op_cache_is_per_environment(monkeypatch):
    """Inside a venv its own folder (a build records the venv's paths); outside one, the user's cache."""
    monkeypatch.setattr(sys, "prefix", "/work/clone-a/.venv")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    assert ds_build.default_extensions_dir() == Path("/work/clone-a/.venv/torch_extensions")
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    assert ds_build.default_extensions_dir() == Path.home() / ".cache" / "superoffload" / "torch_extensions"


def test_the_module_imports_no_torch():
    """The workflow's Snakefile reads the default folder; snakemake must not pay for importing torch."""
    import subprocess

    code = "import sys, superoffload.ds_build; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_preparing_the_ops_sets_the_per_environment_cache_when_unset(monkeypatch, needs_deepspeed):
    monkeypatch.delenv(ds_build.EXTENSIONS_ENV, raising=False)
    ds_build.prepare_deepspeed_ops((), say=lambda m: None)
    assert os.environ[ds_build.EXTENSIONS_ENV] == str(ds_build.default_extensions_dir())
    monkeypatch.setenv(ds_build.EXTENSIONS_ENV, "/elsewhere")
    ds_build.prepare_deepspeed_ops((), say=lambda m: None)
    assert os.environ[ds_build.EXTENSIONS_ENV] == "/elsewhere"  # a user's choice stands


def test_preloaded_ops_are_loaded_in_this_process(ext_dir, monkeypatch, needs_deepspeed):
    """`load=`: the op is built (or waited for) and loaded before the caller goes on, for DeepSpeed's
    SuperOffload, whose CPU optimizer worker gives up after 60 s; ops not named are only announced."""
    from deepspeed.accelerator import get_accelerator

    loaded = []
    acc = get_accelerator()
    real = acc.create_op_builder

    def create(cls):
        builder = real(cls)
        if builder is not None:
            monkeypatch.setattr(builder, "load", lambda *a, **k: loaded.append(cls))
        return builder

    monkeypatch.setattr(acc, "create_op_builder", create)
    ds_build.prepare_deepspeed_ops(say=lambda m: None, load=("CPUAdamBuilder",))
    from deepspeed.git_version_info import installed_ops

    assert loaded == ([] if installed_ops.get("cpu_adam") else ["CPUAdamBuilder"])


def test_ds_superoffload_preloads_cpu_adam():
    from baselines._deepspeed import DeepSpeedSystem
    from baselines.ds_superoffload import DSSuperOffloadSystem

    assert DSSuperOffloadSystem.DS_PRELOAD == ("CPUAdamBuilder",) and DeepSpeedSystem.DS_PRELOAD == ()
