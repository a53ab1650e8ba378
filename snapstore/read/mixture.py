"""The order of a mixture: which source each position of an epoch reads, as a pure function.

Nothing here does I/O. An epoch of a mixture has ``M = sum(counts)`` positions ("units": a
sample, or a whole batch when batches are homogeneous); source ``i`` fills ``counts[i]`` of
them. Its ``j``-th unit has the ideal time ``(j + a_i / 1024) / counts[i]`` in ``[0, 1)``, with
a phase ``a_i`` keyed by (seed, epoch, i), and the epoch is all units sorted by time (ties by
source index). This is the smooth weighted round-robin of a low-discrepancy schedule: in any
``L`` consecutive positions source ``i`` holds ``L * w_i`` units give or take about
``1 + K * w_i`` for ``K`` sources, at every scale, never a coin flip per sample.

The sort is done frame by frame. Frame ``f`` of ``F`` covers the times ``[f / F, (f + 1) / F)``;
how many units of source ``i`` come before it is an exact integer formula (:func:`units_before`),
so seeking to any position costs O(K log F) integer operations and a frame (about 4,096 units)
is sorted when it is read. Memory stays O(frame), whatever the epoch's length.

Which samples a source's units are: source ``i`` reads a stream that runs through its samples
pass after pass (pass ``p`` a permutation keyed by ``p``); epoch ``e`` reads the stream's units
``[e * counts[i], (e + 1) * counts[i])``. A source asked for more than it holds is therefore
repeated with a fresh shuffle each pass, and one asked for fewer reads a different part of a
pass each epoch, covering all of it in ``ceil(size / count)`` epochs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from ..format.plan import derive_key

__all__ = ["MixSchedule", "apportion", "units_before"]

PHASES = 1024  # resolution of a source's keyed phase in its unit spacing
FRAME_UNITS = 4096  # about this many units are sorted at once
MIX_DOMAIN = int.from_bytes(b"snap:mix", "big")

IntArray = npt.NDArray[np.int64]


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainders; ties go
    to the lower index), summing exactly to ``total``.

    Examples
    --------
    >>> apportion(10, [0.5, 0.25, 0.25])
    [5, 3, 2]
    """
    total = operator.index(total)
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def units_before(count: int, phase: int, frame: int, frames: int) -> int:
    """How many of a source's ``count`` units have a time below ``frame / frames``.

    Unit ``j``'s time is ``(j + phase / PHASES) / count``: it is below when
    ``(j * PHASES + phase) * frames < frame * count * PHASES``.
    """
    num = frame * count * PHASES - phase * frames
    if num <= 0:
        return 0
    return min(count, -(-num // (PHASES * frames)))


class MixSchedule:
    """The sources of one epoch's positions, for one epoch of a mixture.

    Parameters
    ----------
    counts : sequence of int
        Units of each source in the epoch (at least one source with a unit).
    seed, epoch : int
        Key the sources' phases.

    Examples
    --------
    >>> s = MixSchedule([3, 1], seed=0, epoch=0)
    >>> sorted(s.sources(0, 4).tolist())
    [0, 0, 0, 1]
    """

    def __init__(self, counts: Sequence[int], *, seed: int, epoch: int) -> None:
        self.counts = [operator.index(c) for c in counts]
        if not self.counts or min(self.counts) < 0 or sum(self.counts) == 0:
            raise ValueError(f"MixSchedule: expected counts >= 0, not all 0, found {counts}")
        self.total = sum(self.counts)
        self.frames = max(1, -(-self.total // FRAME_UNITS))
        self.phases = [
            derive_key(seed, epoch, i, MIX_DOMAIN) % PHASES for i in range(len(self.counts))
        ]

    def before_frame(self, frame: int) -> list[int]:
        """Units of each source before frame ``frame`` (``0 <= frame <= frames``)."""
        return [
            units_before(c, a, frame, self.frames)
            for c, a in zip(self.counts, self.phases, strict=True)
        ]

    def _frame_start(self, frame: int) -> int:
        return sum(self.before_frame(frame))

    def _find_frame(self, position: int) -> int:
        """The frame holding ``position`` (the last frame starting at or before it)."""
        lo, hi = 0, self.frames
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._frame_start(mid) <= position:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def frame(self, frame: int) -> tuple[IntArray, IntArray]:
        """The sources of frame ``frame``'s positions and each one's unit number in its source."""
        first, last = self.before_frame(frame), self.before_frame(frame + 1)
        sources, units, times = [], [], []
        for i, (lo, hi) in enumerate(zip(first, last, strict=True)):
            j = np.arange(lo, hi, dtype=np.int64)
            sources.append(np.full(j.size, i, np.int64))
            units.append(j)
            times.append((j + self.phases[i] / PHASES) / self.counts[i])
        source, unit = np.concatenate(sources), np.concatenate(units)
        order = np.lexsort((source, np.concatenate(times)))
        return source[order], unit[order]

    def segments(self, begin: int, end: int) -> Iterator[tuple[IntArray, IntArray]]:
        """Sources and units of positions ``[begin, end)``, frame by frame."""
        if not 0 <= begin <= end <= self.total:
            raise ValueError(f"MixSchedule: expected 0 <= {begin} <= {end} <= {self.total}")
        frame = self._find_frame(begin) if begin < end else self.frames
        start = self._frame_start(frame)
        while begin < end:
            source, unit = self.frame(frame)
            stop = start + len(source)
            lo, hi = begin - start, min(end, stop) - start
            if hi > lo:
                yield source[lo:hi], unit[lo:hi]
            begin, start, frame = max(begin, min(end, stop)), stop, frame + 1

    def sources(self, begin: int, end: int) -> IntArray:
        """The source of each position in ``[begin, end)``."""
        parts = [s for s, _ in self.segments(begin, end)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def units_before(self, position: int) -> list[int]:
        """Units of each source among the positions before ``position``."""
        if position >= self.total:
            return list(self.counts)
        frame = self._find_frame(position)
        counts = self.before_frame(frame)
        source, _ = self.frame(frame)
        head = source[: position - self._frame_start(frame)]
        return [c + int(n) for c, n in zip(counts, np.bincount(head, minlength=len(counts)))]
