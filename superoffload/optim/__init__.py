"""Torch optimizers over the SuperOffload engine (`superoffload.AdamW`)."""

from superoffload.optim.adamw import AdamW

__all__ = ["AdamW"]
