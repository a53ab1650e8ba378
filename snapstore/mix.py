"""Mixtures: several committed snapshots read as one stream by weight (:func:`mix`).

Mixing happens when reading: a sweep over weights never recomputes a snapshot. The order is a
pure function of (seed, epoch, the sources' samples per epoch, their fingerprints): see
:mod:`snapstore.read.mixture` for the schedule and :mod:`snapstore.read.mixed` for the reader.
A :class:`Mixture` holds its sources as :class:`~snapstore.handle.SnapshotHandle` objects, so
it pickles to DataLoader workers as their stores' recipes, fingerprints and the settings.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping, Sequence
from typing import Unpack

from .errors import SchemaError
from .format.schema import Schema
from .handle import SnapshotHandle
from .read.mixed import MixedBatchReader, SourceSlice
from .read.mixture import apportion
from .read.options import ReaderOptions, ReaderSettings, reader_options
from .snapshot import Snapshot

__all__ = ["Mixture", "mix"]

Sources = Mapping[str, Snapshot] | Sequence[Snapshot]
PerSource = Mapping[str, float] | Sequence[float]


class Mixture:
    """Several snapshots read as one stream; made by :func:`snapstore.mix`.

    Attributes
    ----------
    names : list of str
        The sources' names (a mapping's keys, else ``"0"``, ``"1"``...); a sample's source
        index (``source_field``) is its position here.
    counts : list of int
        Samples of each source per epoch.
    schema : Schema
        The fields read (``fields``, else the first source's), which every source has alike.
    """

    def __init__(
        self,
        handles: Sequence[SnapshotHandle],
        names: Sequence[str],
        counts: Sequence[int],
        schema: Schema,
        *,
        source_field: str | None = None,
        homogeneous: bool = False,
    ) -> None:
        self.handles, self.names, self.counts = list(handles), list(names), list(counts)
        self.schema = schema
        self.source_field = source_field
        self.homogeneous = bool(homogeneous)

    def __len__(self) -> int:
        return sum(self.counts)

    @property
    def weights(self) -> list[float]:
        """Each source's share of an epoch's samples."""
        return [c / len(self) for c in self.counts]

    def open(self) -> Mixture:
        """This mixture (its sources open themselves in each process that reads them)."""
        return self

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={c}" for n, c in zip(self.names, self.counts, strict=True))
        return f"Mixture({parts}, samples_per_epoch={len(self)})"

    def batches(
        self,
        batch_size: int,
        options: ReaderOptions | None = None,
        *,
        epoch: int = 0,
        rank: int = 0,
        world_size: int = 1,
        worker: int = 0,
        num_workers: int = 1,
        **settings: Unpack[ReaderSettings],
    ) -> MixedBatchReader:
        """Batches of this consumer's share of one epoch of the mixture, as dicts of numpy arrays.

        Parameters are those of :meth:`snapstore.Snapshot.batches`. ``window_bytes`` and
        ``prefetch_bytes`` are the mixture's, split among the sources by their share of the bytes
        read (a source's read-ahead is at least 8 MiB); the sources share one pool of
        ``decode_threads``.

        Returns
        -------
        MixedBatchReader
            Iterable of batch dicts with ``get_state()``/``set_state()``, ``set_epoch()``,
            ``stats()`` and ``close()``. Every consumer yields the same number of samples
            (``drop_last`` as for one snapshot; with homogeneous batches, whole batches).

        Raises
        ------
        TypeError, ValueError
            On a bad setting, as :class:`snapstore.ReaderOptions` raises them.
        """
        read = reader_options(options, dict(settings))
        shuffle = bool(read.shuffle)
        readers = [h.open()._open(pin_later=True) for h in self.handles]
        raw = [
            c * int(r.manifest["raw_bytes"]) / max(1, len(r))
            for c, r in zip(self.counts, readers, strict=True)
        ]
        sources = [
            SourceSlice(r, c, b / sum(raw) if sum(raw) else 1 / len(raw))
            for r, c, b in zip(readers, self.counts, raw, strict=True)
        ]
        return MixedBatchReader(
            sources,
            self.schema,
            batch_size,
            read.replace(shuffle=shuffle),
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            homogeneous=self.homogeneous,
            source_field=self.source_field,
        )


def _per_source(name: str, values: PerSource | None, names: list[str]) -> list[float | None]:
    """``values`` (a mapping by name or a sequence) as one entry per source (None: not given)."""
    if values is None:
        return [None] * len(names)
    if isinstance(values, Mapping):
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"mix: {name} names unknown sources {unknown}; sources are {names}")
        return [values.get(n) for n in names]
    if len(values) != len(names):
        raise ValueError(f"mix: expected {len(names)} {name}, one per source, found {len(values)}")
    return list(values)


def _counts(
    sizes: list[int],
    names: list[str],
    weights: PerSource | None,
    samples: int | None,
    counts: PerSource | None,
    repeats: PerSource | None,
) -> list[int]:
    """Samples of each source per epoch (see :func:`mix`)."""
    absolute = counts is not None or repeats is not None
    if absolute and (weights is not None or samples is not None):
        raise ValueError(
            "mix: give weights (and samples) or per-source counts/repeats, not both: with "
            "counts or repeats the epoch is their sum"
        )
    if absolute:
        given, factors = (
            _per_source("counts", counts, names),
            _per_source("repeats", repeats, names),
        )
        out = []
        for name, size, count, factor in zip(names, sizes, given, factors, strict=True):
            if count is not None and factor is not None:
                raise ValueError(f"mix: source {name!r} has both a count and a repeat factor")
            if count is None:
                out.append(round((1 if factor is None else factor) * size))
            elif isinstance(count, bool) or int(count) != count:
                raise ValueError(
                    f"mix: source {name!r}'s count must be a whole number, not {count}"
                )
            else:
                out.append(int(count))
        return _checked(out, names, "counts")
    total = sum(sizes) if samples is None else operator.index(samples)
    if total < 1:
        raise ValueError(f"mix: expected samples per epoch >= 1, found {total}")
    given_weights = _per_source("weights", weights, names)
    if weights is None:
        given_weights = [float(s) for s in sizes]
    if any(w is None for w in given_weights):
        missing = [n for n, w in zip(names, given_weights, strict=True) if w is None]
        raise ValueError(f"mix: weights misses sources {missing}")
    values = [float(w) for w in given_weights if w is not None]
    if any(not math.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
        raise ValueError(f"mix: expected finite weights >= 0, not all 0, found {values}")
    return _checked(apportion(total, values), names, "weights")


def _checked(counts: list[int], names: list[str], what: str) -> list[int]:
    if any(c < 0 for c in counts) or sum(counts) == 0:
        raise ValueError(f"mix: {what} give {dict(zip(names, counts, strict=True))} samples")
    return counts


def _schema(snaps: list[Snapshot], names: list[str], fields: Sequence[str] | None) -> Schema:
    """The fields read, after checking that every source has each of them alike."""
    first = snaps[0].schema
    chosen = list(first.names if fields is None else fields)
    for snap, name in zip(snaps, names, strict=True):
        schema = snap.schema
        for field in chosen:
            if field not in schema.names:
                raise SchemaError(
                    f"mixture source {name!r} has no field {field!r} (its fields: "
                    f"{schema.names}); pass fields=[...] to read the fields all sources share"
                )
            if schema[field] != snaps[0].schema[field] if field in first.names else False:
                raise SchemaError(
                    f"mixture source {name!r}: field {field!r} is {schema[field]}, but source "
                    f"{names[0]!r} has {first[field]}; sources must agree on the fields read "
                    "(dtype, shape, ragged or not): pass fields=[...] to leave it out"
                )
    if any(field not in first.names for field in chosen):
        missing = [f for f in chosen if f not in first.names]
        raise SchemaError(f"mixture source {names[0]!r} has no field(s) {missing}")
    return Schema(tuple(first[f] for f in chosen))


def mix(
    sources: Sources,
    weights: PerSource | None = None,
    *,
    samples: int | None = None,
    counts: PerSource | None = None,
    repeats: PerSource | None = None,
    fields: Sequence[str] | None = None,
    source_field: str | None = None,
    homogeneous: bool = False,
) -> Mixture:
    """Read several snapshots as one stream, each source a share of every epoch.

    Parameters
    ----------
    sources : mapping of str to Snapshot, or sequence of Snapshot
        The snapshots (materialized here if needed), on any roots and stores.
    weights : mapping or sequence of float, optional
        Each source's share of an epoch, normalized; default proportional to their sizes.
    samples : int, optional
        Samples per epoch (default: the sum of the sources' sizes), split by ``weights``
        (largest remainders). A source asked for more than it holds is repeated with a fresh
        shuffle each pass; one asked for fewer reads a different part of its shuffled samples
        each epoch, all of them over ``ceil(size / count)`` epochs.
    counts, repeats : mapping or sequence, optional
        Per-source absolute settings instead of weights: samples per epoch, or a repeat factor
        (``round(factor * size)`` samples; 0.5 reads half each epoch). Sources given neither are
        read once per epoch; the epoch is the sum.
    fields : sequence of str, optional
        The fields to read (default: the first source's); every source must have them alike.
    source_field : str, optional
        Add this int64 field to each batch: each sample's source index.
    homogeneous : bool
        Draw every batch whole from one source (a source's samples per epoch are then rounded
        down to whole batches); the schedule interleaves batches instead of samples.

    Returns
    -------
    Mixture
        Read with ``mixture.batches(...)``, ``snapstore.torch.SnapshotIterableDataset``,
        ``snapstore.tensorflow.to_dataset`` or ``snapstore.grain.mixture_dataset``;
        ``len(mixture)`` is the samples per epoch.

    Raises
    ------
    SchemaError
        If a source lacks a field read, or has it with another dtype, shape or kind.
    ValueError
        On weights, counts or repeats that do not fit the sources.

    Examples
    --------
    >>> both = snapstore.mix({"web": web, "code": code}, [0.7, 0.3])  # doctest: +SKIP
    >>> for batch in both.batches(256, shuffle=True, epoch=0): ...  # doctest: +SKIP
    """
    if isinstance(sources, Mapping):
        names, snaps = [str(k) for k in sources], list(sources.values())
    else:
        snaps = list(sources)
        names = [str(i) for i in range(len(snaps))]
    if not snaps or not all(isinstance(s, Snapshot) for s in snaps):
        raise TypeError(
            "mix: expected a non-empty mapping or sequence of snapstore.Snapshot, found "
            f"{[type(s).__name__ for s in snaps]}"
        )
    snaps = [s.materialize() for s in snaps]
    sizes = [len(s) for s in snaps]
    per_epoch = _counts(sizes, names, weights, samples, counts, repeats)
    for name, size, count in zip(names, sizes, per_epoch, strict=True):
        if count and not size:
            raise ValueError(f"mix: source {name!r} is empty but is asked for {count} samples")
    schema = _schema(snaps, names, fields)
    if source_field is not None and source_field in schema.names:
        raise ValueError(f"mix: source_field {source_field!r} is already a field read")
    handles = [SnapshotHandle(s, "a mixture's readers") for s in snaps]
    return Mixture(
        handles, names, per_epoch, schema, source_field=source_field, homogeneous=homogeneous
    )
