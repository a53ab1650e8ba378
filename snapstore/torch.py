"""PyTorch datasets over a snapshot: an iterable one for DataLoader workers, a map-style one.

Import this module only where torch is installed (``pip install 'snapstore[torch]'``).

>>> from torch.utils.data import DataLoader                           # doctest: +SKIP
>>> from snapstore.torch import SnapshotIterableDataset               # doctest: +SKIP
>>> ds = SnapshotIterableDataset(snap, batch_size=256, seed=0)        # doctest: +SKIP
>>> loader = DataLoader(ds, batch_size=None, num_workers=4)           # doctest: +SKIP
>>> for epoch in range(3):                                            # doctest: +SKIP
...     ds.set_epoch(epoch)
...     for batch in loader: ...

Both datasets pickle to a few strings and integers (the store's location and the snapshot's
fingerprint) and open the snapshot lazily in the process that reads, so they work with the
``spawn`` start method and hold no open handles or shared memory while pickled.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

try:
    import torch
    import torch.distributed as dist
    from torch.utils.data import Dataset, IterableDataset, get_worker_info
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"snapstore.torch needs PyTorch ({exc}); pip install 'snapstore[torch]'"
    ) from exc

from .errors import ResumeError
from .handle import SnapshotHandle
from .read.batches import BatchReader
from .read.options import ReaderOptions, reader_options
from .snapshot import Snapshot
from .torch_ragged import (
    RaggedList,
    TorchRaggedForm,
    allocate_shared,
    arrays_to_list,
    from_packed,
    reader_form,
    share_batch,
    shared_tensor,
)
from .write.engines import usable_cores

__all__ = ["RaggedList", "SnapshotDataset", "SnapshotIterableDataset", "to_tensors"]

STATE_VERSION = 1


def _tensor(value: np.ndarray[Any, Any]) -> torch.Tensor:
    """``value`` as a tensor sharing its memory; a copy only if it is read-only.

    ``torch.from_numpy`` warns on a read-only array because the tensor would be writable.
    Shuffled batches from :class:`~snapstore.BatchReader` are gathered into fresh, writable
    arrays, so they are never copied; arrays gathered into a DataLoader worker's shared buffer
    become views of that buffer's tensor. Unshuffled batches (slices of a decoded block) and single
    samples (:class:`SnapshotDataset`) are read-only views into decoded blocks that a cache
    shares with later reads: writing through a tensor would corrupt them, so those are copied.
    """
    shared = shared_tensor(value)
    if shared is not None:  # gathered into a worker's shared buffer: stay a view of it
        return shared
    if not value.flags.writeable:
        value = value.copy()
    return torch.from_numpy(value)


def to_tensors(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A batch or sample dict with its numeric values as tensors.

    Parameters
    ----------
    sample : mapping
        A batch from :meth:`snapstore.Snapshot.batches` or a sample from ``snap[i]``.

    Returns
    -------
    dict
        Arrays, numpy scalars and Python ``int``/``float``/``bool`` as tensors (without a copy
        for writable arrays); lists of arrays (varying-shape fields) as a :class:`RaggedList`
        (tensors viewing one copy of the arrays, which crosses DataLoader workers as one
        buffer); nested dicts (of batch columns) converted alike; None, ``str``, ``bytes`` and
        lists of them unchanged.
    """
    out: dict[str, Any] = {}
    for name, value in sample.items():
        if isinstance(value, np.ndarray):
            out[name] = _tensor(value)
        elif isinstance(value, np.generic):
            out[name] = torch.from_numpy(np.array(value))
        elif isinstance(value, (bool, int, float)):
            out[name] = torch.tensor(value)
        elif isinstance(value, dict):  # a nested dict's batch columns
            out[name] = to_tensors(value)
        elif isinstance(value, list) and value:
            out[name] = _list_value(value)
        else:
            out[name] = value
    return out


def _list_value(value: list[Any]) -> Any:
    """A batch's list: arrays as a :class:`RaggedList`; arrays among None (the null rows of a
    nullable varying-shape field) as tensors and None; anything else (str, bytes) unchanged."""
    arrays = [a for a in value if a is not None]
    if not arrays or not isinstance(arrays[0], np.ndarray):
        return value
    if len(arrays) == len(value):
        return arrays_to_list(value)
    return [None if a is None else _tensor(a) for a in value]


def _place(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's (rank, world_size): torch.distributed's, else the arguments, else (0, 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass both rank and world_size or neither, found rank={rank}, world_size={world_size}"
        )
    if dist.is_available() and dist.is_initialized():
        found = (dist.get_rank(), dist.get_world_size())
        if rank is not None and (rank, world_size) != found:
            raise ValueError(
                f"rank={rank}, world_size={world_size} disagree with torch.distributed "
                f"(rank {found[0]} of {found[1]}); leave them out to use torch.distributed's"
            )
        return found
    if rank is None or world_size is None:
        return 0, 1
    return operator.index(rank), operator.index(world_size)


class SnapshotIterableDataset(IterableDataset[dict[str, Any]]):
    """Batches of a snapshot for ``DataLoader(ds, batch_size=None, num_workers=N)``.

    Each DataLoader worker of each rank reads its own share of every epoch (consumer
    ``rank * num_workers + worker`` of ``world_size * num_workers``, see
    :meth:`snapstore.Snapshot.batches`): every worker of every rank yields the same number of
    batches, together covering the epoch once (with ``drop_last=False`` a few samples are
    repeated to even the shares, and each worker's last batch may be short). Batches are dicts
    of tensors made by :func:`to_tensors`, which shares the batch's memory.

    Parameters
    ----------
    snapshot_or_fingerprint : Snapshot or str
        A snapshot (materialized here if needed) or a fingerprint (or unique prefix) to open
        under ``root``.
    root : str, PathLike or Store, optional
        Where to find a fingerprint; as for :func:`snapstore.open`.
    batch_size : int
        Samples per batch.
    options : ReaderOptions, optional
        How to read (:class:`snapstore.ReaderOptions`); ``shuffle`` defaults to True here.
    rank, world_size : int, optional
        This process's place among the ranks. By default ``torch.distributed``'s when it is
        initialized, otherwise 0 of 1.
    ragged : {"list", "nested", "packed", "pad"}
        The form of varying-shape array fields. ``"list"`` (default): a :class:`RaggedList`,
        a list of tensors viewing one buffer. ``"nested"``: a ``torch.nested`` tensor, jagged
        layout where only the first dimension varies, strided layout otherwise. ``"packed"``:
        the values in one flat tensor with ``<name>_offsets`` (and ``<name>_shapes`` for fields
        of more than one dimension), as :meth:`snapstore.Snapshot.batches` gives them.
        ``"pad"``: zero-padded, with ``<name>_lengths``. Every form crosses from DataLoader
        workers as one buffer per field, not one per sample. Default: ``options.ragged``
        (``"list"`` unless set).
    **settings
        Any field of :class:`snapstore.ReaderOptions` as a keyword (``shuffle``, ``seed``,
        ``drop_last``, ``window_bytes``, ``prefetch_bytes``, ``decode_threads``...),
        overriding ``options``'s. The reader memory bound applies per worker. Inside
        DataLoader workers ``decode_threads`` defaults to the worker's share of the CPUs (at
        least 1, at most 4), so decoding does not steal the cores the workers' transforms run
        on.

    Notes
    -----
    **Epochs.** Call :meth:`set_epoch` before each epoch. Workers started anew for each epoch
    (the default) receive the new epoch with their copy of the dataset. Persistent workers
    (``persistent_workers=True``) keep the copy they started with and cannot see
    :meth:`set_epoch`; each of them moves to the next epoch at every pass after its first,
    which matches calling ``set_epoch(first + i)`` before pass ``i``.

    **Resuming.** :meth:`state_dict` and :meth:`load_state_dict` follow the protocol of
    ``torchdata.stateful_dataloader.StatefulDataLoader``, which calls them inside each worker:
    a worker's state is its reader's position (:meth:`snapstore.BatchReader.get_state`, a dict
    of integers holding the epoch). A loader restored from ``StatefulDataLoader.state_dict()``
    with the same dataset settings, ranks and workers yields exactly the batches the
    interrupted run had left, in the same order.

    Examples
    --------
    >>> from torchdata.stateful_dataloader import StatefulDataLoader     # doctest: +SKIP
    >>> loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)  # doctest: +SKIP
    >>> state = loader.state_dict()  # after some batches, with the model's state
    >>> loader.load_state_dict(state)  # in a new process, then iterate   # doctest: +SKIP
    """

    def __init__(
        self,
        snapshot_or_fingerprint: Snapshot | str,
        root: Any = None,
        *,
        batch_size: int,
        options: ReaderOptions | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        ragged: TorchRaggedForm | None = None,
        **settings: Any,
    ) -> None:
        read = reader_options(options, settings)
        self._location = SnapshotHandle.of(snapshot_or_fingerprint, root, "DataLoader workers")
        self.rank, self.world_size = _place(rank, world_size)
        self.epoch = 0
        form: Any = read.ragged if ragged is None else ragged  # the reader's forms are torch's
        self.ragged: TorchRaggedForm = form
        shuffle = True if read.shuffle is None else read.shuffle
        self._options = read.replace(shuffle=shuffle, ragged=reader_form(form))
        self._batch_size = batch_size
        self._reader: BatchReader | None = None
        self._reader_pid = os.getpid()
        self._pending: dict[str, int] | None = None
        # Fail here, not in a worker, on a bad argument.
        self._make_reader(0, 0, 1).close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # its threads and caches stay in this process
        return state

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` from the next pass on (see Notes on persistent workers)."""
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ValueError(f"set_epoch: expected an epoch >= 0, found {epoch}")
        self.epoch = epoch
        self._pending = None

    def _make_reader(self, epoch: int, worker: int, num_workers: int) -> BatchReader:
        snap = self._location.open()
        options = self._options
        if get_worker_info() is not None and options.decode_threads is None:
            # The workers share the cores with each other and with the training process:
            # decode threads beyond a worker's share of them only steal time from its transform.
            options = options.replace(decode_threads=max(1, min(4, usable_cores() // num_workers)))
        return snap.batches(
            self._batch_size,
            options,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            worker=worker,
            num_workers=num_workers,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        previous, self._reader = self._reader, None
        if self._reader_pid != os.getpid():
            # Forked from a process that had read: that reader (its threads, its epoch) is the
            # parent's, neither this worker's previous pass nor ours to close.
            previous, self._reader_pid = None, os.getpid()
        epoch = self.epoch
        if self._pending is not None:
            epoch = self._pending["epoch"]
        elif previous is not None and info is not None:
            epoch = previous.epoch + 1  # a persistent worker's next pass (see Notes)
        if previous is not None:
            previous.close()
        reader = self._make_reader(epoch, worker, num_workers)
        if self._pending is not None:
            pending, self._pending = self._pending, None
            if "position" in pending:
                reader.set_state(pending)
        self._reader = reader
        return self._batches(reader)

    def _batches(self, reader: BatchReader) -> Iterator[dict[str, Any]]:
        schema, form = reader.reader.schema, self.ragged
        in_worker = get_worker_info() is not None
        if in_worker:
            # Each batch is gathered straight into one shared-memory buffer: the main process
            # fetches one file descriptor, not one per tensor, and nothing is copied again on
            # the way (share_batch then finds nothing to do).
            reader.allocate = allocate_shared
        for batch in reader:
            tensors = from_packed(to_tensors(batch), schema, form)
            yield share_batch(tensors) if in_worker else tensors

    def state_dict(self) -> dict[str, int]:
        """This worker's position: its reader's ``get_state()``, or the epoch before a pass.

        Returns
        -------
        dict of str to int
            ``BatchReader.get_state()`` (``epoch``, ``position`` and what they are valid for)
            plus ``dataset_version``; only ``epoch`` and ``dataset_version`` before the first
            pass.
        """
        if self._reader is not None:
            return {"dataset_version": STATE_VERSION, **self._reader.get_state()}
        if self._pending is not None:
            return dict(self._pending)
        return {"dataset_version": STATE_VERSION, "epoch": self.epoch}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next pass.

        Raises
        ------
        ResumeError
            If the state is not one :meth:`state_dict` returns. A state for another snapshot,
            order or partition raises when the pass starts (see
            :meth:`snapstore.BatchReader.set_state`).
        """
        if not isinstance(state, Mapping) or state.get("dataset_version") != STATE_VERSION:
            raise ResumeError(
                f"expected a state from SnapshotIterableDataset.state_dict() with "
                f"dataset_version {STATE_VERSION}, found {state!r:.200}"
            )
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ResumeError(f"resume state epoch must be an int >= 0, found {epoch!r}")
        self._pending = {k: v for k, v in state.items() if k != "dataset_version"}


class SnapshotDataset(Dataset[dict[str, Any]]):
    """A snapshot as a map-style dataset, for torch samplers: ``ds[i]`` is sample ``i``.

    Samples come back as dicts of tensors (:func:`to_tensors`; arrays are copied, as they are
    read-only views into a shared decoded block). Random access decodes the block holding each
    sample through a small cache of recently decoded blocks (8 per process), so a random
    sampler decodes about one block per sample: far slower than
    :class:`SnapshotIterableDataset`, which reads whole blocks in a shuffle window. Use this
    one when a sampler must choose the samples.

    Parameters
    ----------
    snapshot_or_fingerprint : Snapshot or str
        A snapshot (materialized here if needed) or a fingerprint to open under ``root``.
    root : str, PathLike or Store, optional
        Where to find a fingerprint; as for :func:`snapstore.open`.
    """

    def __init__(self, snapshot_or_fingerprint: Snapshot | str, root: Any = None) -> None:
        self._location = SnapshotHandle.of(snapshot_or_fingerprint, root, "DataLoader workers")
        self._len = len(self._location.open())

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, Any]:
        return to_tensors(self._location.open()[index])
