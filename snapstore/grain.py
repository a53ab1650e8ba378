"""Snapshots and mixtures for Grain: a random-access data source, and an ``IterDataset``.

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

**Mixtures.** A :func:`snapstore.mix` mixture has no cheap random access (its sample at a
position is found only by reading its source's shuffle window), so it is no data source:
:func:`mixture_dataset` makes a ``grain.IterDataset`` of it instead, read by snapstore's own
reader, whose iterator checkpoints with ``get_state()``/``set_state()``:

>>> both = snapstore.mix({"web": web, "code": code}, [0.7, 0.3])     # doctest: +SKIP
>>> ds = mixture_dataset(both, batch_size=256, seed=0, num_epochs=3)  # doctest: +SKIP
>>> it = iter(ds.map(to_model_inputs))                              # doctest: +SKIP
>>> state = it.get_state()  # a dict of ints; it.set_state(state) resumes   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from collections.abc import Generator, Sequence
from typing import Any

import numpy as np

try:
    import grain  # type: ignore[import-untyped,unused-ignore]
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"snapstore.grain needs Grain ({exc}); pip install 'snapstore[grain]'"
    ) from exc

from .errors import ResumeError
from .format.columns import RowCopy, gather, nest_batch
from .format.ragged import RaggedRows, check_form, emit
from .handle import SnapshotHandle
from .mix import Mixture
from .read.consumer import ConsumerReader, every_batch
from .read.options import ReaderOptions, reader_options
from .read.reader import SnapshotReader
from .snapshot import Snapshot

__all__ = ["SnapshotSource", "mixture_dataset"]

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
        If given a mixture (read it with :func:`mixture_dataset`), or if the snapshot's store
        is neither a LocalStore nor an FsspecStore.
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
        if isinstance(snapshot_or_fingerprint, Mixture):
            raise TypeError(
                "SnapshotSource: a mixture has no random access by index (its sample at a "
                "position is found only by reading its source's shuffle window); read it with "
                "snapstore.grain.mixture_dataset(mixture, batch_size=..., seed=...), a "
                "grain.IterDataset"
            )
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


# Samples per read in per-sample mode: batches are read and split into samples.
_SAMPLE_CHUNK = 256


def mixture_dataset(
    mixture: Mixture | Snapshot,
    *,
    batch_size: int | None = None,
    options: ReaderOptions | None = None,
    epoch: int = 0,
    num_epochs: int | None = 1,
    rank: int = 0,
    world_size: int = 1,
    **settings: Any,
) -> Any:
    """A ``grain.IterDataset`` of a mixture (or a snapshot), read by snapstore's own reader.

    Each epoch is this rank's share of :meth:`snapstore.Mixture.batches` (or
    :meth:`snapstore.Snapshot.batches`): snapstore fetches, decodes, shuffles and interleaves the
    sources in its threads, and Grain's transformations run on what it yields. Under
    ``ds.mp_prefetch(...)`` each worker process reads an equal share of the rank's.

    Parameters
    ----------
    mixture : Mixture or Snapshot
        A :func:`snapstore.mix` mixture, or one snapshot (materialized here if needed).
    batch_size : int, optional
        Samples per element, as the reader's batches (dicts of numpy arrays); None (the default)
        yields single samples (dicts of one sample's values; varying-shape fields as arrays of
        their own shape) for Grain's own ``ds.batch(...)``. A mixture of homogeneous batches
        needs a batch size.
    options : ReaderOptions, optional
        How to read (:class:`snapstore.ReaderOptions`); ``shuffle`` defaults to True here.
        Per sample, ``ragged`` must be left at ``"list"``.
    epoch : int
        The first epoch (it seeds the order).
    num_epochs : int or None
        Epochs the iterator reads, one after the other from ``epoch``; None: without end.
    rank, world_size : int
        This process's place among all that read (under JAX: ``jax.process_index()`` and
        ``jax.process_count()``); every rank reads an equal share of each epoch.
    **settings
        Any field of :class:`snapstore.ReaderOptions` as a keyword (``shuffle``, ``seed``,
        ``drop_last``, ``window_bytes``...), overriding ``options``'s.

    Returns
    -------
    grain.IterDataset
        Its iterator's ``get_state()`` is the reader's state (a dict of integers: the epoch, the
        samples of it already yielded, and what they are valid for); ``set_state(state)`` on a
        new iterator of the same dataset yields exactly the elements after it. Per sample, a
        state may fall inside a read batch. Grain's checkpointing (``it.save``/``it.load``,
        orbax) saves it as JSON.

    Raises
    ------
    TypeError
        If ``mixture`` is neither a Mixture nor a Snapshot.
    ValueError
        On a bad argument (raised here, not while iterating).

    Examples
    --------
    >>> both = snapstore.mix({"web": web, "code": code}, [0.7, 0.3], source_field="src")
    ...                                                                   # doctest: +SKIP
    >>> ds = mixture_dataset(both, seed=0, num_epochs=None, rank=jax.process_index(),
    ...                      world_size=jax.process_count())              # doctest: +SKIP
    >>> ds = ds.map(tokenize).batch(256)                                  # doctest: +SKIP
    >>> it = iter(ds)                                                     # doctest: +SKIP
    >>> state = it.get_state()  # save it with the model; it.set_state(state) later
    ...                                                                   # doctest: +SKIP
    """
    if isinstance(mixture, Snapshot):
        location: SnapshotHandle | Mixture = SnapshotHandle.of(mixture, None, "Grain workers")
    elif isinstance(mixture, Mixture):
        location = mixture
    else:
        raise TypeError(
            "mixture_dataset: expected a snapstore.mix(...) Mixture or a snapstore.Snapshot, "
            f"found {type(mixture).__name__}"
        )
    if batch_size is not None and (isinstance(batch_size, bool) or operator.index(batch_size) < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if num_epochs is not None and (isinstance(num_epochs, bool) or num_epochs < 1):
        raise ValueError(f"num_epochs must be a positive integer or None, got {num_epochs!r}")
    if operator.index(epoch) < 0:
        raise ValueError(f"epoch must be >= 0, found {epoch}")
    read = reader_options(options, settings)
    if batch_size is None:
        if read.ragged != "list":
            raise ValueError(
                f"ragged={read.ragged!r} is a form of batches, but batch_size=None yields single "
                "samples (a varying-shape field as an array of its own shape); pass a batch_size "
                "or leave ragged unset"
            )
        if isinstance(mixture, Mixture) and mixture.homogeneous:
            raise ValueError(
                "batch_size=None reads single samples, but this mixture draws homogeneous "
                "batches, whose order depends on the batch size; pass a batch_size"
            )
    read = read.replace(shuffle=True if read.shuffle is None else read.shuffle)
    ds = _ReaderDataset(location, batch_size, read, epoch, num_epochs, (rank, world_size))
    ds.open(epoch).close()  # fail here on a bad argument
    return ds


class _ReaderDataset(grain.IterDataset):  # type: ignore[misc]
    """A ``grain.IterDataset`` of one consumer's share of epochs of a mixture or snapshot; made
    by :func:`mixture_dataset`, which documents it. Pickles as the sources' handles."""

    def __init__(
        self,
        location: SnapshotHandle | Mixture,
        batch_size: int | None,
        options: ReaderOptions,
        epoch: int,
        num_epochs: int | None,
        place: tuple[int, int],
    ) -> None:
        super().__init__()
        self.location, self.batch_size, self.options = location, batch_size, options
        self.first_epoch, self.num_epochs = operator.index(epoch), num_epochs
        self.rank, self.world_size = place
        self.worker, self.num_workers = 0, 1

    def open(self, epoch: int, batch_size: int | None = None) -> ConsumerReader:
        """A reader of epoch ``epoch`` (batches of ``batch_size``, default the dataset's)."""
        size = batch_size or self.batch_size or _SAMPLE_CHUNK
        return self.location.open().batches(
            size,
            self.options,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            worker=self.worker,
            num_workers=self.num_workers,
        )

    def reads(self, epoch: int) -> bool:
        """Whether ``epoch`` is one of the epochs this dataset reads."""
        last = None if self.num_epochs is None else self.first_epoch + self.num_epochs
        return epoch >= self.first_epoch and (last is None or epoch < last)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Read part ``sl.start`` of ``sl.step`` equal parts of this dataset's share.

        Grain's ``mp_prefetch`` gives its worker ``i`` of ``n`` the slice ``slice(i, None, n)``
        of a copy of the dataset; here each worker reads a contiguous part of the share, as
        DataLoader workers do (snapstore's ``worker``/``num_workers``).
        """
        del sequential_slice  # each part is contiguous already
        start, step = sl.start or 0, sl.step or 1
        if sl.stop is not None or not 0 <= start < step:
            raise ValueError(
                f"mixture_dataset: expected a slice(i, None, n) with 0 <= i < n (Grain's "
                f"slice for worker i of n), found {sl}"
            )
        self.worker, self.num_workers = self.worker * step + start, self.num_workers * step

    def __iter__(self) -> _ReaderIterator:
        return _ReaderIterator(self)

    def __str__(self) -> str:
        what = self.location
        name = repr(what) if isinstance(what, Mixture) else f"Snapshot({what.fingerprint!r})"
        return (
            f"mixture_dataset({name}, batch_size={self.batch_size}, "
            f"epoch={self.first_epoch}, num_epochs={self.num_epochs}, "
            f"rank={self.rank}/{self.world_size}, worker={self.worker}/{self.num_workers})"
        )


class _ReaderIterator(grain.DatasetIterator):  # type: ignore[misc]
    """The iterator of a :class:`_ReaderDataset`: its state is the reader's ``get_state()``
    with ``position`` counting the samples yielded."""

    def __init__(self, dataset: _ReaderDataset) -> None:
        super().__init__()
        self._ds = dataset
        self._position = 0
        self._elements: Generator[Any] | None = None
        self._reader = dataset.open(dataset.first_epoch)

    def __next__(self) -> Any:
        self._assert_not_closed()
        while True:
            if self._elements is None:
                self._elements = self._pass()
            try:
                return next(self._elements)
            except StopIteration:
                if not self._ds.reads(self._reader.epoch + 1):
                    raise
            self.close_pass()
            self._reader, self._position = self._ds.open(self._reader.epoch + 1), 0

    def _pass(self) -> Generator[Any]:
        """The rest of the current epoch, from ``_position``, counting what it yields."""
        reader = self._reader
        reader.set_state(self.get_state())
        if self._ds.batch_size is not None:
            with reader:
                for batch in reader:
                    self._position = reader.get_state()["position"]
                    yield batch
            return
        resized = functools.partial(self._ds.open, reader.epoch)
        for batch in every_batch(reader, resized):
            for sample in _split(batch, _rows(batch)):
                self._position += 1
                yield sample

    def get_state(self) -> dict[str, Any]:
        """Where this iterator is: the reader's state (a dict of integers)."""
        return {**self._reader.get_state(), "position": self._position}

    def set_state(self, state: dict[str, Any]) -> None:
        """Go on after ``state`` (from :meth:`get_state`) from the next element.

        Raises
        ------
        ResumeError
            If the state is malformed, for an epoch this dataset does not read, or for
            another mixture or snapshot, order or consumer.
        """
        epoch = state.get("epoch") if isinstance(state, dict) else None
        if not isinstance(epoch, int) or not self._ds.reads(epoch):
            raise ResumeError(
                "expected a state from this dataset's iterator's get_state(), for one of its "
                f"epochs (from {self._ds.first_epoch}, {self._ds.num_epochs} of them), found "
                f"{state!r:.200}"
            )
        reader = self._ds.open(epoch)
        reader.set_state(dict(state))  # ResumeError names what differs from this reader
        self.close_pass()
        self._reader, self._position = reader, int(state["position"])

    def close_pass(self) -> None:
        """Stop the current epoch's reading threads (the next element starts them again)."""
        if self._elements is not None:
            self._elements.close()  # its readers' `with` blocks end now, not when collected
        self._elements = None
        self._reader.close()

    def close(self) -> None:
        """Stop reading; a closed iterator yields nothing more."""
        self.close_pass()
        super().close()

    def __str__(self) -> str:
        return f"_ReaderIterator({self._ds}, state={self.get_state()})"


def _rows(batch: dict[str, Any]) -> int:
    """The number of samples in a batch (the length of its first column)."""
    first = next(iter(batch.values()))
    return _rows(first) if isinstance(first, dict) else len(first)


def _split(batch: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """A batch (of ``ragged="list"``) as its ``size`` samples, nested dicts included."""
    columns = {
        name: _split(value, size) if isinstance(value, dict) else value
        for name, value in batch.items()
    }
    return [{name: column[i] for name, column in columns.items()} for i in range(size)]
