"""The `ulysses` baseline (DeepSpeed-Ulysses on ZeRO-3, no offload): `bench run --nproc 2 --sp 2` writes a
valid record and trains exactly what one rank trains on the same global batch (DeepSpeed's
DistributedAttention on gloo, DeepSpeed's SP groups as `mpu`, ZeRO-3 over both ranks). The first run
JIT-builds DeepSpeed's CPU FusedAdam op (~40 s on 2 cores, then cached in TORCH_EXTENSIONS_DIR)."""

from __future__ import annotations

from pathlib import Path

import pytest

from baselines.ulysses import UlyssesSystem
from superoffload.harness.system import RunConfig
from tests.harness.test_sequence_run import BATCH, SEQ, check_same_losses, check_sp_record, sp_pair

pytestmark = pytest.mark.usefixtures("needs_deepspeed")


def test_ulysses_sp2_matches_one_rank(tmp_path: Path) -> None:
    one, two = sp_pair("ulysses", tmp_path)
    check_sp_record(two)
    check_same_losses(one, two)
    stats = two["system_stats"]
    assert stats["sequence"]["attention"] == "deepspeed.sequence.layer.DistributedAttention"
    assert stats["sequence"]["mpu"] == "deepspeed.runtime.sequence_parallel.parallel_state_sp"
    assert stats["sequence"]["loss_divisor_tokens"] == BATCH * SEQ // 2  # ZeRO-3 divides by the 2 ranks
    zero = stats["deepspeed_config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] is False
    assert "offload_optimizer" not in zero and "offload_param" not in zero
    assert stats["deepspeed_config"]["train_batch_size"] == BATCH  # one data-parallel group
    # clipping saw the same global norm as on one rank
    assert one["system_stats"]["grad_norms"] == pytest.approx(stats["grad_norms"], rel=1e-5)


@pytest.mark.slow
def test_ulysses_with_our_attention_tiled_loss_and_offloaded_checkpoints(tmp_path: Path) -> None:
    one, two = sp_pair("ulysses", tmp_path, "-o", "attention=superoffload", "--loss-tile", "24",
                       "--offload-checkpoints")
    check_sp_record(two)
    check_same_losses(one, two)
    seq = two["system_stats"]["sequence"]
    assert seq["attention"] == "superoffload.sequence.UlyssesAttention" and seq["loss_tile"] == 24
    assert seq["offloaded_checkpoints"]["offloaded"] > 0


def test_ulysses_options_are_checked() -> None:
    assert UlyssesSystem.validate(RunConfig(system="ulysses", system_options={"attention": "deepspeed"})) == {
        "attention": "deepspeed"}
    with pytest.raises(ValueError, match="attention"):
        UlyssesSystem.validate(RunConfig(system="ulysses", system_options={"attention": "flash"}))
    with pytest.raises(ValueError, match="no option 'offload_param'"):
        UlyssesSystem.validate(RunConfig(system="ulysses", system_options={"offload_param": True}))
