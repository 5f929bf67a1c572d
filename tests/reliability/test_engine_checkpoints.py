"""The DeepSpeed-named `engine.save_checkpoint` / `load_checkpoint`: written to a temporary tag, every rank
synchronized, renamed, `latest` after a barrier; verified against its manifest when loaded."""

from __future__ import annotations

import errno

import pytest

from superoffload.engine.files import CheckpointError
from tests.engine.multirank.launch import run_ranks
from tests.engine.test_misuse import batch
from tests.reliability.test_nonfinite import _engine


def _trained(steps: int = 2):
    engine = _engine()
    for i in range(steps):
        engine.backward(engine(*batch(i)))
        engine.step()
    return engine


def test_a_flipped_byte_or_a_truncated_file_is_refused_naming_it(tmp_path):
    engine = _trained()
    engine.save_checkpoint(str(tmp_path), tag="t")
    f = tmp_path / "t" / "rank0.pt"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"rank0\.pt: its sha256 differs from the manifest"):
        _engine().load_checkpoint(str(tmp_path))
    f.write_bytes(bytes(raw[:100]))
    with pytest.raises(CheckpointError, match=r"rank0\.pt has 100 bytes"):
        _engine().load_checkpoint(str(tmp_path))


def test_a_failed_save_keeps_the_previous_checkpoint_of_the_tag_and_leaves_no_temporary(tmp_path, monkeypatch):
    engine = _trained()
    engine.save_checkpoint(str(tmp_path), tag="t")
    before = (tmp_path / "t" / "rank0.pt").read_bytes()
    engine.backward(engine(*batch(5)))
    engine.step()
    from superoffload.engine import files

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "save_hashed", full)
    with pytest.raises(CheckpointError, match="checkpoint t not written .*: no space left on the device"):
        engine.save_checkpoint(str(tmp_path), tag="t")
    assert (tmp_path / "t" / "rank0.pt").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "t"]
    monkeypatch.undo()
    fresh = _engine()
    fresh.load_checkpoint(str(tmp_path))
    assert fresh.global_step == 2


def test_shards_of_two_steps_under_one_tag_are_refused_on_every_rank(tmp_path):
    res, _, _ = run_ranks(2, "mixed", tmp_path, args=("--ckpt", str(tmp_path / "ck"), "--split", "2", "--steps", "4"))
    for r in res:
        assert r["error"] is not None and "rank0.pt: its sha256 differs from the manifest" in r["error"], r["error"]
        assert r["late_step"] == 4 and r["left"] == ["latest", "t"]  # the re-saved tag: whole, no temporaries
