"""The one exception type for bad input to `superoffload finetune`.

Raised before any training step for a missing model or data path, a dataset without the expected
fields, a `--max-length` beyond the model's positions, a non-positive step count and the like. The CLI
prints its message as one line on stderr and exits with status 2 (the convention of every
`superoffload` sub-command)."""

from __future__ import annotations


class FinetuneInputError(ValueError):
    """Bad input, detected before training: the message says what is wrong and what to change."""
