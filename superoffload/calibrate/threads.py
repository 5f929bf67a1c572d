"""The compute threads a measurement runs at: torch's intra-op pool and GraceAdam's pool."""

from __future__ import annotations


def set_threads(threads: int) -> None:
    """Measure at ``threads`` compute threads (the rates of a 2-core machine at 2 threads are not those of
    its runs at 1). GraceAdam's pool is set too when the kernel is installed."""
    import torch

    if threads < 1:
        raise ValueError(f"--threads must be >= 1, not {threads}")
    torch.set_num_threads(threads)
    try:
        import grace_adam
    except ImportError:
        return
    grace_adam.set_num_threads(threads)
