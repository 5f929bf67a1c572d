"""The bucket packer: which parameter tensors travel and step together.

One torch-free implementation, used by the engine (`engine/layout.py`, on the model's real tensors in
measured gradient-arrival order) and by the planner (`planner/buckets.py`, on the tensor list a
`ModelShape` describes), so the planner's "device tail buckets" are the engine's buckets, exactly.

The rule: take tensors in arrival order and start a new bucket when the next tensor would overflow
`bucket_size` elements. A tensor never straddles buckets, so one larger than `bucket_size` gets a
bucket of its own.
"""

from __future__ import annotations

from collections.abc import Sequence


def pack_whole_tensors(numels: Sequence[int], bucket_size: int) -> list[list[int]]:
    """Positions (indices into `numels`) of each bucket, in order; every position appears once."""
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be a positive number of elements, got {bucket_size}")
    buckets: list[list[int]] = [[]]
    size = 0
    for pos, n in enumerate(numels):
        if buckets[-1] and size + n > bucket_size:
            buckets.append([])
            size = 0
        buckets[-1].append(pos)
        size += n
    return [b for b in buckets if b]


def tail_start(n_buckets: int, device_tail_buckets: int) -> int:
    """Index of the first device tail bucket: the last `device_tail_buckets` buckets by arrival."""
    return max(0, n_buckets - max(0, device_tail_buckets))
