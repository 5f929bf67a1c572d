"""SuperOffload: exact, overlapped optimizer offload for Superchips.

    engine = superoffload.initialize(model, {"optimizer": {"lr": 1e-3}, "precision": "bf16"})
    loss = engine(x, y); engine.backward(loss); engine.step()

    opt = superoffload.AdamW(model.parameters(), lr=1e-3, model=model)     # a plain torch loop
    loss.backward(); opt.step(); opt.zero_grad()

DeepSpeed scripts: `import superoffload as deepspeed` (initialize in DeepSpeed's call shape,
init_distributed, add_config_arguments, comm).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy: `import superoffload` (e.g. for the CLI) does not pull in the engine
    if name == "initialize":
        from superoffload.entry import initialize

        return initialize
    if name in ("SuperOffloadConfig", "SuperOffloadEngine", "ConfigError", "HostWorkerError", "NonFiniteError"):
        from superoffload import engine

        return getattr(engine, name)
    if name in ("init_distributed", "add_config_arguments"):
        from superoffload.integrations import deepspeed

        return getattr(deepspeed, name)
    if name in ("comm", "deepspeed"):
        import importlib

        return importlib.import_module(f"superoffload.{name}")
    if name == "AdamW":
        from superoffload.optim import AdamW

        return AdamW
    raise AttributeError(name)
