"""DeepSpeed's module-level names, for scripts that `import superoffload.deepspeed as deepspeed` (or
`import superoffload as deepspeed`, which has them too): `initialize` in DeepSpeed's call shape,
`init_distributed`, `add_config_arguments` and `comm` (superoffload/integrations/deepspeed.py)."""

from superoffload import comm
from superoffload.integrations.deepspeed import add_config_arguments, init_distributed, initialize

__all__ = ["add_config_arguments", "comm", "init_distributed", "initialize"]
