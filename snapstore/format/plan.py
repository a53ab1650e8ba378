"""The epoch plan: which samples each rank reads, in which order, as a pure function.

Nothing here does I/O or keeps per-sample state. The order of an epoch is a function of
``(block_rows, seed, epoch, shuffle, window_blocks)`` built from keyed permutations (a balanced
Feistel network with cycle-walking), so any position of it is computed from a few integers and
resuming mid-epoch costs O(number of blocks) time, never O(number of samples). A plan keeps
O(number of windows) integers at most: a window's blocks are permuted when it is read.

The global order ``G`` of an epoch (length ``N``, the total number of rows):

1. Blocks are permuted with ``permute(arange(B), B, derive_key(seed, epoch, BLOCK_DOMAIN))``
   (identity without shuffle).
2. The permuted block sequence is cut into windows of consecutive blocks (the last one may be
   shorter): ``window_blocks`` each in order version 1; in order version 2 (the default of the
   readers) the first windows ramp up, ``RAMP_FIRST_BLOCKS`` blocks and then
   ``RAMP_GROWTH`` times the one before, for as long as that is below ``window_blocks``, and
   ``window_blocks`` each after them (see :func:`window_layout`); the ramp starts again at
   the block holding each consumer's first position (``c * per``, below), so that every
   consumer's first batch waits for a few blocks. Window ``w`` lists its
   blocks' global indices in permuted block order (``S_w`` of them) and emits them in the order
   ``window_permutation(S_w, derive_key(seed, epoch, w, WINDOW_DOMAIN))``: positions sorted by a
   keyed 64-bit hash. A window is bounded by the settings, so this O(S_w) array is allowed, and
   one sort costs far less than a Feistel network's fixed per-call work on small domains.

Consumers (a rank's DataLoader workers, composed with the ranks: consumer
``rank * num_workers + worker`` of ``world_size * num_workers``) then read contiguous slices of
``G`` (see :class:`EpochPlan`), so each touches about ``1 / consumers`` of the blocks. In order
version 1 ``G`` does not depend on the number of consumers; in version 2 it does (through the
ramps' starts). What is elastic: each consumer's samples depend only on the total number of
consumers, so 2 ranks of 2 workers read exactly what 4 ranks of 1 worker read. What is not: a
consumer's slice changes with the total, so a mid-epoch
resume state is valid only for the same total (a new total starts at an epoch boundary).
The order is how a snapshot is read, not what it holds: no fingerprint or stored byte depends
on it. Changing any of this changes the epoch order and requires a new order version
(:data:`ORDER_VERSIONS`), with the former order kept for readers that ask for it.
"""

from __future__ import annotations

import bisect
import copy
import operator
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "ORDER_VERSION",
    "ORDER_VERSIONS",
    "EpochPlan",
    "PlanOptions",
    "derive_key",
    "permute",
    "shuffle_quality",
    "unpermute_one",
    "window_layout",
    "window_permutation",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_ROUNDS = 6  # Luby-Rackoff needs >= 4 for a strong PRP; 6 leaves margin at half the cost of 12
_BATCH = 1 << 16  # elements per pass: keeps the Feistel work buffers in L2 (measured ~2x faster)
_FEISTEL_DOMAIN = int.from_bytes(b"snap:fst", "big")
_KEY_DOMAIN = int.from_bytes(b"snap:key", "big")
BLOCK_DOMAIN = int.from_bytes(b"snap:blk", "big")
WINDOW_DOMAIN = int.from_bytes(b"snap:win", "big")
# Order versions: 1, windows of window_blocks from the start of the epoch; 2, the first windows
# ramp up (RAMP_FIRST_BLOCKS, then RAMP_GROWTH times more each) so that the first batch of a
# pass waits for a few blocks, not most of a window (issue 28). A reader reads the latest unless
# asked (or resumed from a state of another); these constants are part of version 2's order.
# 16 blocks: the first batch of bench_format's tok then comes from 16 blocks, not 107, and
# consecutive samples of the first ten batches share a block 6% of the time (0.7% in version 1);
# a 2-block start made that 24% and brought the first batch no sooner on a 50 ms store.
ORDER_VERSION = 2
ORDER_VERSIONS = (1, 2)
RAMP_FIRST_BLOCKS = 16
RAMP_GROWTH = 2

IntArray = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]


def _mix64(z: int) -> int:
    """The splitmix64 finalizer on a Python int (mod 2**64)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def derive_key(*parts: int) -> int:
    """Mix integers into one 64-bit key, deterministically in every process.

    Each part is absorbed as a header word (limb count and sign) followed by its 64-bit limbs, so
    the encoding is unambiguous for integers of any size and sign (``(1, 2)`` and ``(12,)`` or
    ``(0,)`` and ``(0, 0)`` give different keys). Python's ``hash()`` is never used.

    Parameters
    ----------
    *parts : int
        The integers to mix, for example a seed, an epoch, a window number and a domain constant.

    Returns
    -------
    int
        A key in ``[0, 2**64)``.

    Raises
    ------
    TypeError
        If a part is not an integer.

    Examples
    --------
    >>> derive_key(0, 1) == derive_key(0, 1) != derive_key(1, 0)
    True
    """
    h = _KEY_DOMAIN
    for part in parts:
        value = operator.index(part)
        magnitude = abs(value)
        limbs = [(magnitude >> s) & _MASK64 for s in range(0, max(magnitude.bit_length(), 1), 64)]
        for word in [(len(limbs) << 1) | (value < 0), *limbs]:
            h = _mix64((h ^ word) + _GOLDEN)
    return _mix64(h ^ len(parts))


def _feistel(x: _U64, half_bits: int, round_keys: list[np.uint64]) -> _U64:
    """Encrypt every element of ``x`` (all ``< 2**(2 * half_bits)``) with the Feistel network."""
    out = np.empty_like(x)
    mask, shift = np.uint64((1 << half_bits) - 1), np.uint64(half_bits)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    m1, m2 = np.uint64(_MIX1), np.uint64(_MIX2)
    size = min(_BATCH, x.size)
    bufs = [np.empty(size, np.uint64) for _ in range(4)]
    for begin in range(0, x.size, _BATCH):
        src, dst = x[begin : begin + _BATCH], out[begin : begin + _BATCH]
        m = src.size
        left, right, f, tmp = (b[:m] for b in bufs)
        np.right_shift(src, shift, out=left)
        np.bitwise_and(src, mask, out=right)
        for rk in round_keys:
            # f = splitmix64(right + round_key) & mask, computed in place (wraps mod 2**64).
            np.add(right, rk, out=f)
            np.right_shift(f, s30, out=tmp)
            f ^= tmp
            f *= m1
            np.right_shift(f, s27, out=tmp)
            f ^= tmp
            f *= m2
            np.right_shift(f, s31, out=tmp)
            f ^= tmp
            f &= mask
            f ^= left
            left, right, f = right, f, left
        np.left_shift(left, shift, out=dst)
        dst |= right
    return out


def _feistel_keys(n: int, key: int) -> tuple[int, list[int]]:
    """Half width in bits and round keys of the network :func:`permute` uses for ``n >= 2``."""
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    k64 = operator.index(key) & _MASK64
    return half_bits, [_mix64(k64 ^ _mix64(_FEISTEL_DOMAIN + r)) for r in range(_ROUNDS)]


def unpermute_one(value: int, n: int, key: int) -> int:
    """The position ``i`` with ``permute([i], n, key)[0] == value``: the network run backwards
    (each round undone, last round first), cycle-walking until inside ``[0, n)``.

    An epoch plan uses it to find where one block lands in the block order without computing
    the order (O(1) memory, a few microseconds).

    Raises
    ------
    ValueError
        If ``value`` is outside ``[0, n)``.

    Examples
    --------
    >>> unpermute_one(int(permute([7], 100, key=3)[0]), 100, key=3)
    7
    """
    value, n = operator.index(value), operator.index(n)
    if not 0 <= value < n:
        raise ValueError(f"unpermute_one: expected 0 <= value < {n}, found {value}")
    if n <= 1:
        return 0
    half_bits, round_keys = _feistel_keys(n, key)
    mask = (1 << half_bits) - 1
    while True:
        left, right = value >> half_bits, value & mask
        for rk in reversed(round_keys):
            left, right = right ^ (_mix64(left + rk) & mask), left
        value = (left << half_bits) | right
        if value < n:
            return value


def permute(index: npt.ArrayLike, n: int, key: int) -> IntArray:
    """Apply a keyed pseudo-random bijection of ``[0, n)`` to every element of ``index``.

    A balanced Feistel network (6 rounds, splitmix64 round function of the right half and a
    round key derived from ``key`` and the round number) over the smallest even number of bits
    ``2k >= 2`` with ``2**(2k) >= n``; elements that land outside ``[0, n)`` are re-encrypted
    until they are inside (cycle-walking), at most about 4 passes on average. Memory is
    O(len(index)); no table of size ``n`` is built.

    Parameters
    ----------
    index : array_like of int
        Positions in ``[0, n)``, any shape.
    n : int
        Size of the domain, ``0 <= n <= 2**63``.
    key : int
        Any integer; it is reduced mod ``2**64`` (use :func:`derive_key` to fold wider values).

    Returns
    -------
    numpy.ndarray of int64
        ``permute(index)`` elementwise, same shape as ``index``.

    Raises
    ------
    ValueError
        If ``n`` is out of range, ``index`` is not integer, or an element is outside ``[0, n)``.

    Examples
    --------
    >>> sorted(permute(np.arange(10), 10, key=7).tolist()) == list(range(10))
    True
    """
    n = operator.index(n)
    if not 0 <= n <= 1 << 63:
        raise ValueError(f"permute: expected 0 <= n <= 2**63, found n={n}")
    arr = np.asarray(index)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ValueError(f"permute: expected an integer index array, found dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
        found = f"values in [{int(arr.min())}, {int(arr.max())}]"
        raise ValueError(f"permute: expected index values in [0, {n}), found {found}")
    if n <= 1:
        return np.zeros(arr.shape, np.int64)
    half_bits, keys = _feistel_keys(n, key)
    round_keys = [np.uint64(k) for k in keys]
    # Values are checked non-negative, so a signed array is reinterpreted rather than copied.
    src = arr.ravel().astype(np.int64, copy=False).view(np.uint64)
    y = _feistel(src, half_bits, round_keys)
    limit = np.uint64(n)
    pending = np.flatnonzero(y >= limit)
    values = y[pending]
    while pending.size:
        values = _feistel(values, half_bits, round_keys)
        inside = values < limit
        y[pending[inside]] = values[inside]
        pending, values = pending[~inside], values[~inside]
    return y.view(np.int64).reshape(arr.shape)


@dataclass(frozen=True)
class PlanOptions:
    """How an epoch is ordered and split.

    Attributes
    ----------
    shuffle : bool
        Shuffle block order across the whole snapshot and samples within windows. Off by default
        so that reading back is the written order unless asked.
    seed : int
        Any integer; with ``epoch`` it keys every permutation.
    window_blocks : int
        Samples are shuffled within windows of this many consecutive (permuted) blocks. With 64
        blocks consecutive samples come from different blocks 63 times in 64, and the mean
        distance between consecutive reads is about 0.95 of a uniform shuffle's (see
        :func:`shuffle_quality`); ``Snapshot.batches`` sizes it from ``window_bytes`` (32 MiB,
        about 128 blocks of 256 KiB).
    drop_last : bool
        If true, drop the last ``N mod consumers`` samples of the epoch order; otherwise pad
        the last consumers by wrapping around to the start of the order.
    order_version : int
        How windows are laid out (:data:`ORDER_VERSIONS`): 1, ``window_blocks`` each; 2, the
        first ones ramping up from ``RAMP_FIRST_BLOCKS`` (see :func:`window_layout`). 1 by
        default here, so that a PlanOptions made before order versions orders as it did; the
        readers' :class:`snapstore.ReaderOptions` default to :data:`ORDER_VERSION`.
    """

    shuffle: bool = False
    seed: int = 0
    window_blocks: int = 64
    drop_last: bool = False
    order_version: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"PlanOptions.seed: expected an int, found {type(self.seed).__name__}")
        if operator.index(self.window_blocks) < 1:
            raise ValueError(
                f"PlanOptions.window_blocks: expected an int >= 1, found {self.window_blocks}"
            )
        check_order_version(self.order_version, "PlanOptions.order_version")


def check_order_version(version: object, name: str = "order_version") -> int:
    """``version`` as an int after checking it is one of :data:`ORDER_VERSIONS`.

    Raises
    ------
    ValueError
        If it is not (a bool is not a version).
    """
    if isinstance(version, (bool, np.bool_)) or version not in ORDER_VERSIONS:
        raise ValueError(
            f"{name}: expected one of {ORDER_VERSIONS} (the latest, {ORDER_VERSION}, ramps the "
            f"first windows up; 1 is the order before it), found {version!r}; pass one of them"
        )
    return int(operator.index(version))


def window_layout(window_blocks: int, order_version: int) -> tuple[int, ...]:
    """Where the ramp windows start and end, in positions of the block order.

    Version 1 has no ramp: ``(0,)``. Version 2 starts with ``RAMP_FIRST_BLOCKS`` blocks and
    multiplies by ``RAMP_GROWTH`` while the size stays below ``window_blocks``; windows of
    ``window_blocks`` follow from the last value on. With 126-block windows: windows of 16, 32
    and 64 blocks, then 126 each.

    Examples
    --------
    >>> window_layout(126, 2)
    (0, 16, 48, 112)
    >>> window_layout(126, 1)
    (0,)
    """
    starts = [0]
    size = RAMP_FIRST_BLOCKS
    while check_order_version(order_version) >= 2 and size < window_blocks:
        starts.append(starts[-1] + size)
        size *= RAMP_GROWTH
    return tuple(starts)


def window_permutation(n: int, key: int) -> IntArray:
    """A keyed permutation of ``[0, n)`` as an array: positions sorted by a hash of (position, key).

    The hash is splitmix64 of ``position * 0x9E3779B97F4A7C15 + mix(key)`` (wrapping mod 2**64);
    ties, which need a 64-bit collision, break by position (stable sort), so the result is
    deterministic everywhere. O(n) memory and O(n log n) time with no per-call overhead to speak
    of (about 30 us for n = 1,400, against about 1 ms for :func:`permute`).

    Examples
    --------
    >>> sorted(window_permutation(10, key=3).tolist()) == list(range(10))
    True
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"window_permutation: expected n >= 0, found {n}")
    z = np.arange(n, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(
        _mix64(operator.index(key) & _MASK64)
    )
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return np.argsort(z, kind="stable").astype(np.int64)


def _check_range(name: str, value: int, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int after checking ``low <= value`` (and ``value < high``)."""
    value = operator.index(value)
    if value < low or (high is not None and value >= high):
        bound = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"EpochPlan: expected {name} {bound}, found {value}")
    return value


def _check_block_rows(block_rows: npt.ArrayLike) -> IntArray:
    rows = np.asarray(block_rows)
    if rows.ndim != 1:
        raise ValueError(f"EpochPlan: expected 1-D block_rows, found shape {rows.shape}")
    if rows.size == 0:
        return np.zeros(0, np.int64)
    if rows.dtype.kind not in "iu":
        raise ValueError(f"EpochPlan: expected integer block_rows, found dtype {rows.dtype}")
    if int(rows.min()) < 0 or int(rows.max()) >= 1 << 62:
        found = f"values in [{int(rows.min())}, {int(rows.max())}]"
        raise ValueError(f"EpochPlan: expected block_rows in [0, 2**62), found {found}")
    return rows.astype(np.int64)


def _check_offsets(offsets: npt.ArrayLike) -> IntArray:
    """``offsets`` as given (an int64 view, not copied) after a scan that it starts at 0 and
    never decreases, a chunk of :data:`_BATCH` values at a time (O(chunk) memory)."""
    values = np.asarray(offsets)
    if values.ndim != 1 or values.size == 0 or values.dtype != np.int64:
        found = f"shape {values.shape}, dtype {values.dtype}"
        raise ValueError(
            f"EpochPlan: expected 1-D int64 offsets of blocks + 1 values, found {found}"
        )
    if int(values[0]) != 0:
        raise ValueError(f"EpochPlan: expected offsets starting at 0, found {int(values[0])}")
    for lo in range(0, values.size - 1, _BATCH):
        if bool((np.diff(values[lo : lo + _BATCH + 1]) < 0).any()):
            raise ValueError(f"EpochPlan: offsets decrease after position {lo}")
    return values


def _uniform_rows(offsets: IntArray) -> int | None:
    """The rows of every block but the last when they are all equal (the last may differ),
    else None; one scan of ``offsets`` a chunk at a time."""
    blocks = offsets.size - 1
    if blocks < 2:
        return int(offsets[-1]) if blocks else 0
    rows = int(offsets[1])
    for lo in range(0, blocks - 1, _BATCH):
        if bool((np.diff(offsets[lo : min(lo + _BATCH, blocks - 1) + 1]) != rows).any()):
            return None
    return rows


class EpochPlan:
    """The samples one consumer reads in one epoch, in order, as global sample indices.

    A sample's global index is its position in written order. Consumers compose ranks and
    workers: ``C = world_size * num_workers`` consumers, this one is
    ``c = rank * num_workers + worker``. Partition rule: with ``per = N // C`` if ``drop_last``
    else ``ceil(N / C)``, consumer ``c`` reads ``G[(c * per + i) mod N]`` for ``i in range(per)``.
    Every consumer reads exactly ``per`` samples; together they read every sample once, plus
    fewer than ``C`` repeated from the start of ``G`` (padding), or minus the last
    ``N - C * per`` of ``G`` (``drop_last``).

    Parameters
    ----------
    block_rows : array_like of int or None
        Rows per block, blocks in written order (1-D, non-negative); None when ``offsets`` is
        given.
    epoch : int
        Epoch number, ``>= 0``.
    rank : int
        This consumer's rank, ``0 <= rank < world_size``.
    world_size : int
        Number of ranks, ``>= 1``.
    worker, num_workers : int
        This consumer's place among its rank's workers (DataLoader worker id and count).
    options : PlanOptions
        Shuffle, seed, window size and the drop/pad rule.
    offsets : array_like of int64, optional
        ``blocks + 1`` sample offsets (0, then the running total of ``block_rows``), for
        instance :attr:`SnapshotReader.offsets <snapstore.read.reader.SnapshotReader.offsets>`,
        mapped from the per-host index. They are read in place, never copied: the plan then
        keeps no array of one value per block (only one per window when shuffled blocks hold
        different numbers of rows, and none when all but the last hold the same number).

    Attributes
    ----------
    total_samples : int
        ``N``, the number of rows in the snapshot.
    num_samples : int
        Samples this consumer reads this epoch (the same for every consumer).
    consumer, num_consumers : int
        ``rank * num_workers + worker`` and ``world_size * num_workers``.
    epoch, rank, world_size, worker, num_workers : int
        The validated arguments.
    options : PlanOptions
        The options the plan was built with.

    Raises
    ------
    ValueError
        If an argument is out of range or ``block_rows`` is not a 1-D array of non-negative ints.

    Examples
    --------
    >>> plan = EpochPlan([3, 2], epoch=0, rank=1, world_size=2, options=PlanOptions())
    >>> plan.num_samples, plan.order().tolist()
    (3, [3, 4, 0])
    """

    def __init__(
        self,
        block_rows: npt.ArrayLike | None,
        *,
        epoch: int,
        rank: int,
        world_size: int,
        options: PlanOptions,
        worker: int = 0,
        num_workers: int = 1,
        offsets: npt.ArrayLike | None = None,
    ) -> None:
        if offsets is None:
            if block_rows is None:
                raise ValueError("EpochPlan: expected block_rows or offsets, found neither")
            offsets = np.concatenate(([0], np.cumsum(_check_block_rows(block_rows))))
        self._offsets = _check_offsets(offsets)
        self.epoch = _check_range("epoch", epoch, 0)
        self.world_size = _check_range("world_size", world_size, 1)
        self.rank = _check_range("rank", rank, 0, self.world_size)
        self.num_workers = _check_range("num_workers", num_workers, 1)
        self.worker = _check_range("worker", worker, 0, self.num_workers)
        self.num_consumers = self.world_size * self.num_workers
        self.consumer = self.rank * self.num_workers + self.worker
        self.options = options
        self.order_version = options.order_version
        self._ramp = window_layout(options.window_blocks, options.order_version)
        self._blocks = self._offsets.size - 1
        self.total_samples = int(self._offsets[-1])
        n, c = self.total_samples, self.num_consumers
        self.num_samples = n // c if options.drop_last else -(-n // c)
        self._key = derive_key(options.seed, self.epoch, BLOCK_DOMAIN)
        # Where each window starts in G: from the offsets without shuffle; arithmetic when
        # blocks are uniform (the last block's place in the permutation is all that varies);
        # else a private array of one value per window, summed over the permutation in chunks.
        self._uniform: tuple[int, int] | None = None
        self._bounds: IntArray | None = None
        if options.shuffle:
            rows = _uniform_rows(self._offsets)
            if rows is not None:
                last = self._blocks - 1
                where = unpermute_one(last, self._blocks, self._key) if last >= 0 else 0
                self._uniform = (rows, where)
        self._segments = self._consumer_segments()
        if options.shuffle and self._uniform is None:
            self._bounds = self._streamed_bounds()

    def for_epoch(self, epoch: int) -> EpochPlan:
        """This plan for epoch ``epoch``: the same offsets, consumer and options, without
        checking the offsets again (what depends on the epoch is computed anew: O(consumers)
        when shuffled, O(1) otherwise). Equal to a new ``EpochPlan`` for that epoch."""
        plan = copy.copy(self)
        plan.epoch = _check_range("epoch", epoch, 0)
        plan._key = derive_key(self.options.seed, plan.epoch, BLOCK_DOMAIN)
        if self.options.shuffle:
            if self._uniform is not None:
                last = self._blocks - 1
                where = unpermute_one(last, self._blocks, plan._key) if last >= 0 else 0
                plan._uniform = (self._uniform[0], where)
            plan._segments = plan._consumer_segments()
            if plan._uniform is None:
                plan._bounds = plan._streamed_bounds()
        return plan

    def for_rank(self, rank: int) -> EpochPlan:
        """This plan for rank ``rank`` (the same worker of the same workers): the same offsets,
        epoch and options, without checking the offsets again, in O(1) (every consumer's
        segments are in each plan). Equal to a new ``EpochPlan`` for that rank."""
        plan = copy.copy(self)
        plan.rank = _check_range("rank", rank, 0, self.world_size)
        plan.consumer = plan.rank * self.num_workers + self.worker
        return plan

    @property
    def num_windows(self) -> int:
        """Number of windows (groups of consecutive permuted blocks) in the epoch."""
        return int(self._segments[1][-1])

    def _consumer_segments(self) -> tuple[IntArray, IntArray]:
        """Where the ramp starts again in the block order, and the windows before each start.

        In order version 2 (with a ramp) a shuffled epoch's block order is cut at the block
        holding each consumer's first position ``c * per`` (``0`` for the first), so every
        consumer's first window is a ramp window; each segment is laid out by
        :func:`window_layout` from its own start, its last window ending at the next segment.
        Returns the segment starts (the first 0) and the running count of their windows
        (one value more: the epoch's windows). O(consumers) integers.
        """
        starts = np.zeros(1, np.int64)
        if self.options.shuffle and len(self._ramp) > 1 and self.num_samples:
            firsts = np.arange(1, self.num_consumers, dtype=np.int64) * self.num_samples
            firsts = firsts[firsts < self.total_samples]  # padding consumers start in G[0:]
            starts = np.unique(np.concatenate((starts, self._blocks_holding(firsts))))
        lengths = np.diff(np.append(starts, self._blocks))
        ramp, window = np.asarray(self._ramp, np.int64), self.options.window_blocks
        full = len(ramp) - 1 + -(-(lengths - ramp[-1]) // window)
        counts = np.where(lengths <= ramp[-1], np.searchsorted(ramp, lengths), full)
        return starts, np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    def _blocks_holding(self, positions: IntArray) -> IntArray:
        """Positions in the block order of the blocks holding the sorted positions of G (each
        below N): a binary search on the arithmetic starts of uniform blocks, else one scan of
        the permutation :data:`_BATCH` blocks at a time."""
        if self._uniform is not None:
            rows, last_at = self._uniform
            extra = self.total_samples - rows * self._blocks
            lo = np.zeros(positions.size, np.int64)
            hi = np.full(positions.size, self._blocks, np.int64)
            while bool((hi - lo > 1).any()):  # rows before lo <= position < rows before hi
                mid = (lo + hi) // 2
                inside = mid * rows + np.where(mid > last_at, extra, 0) <= positions
                lo, hi = np.where(inside, mid, lo), np.where(inside, hi, mid)
            return lo
        out, total = np.zeros(positions.size, np.int64), 0
        for lo_block in range(0, self._blocks, _BATCH):
            ids = self._block_range(lo_block, min(self._blocks, lo_block + _BATCH))
            running = np.cumsum(self._offsets[ids + 1] - self._offsets[ids]) + total
            first, last = np.searchsorted(positions, [total, int(running[-1])])
            held = np.searchsorted(running, positions[first:last], side="right")
            out[first:last] = lo_block + held
            total = int(running[-1])
        return out

    def _block_starts(self, windows: IntArray) -> IntArray:
        """Where windows ``windows`` (each ``<= num_windows``) start in the block order
        (``blocks`` for ``num_windows``)."""
        starts, before = self._segments
        segment = np.minimum(np.searchsorted(before, windows, side="right") - 1, starts.size - 1)
        local = windows - before[segment]
        ramp = np.asarray(self._ramp, np.int64)
        full = ramp[-1] + (local - ramp.size + 1) * self.options.window_blocks
        offset = np.where(local < ramp.size, ramp[np.minimum(local, ramp.size - 1)], full)
        ends = np.append(starts[1:], self._blocks)[segment]
        return np.asarray(np.minimum(starts[segment] + offset, ends), np.int64)

    def _block_start(self, window: int) -> int:
        """Where window ``window`` starts in the block order (``blocks`` past the last one):
        :meth:`_block_starts` for one window, in scalars (called per window while reading)."""
        starts, before = self._segments
        segment = min(int(np.searchsorted(before, window, side="right")) - 1, starts.size - 1)
        local = window - int(before[segment])
        ramp = self._ramp
        if local < len(ramp):
            offset = ramp[local]
        else:
            offset = ramp[-1] + (local - len(ramp) + 1) * self.options.window_blocks
        end = int(starts[segment + 1]) if segment + 1 < starts.size else self._blocks
        return min(int(starts[segment]) + offset, end)

    def block_order(self) -> IntArray:
        """Return the epoch's block order (block ids in the order ``G`` visits them)."""
        return self._block_range(0, self._blocks)

    def _block_range(self, lo: int, hi: int) -> IntArray:
        """Block ids at positions ``[lo, hi)`` of the block order: O(hi - lo)."""
        positions = np.arange(lo, hi, dtype=np.int64)
        return permute(positions, self._blocks, self._key) if self.options.shuffle else positions

    def _streamed_bounds(self) -> IntArray:
        """Where each window starts in G (and N at the end), for blocks of varying rows: the
        permutation is computed :data:`_BATCH` blocks at a time, so the window starts (in
        blocks, then in rows) are the only arrays kept."""
        count = self.num_windows
        starts = self._block_starts(np.arange(count + 1, dtype=np.int64))
        bounds = np.zeros(count + 1, np.int64)
        total = 0
        for lo in range(0, self._blocks, _BATCH):
            hi = min(self._blocks, lo + _BATCH)
            ids = self._block_range(lo, hi)
            running = np.cumsum(self._offsets[ids + 1] - self._offsets[ids]) + total
            # Windows starting after block lo and at or before hi: rows before their start.
            first, last = np.searchsorted(starts, [lo + 1, hi + 1])
            bounds[first:last] = running[starts[first:last] - lo - 1]
            total = int(running[-1])
        return bounds

    def _window_start(self, window: int) -> int:
        """Where window ``window`` (``0 <= window <= num_windows``) starts in G."""
        position = self._block_start(window)
        if self._bounds is not None:
            return int(self._bounds[window])
        if self._uniform is None:
            return int(self._offsets[position])
        rows, last_at = self._uniform
        extra = self.total_samples - rows * self._blocks if position > last_at else 0
        return position * rows + extra

    def _find_window(self, position: int) -> int:
        """The last window that starts at or before ``position`` of G (a binary search)."""
        if self._bounds is not None:
            return int(np.searchsorted(self._bounds, position, side="right")) - 1
        if not self.options.shuffle:
            # One segment, blocks in written order: the window of the last block that starts at
            # or before the position, from the layout (what the search below finds, in O(1)).
            block = int(np.searchsorted(self._offsets, position, side="right")) - 1
            ramp = self._ramp
            if block < ramp[-1]:
                return bisect.bisect_right(ramp, block) - 1
            return len(ramp) - 1 + (block - ramp[-1]) // self.options.window_blocks
        return self._search_window(position)

    def _search_window(self, position: int) -> int:
        """:meth:`_find_window` by a binary search over the window starts."""
        lo, hi = 0, self.num_windows + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._window_start(mid) <= position:
                lo = mid + 1
            else:
                hi = mid
        return lo - 1

    def chunks(self, start: int = 0) -> Iterator[IntArray]:
        """Yield this consumer's global sample indices from position ``start`` on, in order.

        Chunks split at window boundaries and at the wrap-around point, so each is at most one
        window long. Seeking to ``start`` costs O(log B); skipped windows are never generated.

        Parameters
        ----------
        start : int
            Position in this consumer's order to resume from, ``0 <= start <= num_samples``.

        Returns
        -------
        Iterator of numpy.ndarray of int64
            Global sample indices of consecutive positions. ``start`` is checked at the call,
            not at the first ``next()``.

        Raises
        ------
        ValueError
            If ``start`` is out of range.
        """
        per = self.num_samples
        start = _check_range("start", start, 0, per + 1)
        return self._iter_chunks(start) if start < per else iter(())

    def _iter_chunks(self, start: int) -> Iterator[IntArray]:
        n, per = self.total_samples, self.num_samples
        position = (self.consumer * per + start) % n
        remaining = per - start
        while remaining:  # at most two segments: before and after the wrap point
            stop = min(n, position + remaining)
            yield from self._segment(position, stop)
            remaining -= stop - position
            position = 0

    def _segment(self, begin: int, stop: int) -> Iterator[IntArray]:
        """Yield ``G[begin:stop]`` window by window."""
        window = self._find_window(begin)
        while begin < stop:
            end = min(self._window_start(window + 1), stop)
            if end > begin:  # windows of empty blocks have no positions
                yield self._window_slice(window, begin, end)
            begin, window = end, window + 1

    def _window_slice(self, window: int, begin: int, end: int) -> IntArray:
        """Global indices of ``G[begin:end]``, a range inside ``window``."""
        if not self.options.shuffle:
            return np.arange(begin, end, dtype=np.int64)
        ids = self._block_range(self._block_start(window), self._block_start(window + 1))
        starts = self._offsets[ids]
        g_offsets = np.zeros(ids.size + 1, np.int64)
        np.cumsum(self._offsets[ids + 1] - starts, out=g_offsets[1:])
        w0 = self._window_start(window)
        key = derive_key(self.options.seed, self.epoch, window, WINDOW_DOMAIN)
        local = window_permutation(int(g_offsets[-1]), key)[begin - w0 : end - w0]
        slot = np.searchsorted(g_offsets, local, side="right") - 1
        return starts[slot] + (local - g_offsets[slot])

    def order(self) -> IntArray:
        """Return this consumer's whole order (``chunks(0)`` concatenated); O(num_samples) memory.

        Returns
        -------
        numpy.ndarray of int64
            Global sample indices, ``num_samples`` of them.
        """
        parts = list(self.chunks(0))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def __repr__(self) -> str:
        return (
            f"EpochPlan(total_samples={self.total_samples}, num_samples={self.num_samples}, "
            f"epoch={self.epoch}, rank={self.rank}, world_size={self.world_size}, "
            f"worker={self.worker}, num_workers={self.num_workers}, options={self.options!r})"
        )


def _average_ranks(values: IntArray) -> npt.NDArray[np.float64]:
    """Ranks ``0..n-1`` of ``values``; tied values share their mean rank."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    mean_rank = first + (counts - 1) / 2.0
    return np.asarray(mean_rank[inverse.ravel()], dtype=np.float64)


def shuffle_quality(order: npt.ArrayLike) -> dict[str, float]:
    """Measure how well ``order`` (global indices in read order) is shuffled.

    Written positions are the ranks of the indices among those read (ties share a mean rank), so
    a rank's subset of an epoch or a padded order is measured on the same scale as a full one.

    Parameters
    ----------
    order : array_like of int
        Global sample indices in the order they are read.

    Returns
    -------
    dict of str to float
        ``"spearman"``: Spearman correlation between read position and written position (1.0
        unshuffled, about 0 for a uniform shuffle). ``"distance_ratio"``: mean distance in written
        position between consecutive reads divided by ``(n + 1) / 3``, its expectation under a
        uniform random permutation of ``n`` items (about 1 when shuffled, ``3 / n`` when not).
        Both are NaN for fewer than 2 samples.

    Examples
    --------
    >>> shuffle_quality(np.arange(100))["spearman"]
    1.0
    """
    values = np.asarray(order, dtype=np.int64).ravel()
    n = values.size
    if n < 2:
        return {"spearman": float("nan"), "distance_ratio": float("nan")}
    ranks = _average_ranks(values)
    read = np.arange(n, dtype=np.float64)
    ranks_c, read_c = ranks - ranks.mean(), read - read.mean()
    denominator = float(np.sqrt((ranks_c**2).sum() * (read_c**2).sum()))
    spearman = float((ranks_c * read_c).sum()) / denominator if denominator else float("nan")
    distance = float(np.abs(np.diff(ranks)).mean())
    return {"spearman": spearman, "distance_ratio": distance / ((n + 1) / 3.0)}
