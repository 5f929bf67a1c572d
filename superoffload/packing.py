"""The bucket packer: which parameter tensors travel and step together, and each rank's shard.

One torch-free implementation, used by the engine (`engine/layout.py`, on the model's real tensors in
measured gradient-arrival order) and by the planner (on the tensor list a `ModelShape` describes), so
the planner's buckets, "device tail buckets" and memory are the engine's, exactly.

The rule: take tensors in arrival order and start a new bucket when the next tensor would overflow
`bucket_size` elements. A tensor larger than `bucket_size` is split (`pack_pieces`): it starts a bucket,
fills whole buckets of `split_numel(bucket_size, world)` elements (a multiple of the shard unit, so those
buckets need no padding and the tensor's elements stay contiguous across them), and its last piece opens
the bucket the next tensors join. So no bucket, and no staging slot or upload slot sized by one, grows
with the largest tensor (an embedding, an LM head, a 1M-row position table). Each bucket holds *pieces*
(`Piece`: a contiguous element range of one tensor); a tensor that fits is one piece. Refinements
(`plan_buckets`):
- a segment's tensors (weight flow: a flowed block's) are packed on their own, so a bucket is either
  resident on the device or flowed, never both;
- inside a bucket, pieces are ordered by param group, so a bucket's elements form at most one
  contiguous run per group (the host kernel takes one set of hyper-parameters per call), except that
  the continuation of a split tensor stays first (it must start where the previous bucket ends);
- sharding: a bucket's flat buffer is padded to a multiple of `world * SHARD_ALIGN` elements and split
  into `world` contiguous shards; rank r owns elements [r * shard, (r + 1) * shard).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SHARD_ALIGN = 16  # elements: a shard starts on a 64-byte boundary in fp32 (the kernel's vector width)


class Packable(Protocol):
    """What the packer needs of a tensor (the engine's ParamSlot; the planner's ShapeTensor): its size,
    its param group, and a list the packer fills with the tensor's pieces, in element order."""

    numel: int
    group: int
    pieces: list[Any]


@dataclass(eq=False)
class Piece:
    """Elements [start, start + numel) of `tensor`, at element `offset` of bucket `bucket`."""

    tensor: Any
    start: int
    numel: int
    bucket: int = -1
    offset: int = 0

    @property
    def group(self) -> int:
        return self.tensor.group

    @property
    def whole(self) -> bool:
        return self.numel == self.tensor.numel

    @property
    def last(self) -> bool:
        """The tensor's last piece (in the highest-numbered bucket, which launches last)."""
        return self.start + self.numel == self.tensor.numel

    def overlap(self, lo: int, hi: int) -> tuple[int, int, int] | None:
        """Where this piece meets the bucket range [lo, hi): (first, end) bucket elements and the tensor
        element at `first`; None when they do not meet."""
        a, b = max(self.offset, lo), min(self.offset + self.numel, hi)
        return (a, b, self.start + a - self.offset) if a < b else None


def split_numel(bucket_size: int, world: int = 1) -> int:
    """Elements per bucket of a split tensor: `bucket_size` rounded down to the shard unit (at least
    one unit), so a bucket full of one tensor's piece is exactly its padded size."""
    unit = world * SHARD_ALIGN
    return max(unit, bucket_size // unit * unit)


def pack_pieces(numels: Sequence[int], bucket_size: int, world: int = 1,
                split: bool = True) -> list[list[tuple[int, int, int]]]:
    """Each bucket's (position in `numels`, start, count) pieces, in order. Tensors of at most
    `bucket_size` elements are whole pieces; a larger one is split as the module doc says, or with
    `split` off (how DeepSpeed's and FSDP's buckets work, for the planner's models of them) gets a
    bucket of its own."""
    if bucket_size < 1:
        raise ValueError(f"bucket_size must be a positive number of elements, got {bucket_size}")
    full = split_numel(bucket_size, world)
    buckets: list[list[tuple[int, int, int]]] = [[]]
    size = 0
    for pos, n in enumerate(numels):
        if n > bucket_size and split:
            if buckets[-1]:
                buckets.append([])
            start = 0
            while n - start > full:
                buckets[-1].append((pos, start, full))
                buckets.append([])
                start += full
            buckets[-1].append((pos, start, n - start))
            size = n - start
            continue
        if buckets[-1] and size + n > bucket_size:
            buckets.append([])
            size = 0
        buckets[-1].append((pos, 0, n))
        size += n
    return [b for b in buckets if b]


def tail_start(n_buckets: int, device_tail_buckets: int) -> int:
    """Index of the first device tail bucket: the last `device_tail_buckets` buckets by arrival."""
    return max(0, n_buckets - max(0, device_tail_buckets))


@dataclass
class ShapeTensor:
    """A parameter tensor described by a shape (the planner's side of the packer)."""

    name: str
    numel: int
    group: int = 0
    unit: str = ""
    pieces: list[Piece] = field(default_factory=list)


@dataclass
class BucketLayout:
    index: int
    slots: list[Any] = field(default_factory=list)  # its pieces (`Piece`), in element order
    numel: int = 0  # elements of the parameters
    padded: int = 0  # elements of the flat buffer (a multiple of world * SHARD_ALIGN)
    on_device: bool = False  # a repartitioned tail bucket: grads + Adam state stay on the device
    flow_block: Any = None  # the flowed block whose weights these are, else None

    def shard(self, rank: int, world: int) -> tuple[int, int]:
        n = self.padded // world
        return rank * n, (rank + 1) * n


def padded_numel(numel: int, world: int) -> int:
    unit = world * SHARD_ALIGN
    return max(unit, math.ceil(numel / unit) * unit)


def layout_bucket(index: int, members: list[Piece], world: int, flow_block: Any = None) -> BucketLayout:
    """One bucket of `members`, ordered by param group (stable: arrival order within a group), except a
    split tensor's continuation, which stays first: it must start where the previous bucket ends."""
    members = sorted(members, key=lambda pc: (pc.start == 0, pc.group))
    lay = BucketLayout(index=index, flow_block=flow_block)
    for pc in members:
        pc.bucket, pc.offset = index, lay.numel
        lay.slots.append(pc)
        lay.numel += pc.numel
    lay.padded = padded_numel(lay.numel, world)
    return lay


def pack_layouts(tensors: Sequence[Packable], bucket_size: int, world: int, flow_block: Any = None,
                 piece: Callable[..., Piece] = Piece) -> list[BucketLayout]:
    """`tensors` (in arrival order) packed into laid-out buckets, numbered from 0; `piece` makes each
    piece (the engine's carries its parameter's names)."""
    return [layout_bucket(i, [piece(tensors[pos], start, n) for pos, start, n in b], world, flow_block)
            for i, b in enumerate(pack_pieces([t.numel for t in tensors], bucket_size, world))]


def chains(layouts: Sequence[BucketLayout]) -> list[list[BucketLayout]]:
    """`layouts` (in bucket order) grouped into runs that split tensors join: a bucket whose first piece
    continues the last piece of the bucket before it is in that bucket's chain. The buckets of a chain
    share one allocation of weights (and of a flowed block's host store), so a split tensor is one
    contiguous view across them."""
    out: list[list[BucketLayout]] = []
    for lay in layouts:
        head = lay.slots[0]
        if head.start > 0 and out and out[-1][-1].slots[-1].tensor is head.tensor:
            prev = out[-1][-1]
            if prev.numel != prev.padded:  # pack_pieces cuts a split tensor at whole shard units
                raise AssertionError(f"bucket {prev.index} ends inside a split tensor but is padded")
            out[-1].append(lay)
        else:
            out.append([lay])
    return out


def index_pieces(tensors: Sequence[Packable], layouts: Sequence[BucketLayout]) -> None:
    """Each tensor's `pieces`, in element order, from the layouts that hold them."""
    for t in tensors:
        t.pieces = []
    for lay in layouts:
        for pc in lay.slots:
            pc.tensor.pieces.append(pc)
    for t in tensors:
        t.pieces.sort(key=lambda pc: pc.start)


def plan_buckets(slots: Sequence[Packable], order: list[int], bucket_size: int, device_tail_buckets: int,
                 world: int = 1, segment: Callable[[Any], Hashable] | None = None,
                 fixed: dict[Hashable, list[BucketLayout]] | None = None,
                 piece: Callable[..., Piece] = Piece) -> list[BucketLayout]:
    """Pack `slots` (taken in `order`, a permutation of slot indices) into buckets, numbered in order,
    and index each slot's `pieces`.

    `segment(slot)` (weight flow: the flowed block, or None) keeps a segment's tensors in buckets of
    their own; a segment stands in the order where its last tensor arrives (when it completes).
    `fixed[segment]`: buckets already laid out for that segment (weight flow lays out its blocks at
    initialize, before the arrival order is known); they are renumbered, not repacked. The last
    `device_tail_buckets` buckets by arrival are marked `on_device`.
    """
    if sorted(order) != list(range(len(slots))):
        raise ValueError("order must be a permutation of the parameter indices")
    seg = segment or (lambda s: None)
    fixed = fixed or {}
    last = {seg(slots[i]): pos for pos, i in enumerate(order) if seg(slots[i]) is not None}
    units: list[tuple[Hashable, list[int]]] = []  # (segment or None, slot indices), in arrival order
    for pos, i in enumerate(order):
        sg = seg(slots[i])
        if sg is None:
            if units and units[-1][0] is None:
                units[-1][1].append(i)
            else:
                units.append((None, [i]))
        elif last[sg] == pos:
            units.append((sg, [j for j in order if seg(slots[j]) == sg]))
    buckets: list[BucketLayout] = []
    for sg, members in units:
        if sg is not None and sg in fixed:
            for lay in fixed[sg]:
                lay.index = len(buckets)
                for pc in lay.slots:
                    pc.bucket = lay.index
                buckets.append(lay)
            continue
        for lay in pack_layouts([slots[i] for i in members], bucket_size, world, sg, piece):
            lay.index = len(buckets)
            for pc in lay.slots:
                pc.bucket = lay.index
            buckets.append(lay)
    index_pieces(slots, buckets)
    for lay in buckets:
        lay.on_device = False
    for lay in buckets[tail_start(len(buckets), device_tail_buckets):]:
        lay.on_device = True
    return buckets
