"""The static memory plan: every intermediate of a plan at an offset of one
arena, tensors whose lifetimes do not overlap sharing bytes.

Greedy by size, as onnxruntime's memory patterns and TFLite's arena planner
do: the largest tensor is placed first, each at the lowest aligned offset
where it overlaps no placed tensor that is live at the same time.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Lifetime:
    """A tensor of ``nbytes`` written at step ``first`` and last read at step
    ``last`` (inclusive: a tensor read by step i and one written by step i
    never share bytes)."""

    nbytes: int
    first: int
    last: int


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    offsets: list[int]   # per tensor, in the order given
    arena_bytes: int     # the arena's size
    total_bytes: int     # the sum of the tensors' aligned sizes: what no reuse would take


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def plan_memory(lifetimes: list[Lifetime], alignment: int = 64) -> MemoryPlan:
    """Offsets for ``lifetimes`` in one arena, each a multiple of ``alignment``."""
    sizes = [_aligned(t.nbytes, alignment) for t in lifetimes]
    order = sorted(range(len(lifetimes)), key=lambda i: (-sizes[i], lifetimes[i].first, i))
    offsets = [0] * len(lifetimes)
    placed: list[int] = []
    arena = 0
    for i in order:
        t = lifetimes[i]
        # The byte ranges of placed tensors live at the same time as this one, by offset.
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in placed
                      if lifetimes[j].first <= t.last and t.first <= lifetimes[j].last)
        offset = 0
        for start, end in busy:
            if offset + sizes[i] <= start:
                break
            offset = max(offset, end)
        offsets[i] = offset
        arena = max(arena, offset + sizes[i])
        placed.append(i)
    return MemoryPlan(offsets, arena, sum(sizes))
