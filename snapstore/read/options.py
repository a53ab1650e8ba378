"""How a snapshot is read: :class:`ReaderOptions`, shared by ``Snapshot.batches()``, the torch
and tf.data datasets, the Grain source and ``snapstore bench``.

The options say how an epoch is ordered and read; where a consumer sits in the job (``epoch``,
``rank``, ``world_size``, ``worker``, ``num_workers``) and the batch size are arguments of each
call, not options: one options object serves every rank, worker and epoch.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from ..format.plan import check_order_version
from ..format.ragged import FORMS

__all__ = ["ReaderOptions", "ReaderSettings", "reader_options"]


class ReaderSettings(TypedDict, total=False):
    """The fields of :class:`ReaderOptions` as keyword arguments (for ``**settings``)."""

    shuffle: bool | None
    seed: int
    drop_last: bool
    window_bytes: int
    window_blocks: int | None
    prefetch_bytes: int | None
    max_requests: int | None
    decode_threads: int | None
    ragged: str
    order_version: int | None


@dataclass(frozen=True)
class ReaderOptions:
    """How a snapshot is read: order, shuffle window, read-ahead and threads, batch form.

    None of these change which samples a consumer gets over an epoch except ``shuffle``,
    ``seed``, ``window_bytes``/``window_blocks``, ``drop_last`` and ``order_version``, which fix
    the order (a resume state must agree on them); the others change memory, requests and
    threads only.

    Parameters
    ----------
    shuffle : bool, optional
        Shuffle block order across all shards and samples within windows of ``window_blocks``
        blocks; the order is a pure function of (seed, epoch). None: the reader's default,
        False for :meth:`snapstore.Snapshot.batches` (reading back is the written order unless
        asked) and True for the training integrations and ``snapstore bench``.
    seed : int
        Selects the order, with the epoch given to each call.
    drop_last : bool
        False: each consumer gets ceil(N / consumers) samples, the few missing ones repeated
        from the start of the epoch's order, and the last batch may be short. True: each gets
        floor(N / consumers) samples and short batches are dropped.
    window_bytes : int
        Shuffle window: samples are mixed across this many bytes of (decoded) blocks. 32 MiB
        keeps consecutive samples from different blocks ~98% of the time for both benchmark
        workloads (see benchmarks/README.md).
    window_blocks : int, optional
        The window as a number of blocks, overriding ``window_bytes``.
    prefetch_bytes : int, optional
        Decoded bytes fetched ahead of the window being consumed: by default two windows (at
        least 64 MiB) on a local store, four (at least 128 MiB) on a remote one, which needs
        more in flight (bandwidth x latency). Reader memory is about this plus one window.
    max_requests : int, optional
        Cap on byte-range requests in flight (the reader adapts below it); default 128 for
        remote stores, twice the decode threads for local ones.
    decode_threads : int, optional
        Threads that decompress and decode blocks: default min(4, CPUs). One is enough where
        other processes share the cores (DataLoader workers default to their share of them).
    ragged : {"list", "pad", "packed"}
        Varying-shape array fields as lists of arrays, zero-padded with their true shapes in
        ``<name>_lengths``, or packed: every sample's values in one flat array with
        ``<name>_offsets`` (and ``<name>_shapes`` for fields of more than one dimension). A
        form that would add a field the snapshot already has is refused when reading starts.
    order_version : {1, 2}, optional
        How a shuffled epoch's windows are laid out (see docs/format.md, "Order versions"): 2
        starts each epoch with small windows that grow (16, 32, 64 blocks, then the window) so
        that the first batch waits for a few blocks, not most of a window; 1 is the order
        before it, windows of the full size from the start. None: the latest (2), or the
        version of a resume state given to ``set_state`` (a state without one is version 1),
        so that a checkpoint resumes in the order it was saved in.

    Raises
    ------
    TypeError
        If ``shuffle``, ``drop_last`` or ``seed`` has the wrong type.
    ValueError
        If a size or count is below 1, ``ragged`` is not a known form or ``order_version`` not
        a known version.

    Examples
    --------
    >>> from snapstore import ReaderOptions
    >>> options = ReaderOptions(shuffle=True, seed=1, decode_threads=1)
    >>> options.replace(seed=2).seed
    2
    >>> snap.batches(256, options, epoch=3)                            # doctest: +SKIP
    >>> snap.batches(256, shuffle=True, seed=1, decode_threads=1, epoch=3)  # doctest: +SKIP

    The two calls make the same reader.
    """

    shuffle: bool | None = None
    seed: int = 0
    drop_last: bool = False
    window_bytes: int = 32 << 20
    window_blocks: int | None = None
    prefetch_bytes: int | None = None
    max_requests: int | None = None
    decode_threads: int | None = None
    ragged: str = "list"
    order_version: int | None = None

    def __post_init__(self) -> None:
        for name in ("shuffle", "drop_last"):
            value = getattr(self, name)
            if value is None and name == "shuffle":
                continue
            # 0 and 1 as well (configs and argparse give ints), as before the options object.
            if not isinstance(value, (bool, np.bool_)) and value not in (0, 1):
                raise TypeError(f"{name}: expected True or False, found {value!r}")
            object.__setattr__(self, name, bool(value))
        if not isinstance(self.seed, (int, np.integer)):
            raise TypeError(f"seed: expected an int, found {type(self.seed).__name__}")
        object.__setattr__(self, "seed", int(self.seed))
        if not _at_least_one(self.window_bytes):
            raise ValueError(
                f"window_bytes must be a positive number of bytes, got {self.window_bytes!r}"
            )
        if self.window_blocks is not None and _below_one(self.window_blocks):
            raise ValueError(f"window_blocks: expected an int >= 1, found {self.window_blocks}")
        if self.prefetch_bytes is not None and not _at_least_one(self.prefetch_bytes):
            raise ValueError(
                f"prefetch_bytes: expected a positive int, found {self.prefetch_bytes}"
            )
        for name in ("max_requests", "decode_threads"):
            value = getattr(self, name)
            if value is not None and _below_one(value):
                raise ValueError(f"{name}: expected an int >= 1, found {value}")
        if self.ragged not in FORMS:
            raise ValueError(f"ragged: expected one of {FORMS}, found {self.ragged!r}")
        if self.order_version is not None:
            object.__setattr__(self, "order_version", check_order_version(self.order_version))

    def replace(self, **changes: Any) -> ReaderOptions:
        """A copy with ``changes`` applied (and validated), e.g. ``options.replace(seed=2)``."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)


def _at_least_one(value: Any) -> bool:
    """Whether ``value`` is a number of bytes >= 1 (an int or a float, as the reader accepts)."""
    numeric = isinstance(value, (int, float, np.integer, np.floating))
    return numeric and not isinstance(value, bool) and bool(value >= 1)


def _below_one(value: Any) -> bool:
    """Whether ``value`` is not an int >= 1 (a bool or a float is not an int here)."""
    if isinstance(value, bool):
        return True
    try:
        return operator.index(value) < 1
    except TypeError:
        return True


_NAMES = tuple(f.name for f in dataclasses.fields(ReaderOptions))


def _check_names(settings: dict[str, Any]) -> None:
    unknown = sorted(set(settings) - set(_NAMES))
    if unknown:
        raise TypeError(
            f"unknown reader setting(s) {unknown}: expected some of {list(_NAMES)} "
            "(epoch, rank, world_size, worker and num_workers are arguments of the call)"
        )


def reader_options(options: ReaderOptions | None, settings: dict[str, Any]) -> ReaderOptions:
    """``options`` (default ``ReaderOptions()``) with the keyword ``settings`` overriding it.

    Raises
    ------
    TypeError
        If ``options`` is not a ReaderOptions or a setting's name is unknown.
    """
    if options is None:
        options = ReaderOptions()
    elif not isinstance(options, ReaderOptions):
        raise TypeError(
            f"options: expected a snapstore.ReaderOptions, found {type(options).__name__}; "
            "pass ReaderOptions(...) or the settings as keyword arguments"
        )
    return options.replace(**settings) if settings else options
