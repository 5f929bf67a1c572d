"""SuperOffload: exact, overlapped optimizer offload for Superchips.

    engine = superoffload.initialize(model, {"optimizer": {"lr": 1e-3}, "precision": "bf16"})
    loss = engine(x, y); engine.backward(loss); engine.step()
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # lazy: `import superoffload` (e.g. for the CLI) does not pull in the engine
    if name in ("initialize", "SuperOffloadConfig", "SuperOffloadEngine", "ConfigError", "HostWorkerError"):
        from superoffload import engine

        return getattr(engine, name)
    raise AttributeError(name)
