"""Dynamic loss scale for fp16 (GradScaler semantics), kept in plain Python floats so it is exact and
checkpointable: back off on any non-finite gradient, grow after `growth_interval` clean steps."""

from __future__ import annotations

from superoffload.engine.config import LossScaleConfig


class DynamicLossScale:
    def __init__(self, cfg: LossScaleConfig, enabled: bool) -> None:
        self.cfg, self.enabled = cfg, enabled
        self.scale = float(cfg.init_scale) if enabled else 1.0
        self.good_steps = 0

    def update(self, found_nonfinite: bool) -> None:
        if not self.enabled:
            return
        if found_nonfinite:
            self.scale = max(self.scale * self.cfg.backoff_factor, self.cfg.min_scale)
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps >= self.cfg.growth_interval:
                self.scale *= self.cfg.growth_factor
                self.good_steps = 0

    def state_dict(self) -> dict[str, float | int]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, d: dict[str, float | int]) -> None:
        self.scale, self.good_steps = float(d["scale"]), int(d["good_steps"])
