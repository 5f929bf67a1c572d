"""`superoffload.initialize`: one name, two call shapes, each with one return type.

- the engine's own: `initialize(model, config=None, param_groups=None, process_group=None)` (the model
  passed positionally) returns the engine, whatever else is passed (`model_parameters=` is accepted as
  DeepSpeed's name for param_groups);
- DeepSpeed's: `initialize(args=..., model=..., optimizer=..., training_data=..., config=...)`, as
  `deepspeed.initialize` is called (its first positional parameter is `args`, so the model comes as a
  keyword, or second), returns DeepSpeed's tuple `(engine, optimizer, training_dataloader, lr_scheduler)`
  (superoffload/integrations/deepspeed.py). `superoffload.deepspeed.initialize` is that form by name.
"""

from __future__ import annotations

from typing import Any


def _is_module(x: Any) -> bool:
    import torch.nn as nn

    return isinstance(x, nn.Module)


def initialize(*args: Any, **kwargs: Any) -> Any:
    deepspeed_shape = "model" in kwargs or "args" in kwargs or (bool(args) and not _is_module(args[0]))
    if deepspeed_shape:
        from superoffload.integrations.deepspeed import initialize as deepspeed_initialize

        return deepspeed_initialize(*args, **kwargs)
    from superoffload.engine import initialize as engine_initialize

    return engine_initialize(*args, **kwargs)
