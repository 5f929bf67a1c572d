"""Progress of a fine-tuning run: a tqdm bar on a terminal, a plain log line every K steps otherwise.

Shown per step: loss, learning rate, tokens/s, model TFLOPS and MFU. Throughput is over the steps since
the last report, and only over timed steps: the first ``warmup`` steps of the process (allocator, layout
measurement, kernel choice) are excluded, as in the run record. Model FLOPs per token are
``superoffload.harness.flops.model_flops_per_token`` (6N + causal attention, no recompute), so MFU here
and in the record agree. Only rank 0 reports.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, *, total: int, start: int, tokens_per_step: int, flops_per_token: float,
                 peak_flops: float, warmup: int, log_every: int = 10, enabled: bool = True,
                 stream: TextIO | None = None, bar: bool | None = None) -> None:
        self.total, self.start, self.warmup, self.log_every = total, start, warmup, max(1, log_every)
        self.tokens_per_step, self.flops_per_token, self.peak = tokens_per_step, flops_per_token, peak_flops
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.window_s = 0.0
        self.window_steps = 0
        self.bar = None
        use_bar = self.stream.isatty() if bar is None else bar
        if enabled and use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", file=self.stream, dynamic_ncols=True,
                            bar_format="{l_bar}{bar:20}{r_bar}")  # a short bar leaves room for the numbers

    def throughput(self) -> tuple[float, float, float] | None:
        """(tokens/s, model TFLOPS, MFU) of the current window, or None before the first timed step."""
        if self.window_steps == 0 or self.window_s <= 0:
            return None
        tps = self.tokens_per_step * self.window_steps / self.window_s
        flops = tps * self.flops_per_token
        return tps, flops / 1e12, flops / self.peak

    def update(self, step: int, loss: float | None, lr: float, step_s: float, skipped: bool = False) -> None:
        """After optimizer step ``step`` (1-based, of the whole run) took ``step_s`` seconds. ``loss`` None: no
        learned token; ``skipped``: the optimizer skipped the step (non-finite gradients)."""
        if not self.enabled:
            return
        if step - self.start > self.warmup:
            self.window_s += step_s
            self.window_steps += 1
        tp = self.throughput()
        text = "-" if loss is None else f"{loss:.4f}"
        if skipped:
            text += " (step skipped: non-finite gradients)"
        if self.bar is not None:
            post = {"loss": text}
            if tp is None:
                post["tok/s"] = "warm-up"
            else:
                post.update({"tok/s": f"{tp[0]:.0f}", "TFLOPS": f"{tp[1]:.3g}", "MFU": f"{100 * tp[2]:.1f}%"})
            post["lr"] = f"{lr:.2e}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)
            if step % self.log_every == 0:
                self._reset()
            return
        if step % self.log_every == 0 or step == self.total:
            perf = ("tokens/s -, TFLOPS -, MFU - (warm-up)" if tp is None
                    else f"tokens/s {tp[0]:.0f}, TFLOPS {tp[1]:.3g}, MFU {100 * tp[2]:.1f}%")
            print(f"step {step}/{self.total}: loss {text}, lr {lr:.3g}, {perf}", file=self.stream, flush=True)
            self._reset()

    def _reset(self) -> None:
        self.window_s, self.window_steps = 0.0, 0

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
