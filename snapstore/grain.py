"""A snapshot as a Grain random-access data source.

:class:`SnapshotSource` follows ``grain.python.RandomAccessDataSource``: ``len(source)`` samples,
``source[i]`` sample ``i`` in written order. It holds no reading state, so Grain's own samplers
and iterators decide everything about order, sharding and resuming:

**Sharding.** Give the sampler (or the DataLoader) ``grain.python.ShardOptions(shard_index,
shard_count, drop_remainder)``, or ``grain.python.ShardByJaxProcess()`` under JAX, which reads
the process index and count from ``jax``. Each shard reads its own slice of the record keys;
together the shards cover every record once (with ``drop_remainder=True`` a few are left out so
that the shards hold equal counts).

**Shuffling.** ``grain.python.IndexSampler(num_records=len(source), shard_options=...,
shuffle=True, num_epochs=..., seed=...)``: Grain's shuffle is a keyed permutation of the record
keys per epoch, a pure function of the seed, so it costs no memory and every host computes the
same order. Random access decodes the block holding each sample (through a small cache of
recently decoded blocks), so a globally shuffled read decodes about one block per sample: where
throughput matters more than a global shuffle, prefer :meth:`snapstore.Snapshot.batches`.

**Resuming.** ``iterator = iter(loader)``; ``state = iterator.get_state()`` (bytes, saved with the
model); later ``iterator = iter(new_loader)``; ``iterator.set_state(state)``: the iterator goes on
with the records the interrupted run had left. Grain checks the restored state against
``repr(sampler)`` and ``repr(source)``; the source's ``repr`` names the fingerprint and store, so
a state saved for another snapshot is refused.

Examples
--------
>>> import grain.python as pygrain                                     # doctest: +SKIP
>>> source = SnapshotSource(snap)                                      # doctest: +SKIP
>>> sampler = pygrain.IndexSampler(
...     num_records=len(source), shard_options=pygrain.ShardByJaxProcess(),
...     shuffle=True, num_epochs=1, seed=0)                           # doctest: +SKIP
>>> loader = pygrain.DataLoader(data_source=source, sampler=sampler,
...     operations=[pygrain.Batch(256)], worker_count=4)              # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .format.columns import RowCopy, gather, nest_batch
from .format.ragged import RaggedRows, check_form, emit
from .handle import SnapshotHandle
from .read.options import ReaderOptions, reader_options
from .read.reader import SnapshotReader
from .snapshot import Snapshot

__all__ = ["SnapshotSource"]

log = logging.getLogger(__name__)


class SnapshotSource:
    """A committed snapshot as a Grain data source: ``source[i]`` is sample ``i``.

    Picklable for Grain's worker processes: it keeps the fingerprint and where the store is (a
    local path, or an fsspec filesystem and root) and opens the snapshot lazily in each process.
    See the module docstring for sharding, shuffling and resuming.

    Parameters
    ----------
    snapshot_or_fingerprint : Snapshot or str
        A snapshot (materialized here if needed) or a fingerprint (or unique prefix) to open
        under ``root``.
    root : str, PathLike or Store, optional
        Where to find a fingerprint; as for :func:`snapstore.open`.
    options : ReaderOptions, optional
        Only ``ragged`` applies here: the default form of :meth:`read_batch`. Grain's sampler
        decides order and sharding, and samples are read one block at a time, so the other
        settings are refused unless left at their defaults.

    Raises
    ------
    TypeError
        If the snapshot's store is neither a LocalStore nor an FsspecStore.
    ValueError
        If ``options`` sets anything but ``ragged``.
    SnapshotNotFoundError
        If no committed snapshot matches the fingerprint.
    """

    def __init__(
        self,
        snapshot_or_fingerprint: Snapshot | str,
        root: Any = None,
        *,
        options: ReaderOptions | None = None,
    ) -> None:
        self.ragged = _ragged_only(reader_options(options, {}))
        # Reopened in each worker process, whether it was spawned or forked.
        self._handle = SnapshotHandle.of(snapshot_or_fingerprint, root, "Grain worker processes")
        snap = self._handle.open()
        self.fingerprint = snap.fingerprint
        self._url = snap.store.url
        self._len = len(snap)

    def _reader(self) -> SnapshotReader:
        # Snapshot._open pins the snapshot, so cleaning never removes it under a reader.
        return self._handle.open()._open()

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Sample ``index`` in written order (negative counts from the end).

        Arrays are read-only views into a decoded block that a cache shares with later reads.
        """
        return self._reader().sample(operator.index(index))

    def __repr__(self) -> str:
        # Grain compares repr(source) when restoring an iterator's state: keep it deterministic.
        return f"SnapshotSource(fingerprint={self.fingerprint!r}, store={self._url!r})"

    def _blocks(
        self, indices: Sequence[int] | np.ndarray[Any, Any]
    ) -> tuple[SnapshotReader, list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The decoded blocks ``indices`` need (each once), with each index's block number in
        that list and row inside its block."""
        reader = self._reader()
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._len
        bad = (wanted < -n) | (wanted >= n)
        if bool(bad.any()):
            raise IndexError(
                f"sample index {int(wanted[bad][0])} out of range for a snapshot of {n} samples"
            )
        blocks, rows = reader.locate(wanted % n if n else wanted)
        unique, which = np.unique(blocks, return_inverse=True)
        decoded = [reader.block(int(b)) for b in unique.tolist()]
        return reader, decoded, which.reshape(-1), rows

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Samples ``indices``, decoding each block they need once.

        Returns
        -------
        list of dict
            ``[source[i] for i in indices]``.
        """
        _, decoded, which, rows = self._blocks(indices)
        return [decoded[w].sample(r) for w, r in zip(which.tolist(), rows.tolist())]

    # Grain's dataset API batches reads through this name.
    _getitems = __getitems__

    def read_batch(
        self, indices: Sequence[int] | np.ndarray[Any, Any], ragged: str | None = None
    ) -> dict[str, Any]:
        """Samples ``indices`` stacked field by field, decoding each block they need once.

        Parameters
        ----------
        indices : sequence of int
            Global sample indices, in the order wanted (negative counts from the end).
        ragged : {"list", "packed", "pad"}
            Varying-shape fields as lists of arrays (read-only views into the blocks), packed
            into one flat array with ``<name>_offsets`` (and ``<name>_shapes``), or zero-padded
            with ``<name>_lengths``: as :meth:`snapstore.Snapshot.batches` gives them. Where the
            batch leaves a Grain worker process, use ``"packed"`` or ``"pad"``: Grain copies
            every array of an element into a shared-memory segment of its own, so a list of
            256 arrays costs 256 segments (measured 9x slower); a list read in a Grain worker
            logs one warning. Default: the ``ragged`` of the source's options (``"list"``).

        Returns
        -------
        dict
            Fixed-shape and scalar fields as one ndarray each (a read-only view into a block
            when the rows are contiguous in one block, otherwise a new array); varying-shape
            fields in the form ``ragged``; str and bytes fields as lists.

        Raises
        ------
        IndexError
            If an index is out of range.
        ValueError
            If ``ragged`` is unknown or would add a field the snapshot already has.
        """
        ragged = self.ragged if ragged is None else ragged
        reader = self._reader()
        check_form(reader.schema.flat(), ragged)
        reader, decoded, which, rows = self._blocks(indices)
        out = gather(reader.schema, decoded, which, rows)
        batch: dict[str, Any] = {}
        for field in reader.schema.flat().fields:  # nested fields by path, _valid masks
            value = out[field.name]
            if isinstance(value, RaggedRows):
                if ragged == "list":
                    _warn_list_in_worker()
                emit(field, [value], ragged, batch)
            else:
                batch[field.name] = value.materialize() if isinstance(value, RowCopy) else value
        return nest_batch(reader.schema, batch, ragged)


def _ragged_only(options: ReaderOptions) -> str:
    """The ``ragged`` form of ``options``; ValueError if it sets anything else."""
    default = ReaderOptions(ragged=options.ragged)
    found = [
        f"{f.name}={getattr(options, f.name)!r}"
        for f in dataclasses.fields(options)
        if getattr(options, f.name) != getattr(default, f.name)
    ]
    if found:
        raise ValueError(
            "SnapshotSource: of ReaderOptions only ragged applies (Grain's sampler decides "
            f"order and sharding, and reads go one block at a time); found {', '.join(found)}. "
            "Pass shuffle and seed to grain.python.IndexSampler and leave the rest unset."
        )
    return options.ragged


_warned = False


def _in_grain_worker() -> bool:
    """Whether this process is one of Grain's worker processes (False where Grain can't say)."""
    try:
        from grain._src.python.dataset.transformations import (  # type: ignore[import-untyped]
            process_prefetch,
        )
    except ImportError:
        return False
    return bool(getattr(process_prefetch, "is_in_worker_process", lambda: False)())


def _warn_list_in_worker() -> None:
    global _warned
    if not _warned and _in_grain_worker():
        _warned = True
        log.warning(
            "SnapshotSource.read_batch(ragged='list') in a Grain worker process: Grain copies "
            "each array of the list into a shared-memory segment of its own to send it to the "
            "main process (about 9x slower than one array per field); pass ragged='packed' "
            "(values plus <name>_offsets) or ragged='pad'"
        )
