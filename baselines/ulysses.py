"""DeepSpeed-Ulysses on ZeRO-3 without offload: the paper's sequence-length baseline (Fig 12).

What the artifact's `ulysses` mode runs (github.com/Supercomputing-System-AI-Lab/SuperOffload,
experiment/sequence_length/ulysses.json and {four,eight}_chip.sh): Megatron-DeepSpeed with
``--ds-sequence-parallel-size`` = the chip count and a DeepSpeed config of ZeRO stage 3 with
``overlap_comm: false`` and nothing offloaded. Here, under the common harness:

- **ZeRO-3, no offload**: no ``offload_optimizer``, no ``offload_param``; ``overlap_comm`` false (artifact);
  every other knob at DeepSpeed's documented default, written out (stage3_* as in zero_infinity's
  ``offload_param`` variant); the optimizer is the config's AdamW, on the device.
- **Sequence parallelism**: DeepSpeed's own SP groups (``deepspeed.runtime.sequence_parallel.parallel_state_sp``,
  passed to ``deepspeed.initialize`` as ``mpu``): ``sp`` consecutive ranks per group, ZeRO-3 partitioned and
  gradients reduced over every rank (DeepSpeed folds the SP groups into its data-parallel group).
- **Attention**: ``deepspeed.sequence.layer.DistributedAttention`` (DeepSpeed-Ulysses' all-to-alls) around
  the model's causal SDPA, on our GPT models (``-o attention=deepspeed``, the default); transformers models
  (GQA) and ``-o attention=superoffload`` use superoffload.sequence's Ulysses attention instead (equal
  output: tested). Positions (each rank's global offset) and the token-normalized loss come from
  ``superoffload.sequence.enable_sequence_parallel``; ``--loss-tile`` tiles it (the artifact keeps
  Megatron's plain loss, the default here).
- **Loss scaling**: ZeRO-3's reduce-scatter path (``reduce_scatter: true``, the default) divides the summed
  gradients by the number of ranks, so each rank's loss is its token-loss sum over (global tokens / ranks):
  the mean over its own chunk when no target is ignored. A step reports the global mean loss (the ranks'
  losses summed, divided by the ranks).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from baselines._deepspeed import COMMON_OPTIONS, DeepSpeedSystem
from baselines.zero_infinity import STAGE3_DEFAULTS
from superoffload.harness import sequence as seqh
from superoffload.harness.system import RunConfig
from superoffload.harness.systems.superoffload_system import offload_stats
from superoffload.shapes import ModelShape

ATTENTIONS = ("deepspeed", "superoffload")


def _attention(key: str, value: Any) -> str:
    if value not in ATTENTIONS:
        raise ValueError(f"option {key!r} must be one of {', '.join(ATTENTIONS)}, got {value!r}")
    return str(value)


def _local_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The local attention DistributedAttention wraps: [b, S, heads/sp, d] in and out, causal over the
    gathered sequence (the model's own SDPA)."""
    from superoffload.sequence import causal_sdpa

    return causal_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


class DeepSpeedUlyssesAttention:
    """``CausalSelfAttention.attention_fn`` running DeepSpeed's DistributedAttention (scatter heads, gather
    the sequence; batch first). A plain callable, so ZeRO-3 sees no extra submodule."""

    def __init__(self, group: Any) -> None:
        from deepspeed.sequence.layer import DistributedAttention

        self.attention = DistributedAttention(_local_causal, group, scatter_idx=2, gather_idx=1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attention(q, k, v, batch_dim_idx=0)


class UlyssesSystem(DeepSpeedSystem):
    name: ClassVar[str] = "ulysses"
    OPTIONS: ClassVar[dict[str, Any]] = {**COMMON_OPTIONS, "attention": _attention}
    # Adam on the device: DeepSpeed's FusedAdam (JIT-built on the CPU accelerator, ~40 s the first time)
    DS_OPS: ClassVar[tuple[str, ...]] = ("FusedAdamBuilder", "ShareMemCommBuilder")

    def zero_config(self, run: RunConfig, options: dict[str, Any], pin: bool) -> dict[str, Any]:
        return {
            "stage": 3,
            "overlap_comm": False,  # artifact ulysses.json
            "contiguous_gradients": True,
            "reduce_scatter": True,  # the loss scaling below assumes this path (module doc)
            "reduce_bucket_size": int(5e8),
            "allgather_bucket_size": int(5e8),
            "round_robin_gradients": False,
            "sub_group_size": int(1e9),
            **STAGE3_DEFAULTS,
        }

    def batch_world(self, world: int) -> int:
        return world // self.run.sp  # DeepSpeed's config counts data-parallel groups under an SP mpu

    def prepare(self, model: torch.nn.Module, shape: ModelShape, run: RunConfig) -> dict[str, Any]:
        import torch.distributed as dist

        self.world = dist.get_world_size()
        self.offloader = getattr(model, "activation_offloader", None)
        self.seq = None
        self.mpu = None
        self.attention_impl = "local"
        extra: dict[str, Any] = {}
        if not seqh.uses_sequence_package(run):
            return extra  # plain ZeRO-3 data parallelism with the model's own loss
        if run.sp > 1:
            from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu

            mpu._release_sequence_parallel_groups()  # a previous engine in this process
            mpu.initialize_sequence_parallel(run.sp)
            group = mpu.get_sequence_parallel_group()
            self.mpu = mpu
            extra["mpu"] = mpu
        else:
            group, _ = seqh.sp_groups(1)
        from superoffload.sequence import enable_sequence_parallel

        # ZeRO-3 divides the summed gradients by the world size: normalize by global tokens / world
        self.seq = enable_sequence_parallel(model, group, loss_tile=run.loss_tile,
                                            global_tokens=seqh.tokens_per_micro_batch(run) // self.world)
        attention = self.validate(run).get("attention", "deepspeed")
        if run.sp > 1:
            self.attention_impl = "superoffload.sequence.UlyssesAttention"
            if attention == "deepspeed" and shape.family == "gpt":
                ds_attention = DeepSpeedUlyssesAttention(group)
                for blk in model.blocks:
                    blk.attn.attention_fn = ds_attention
                self.attention_impl = "deepspeed.sequence.layer.DistributedAttention"
        return extra

    def micro_batch(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.seq is None:
            return x, y
        return self.seq.shard(x), self.seq.shard(y)

    def reported_loss(self, total: torch.Tensor) -> torch.Tensor:
        if self.seq is None:
            return total
        return seqh.global_loss(total, divide=self.world)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["sequence"] = {
            "sp": self.run.sp, "attention": self.attention_impl,
            "loss": "TokenNormalizedLoss" if self.seq is not None else "model default",
            "loss_tile": self.run.loss_tile,
            "loss_divisor_tokens": self.seq.loss.global_tokens if self.seq is not None else None,
            "mpu": "deepspeed.runtime.sequence_parallel.parallel_state_sp" if self.mpu is not None else None,
            "offloaded_checkpoints": offload_stats(self.offloader),
        }
        return out

    def teardown(self) -> None:
        super().teardown()
        if getattr(self, "mpu", None) is not None:
            from deepspeed.utils import groups

            self.mpu._release_sequence_parallel_groups()
            if groups.mpu is self.mpu:
                groups.mpu = None
