"""Run `superoffload finetune` and SIGKILL it at one point of its checkpointing, as a power cut or the OOM
killer would (the fault tests' injector; it patches the run in this process only).

    python tests/reliability/inject.py POINT STEP -- <finetune arguments>

POINT: engine-half (half of the engine file written), before-manifest, before-rename, before-latest,
prune (one file of the pruned checkpoint deleted), before-final, before-record. STEP: the checkpoint's
step at which to kill (ignored for before-final / before-record).
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from superoffload.engine import files  # noqa: E402
from superoffload.finetune import checkpoint as ckpt  # noqa: E402
from superoffload.harness import record  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> int:
    i = sys.argv.index("--")
    point, step = sys.argv[1], int(sys.argv[2])
    argv = sys.argv[i + 1:]
    current = {"step": None}
    save_checkpoint = ckpt.save_checkpoint

    def at_step(out, s, *a, **kw):
        current["step"] = s
        return save_checkpoint(out, s, *a, **kw)

    ckpt.save_checkpoint = at_step
    here = lambda: current["step"] == step  # noqa: E731

    if point == "engine-half":
        save_hashed = files.save_hashed

        def half(obj, path):
            if here() and path.name.startswith("engine"):
                buf = io.BytesIO()
                torch.save(obj, buf)
                with open(path, "wb") as f:
                    f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                die()
            return save_hashed(obj, path)

        files.save_hashed = half
    elif point == "before-manifest":
        write_manifest = files.write_manifest
        files.write_manifest = lambda *a, **k: die() if here() else write_manifest(*a, **k)
    elif point == "before-rename":
        replace_dir = ckpt._replace_dir
        ckpt._replace_dir = lambda *a, **k: die() if here() else replace_dir(*a, **k)
    elif point == "before-latest":
        write_json = ckpt.write_json_atomic
        ckpt.write_json_atomic = lambda p, o: die() if here() else write_json(p, o)
    elif point == "prune":
        rmtree = ckpt.shutil.rmtree

        def prune(path, *a, **k):
            path = Path(path)
            if here() and path.name.startswith("step-"):
                next(path.iterdir()).unlink()
                die()
            return rmtree(path, *a, **k)

        ckpt.shutil.rmtree = prune
    elif point == "before-final":
        ckpt.save_final = lambda *a, **k: die()
    elif point == "before-record":
        record.write_record = lambda *a, **k: die()
    else:
        raise SystemExit(f"unknown point {point!r}")
    from superoffload.cli.main import main as cli

    return cli(["finetune", *argv])


if __name__ == "__main__":
    sys.exit(main())
