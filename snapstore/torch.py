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

import logging
import operator
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
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

from . import tracing
from .errors import ResumeError
from .handle import SnapshotHandle
from .mix import Mixture
from .read.batches import BatchReader
from .read.mixed import MixedBatchReader
from .read.options import ReaderOptions, reader_options
from .snapshot import Snapshot
from .torch_accelerate import AccelerateSplit, accelerate_split
from .torch_device import to_device
from .torch_passes import PassCounter, hash_ints, pass_token
from .torch_pool import allocate_pooled
from .torch_ragged import (
    RaggedList,
    TorchRaggedForm,
    arrays_to_list,
    from_packed,
    reader_form,
    share_batch,
    shared_tensor,
)
from .write.engines import usable_cores

__all__ = ["RaggedList", "SnapshotDataset", "SnapshotIterableDataset", "to_device", "to_tensors"]

STATE_VERSION = 1

log = logging.getLogger(__name__)

# torchdata 0.11 (the newest) calls torch.set_vital, a deprecated no-op, in every
# StatefulDataLoader it makes, and torch warns each time. Only that warning, attributed to
# torchdata's module, is silenced.
warnings.filterwarnings(
    "ignore",
    message="'set_vital' is deprecated",
    category=UserWarning,
    module=r"torchdata\.stateful_dataloader",
)


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


def _explicit_place(rank: int | None, world_size: int | None) -> tuple[int, int] | None:
    """``(rank, world_size)`` as the user gave them, checked; None when left out."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"pass both rank and world_size or neither, found rank={rank}, world_size={world_size}"
        )
    if rank is None or world_size is None:
        return None
    rank, world_size = operator.index(rank), operator.index(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"expected 0 <= rank < world_size, found rank={rank} of {world_size}")
    return rank, world_size


def _distributed() -> tuple[int, int] | None:
    """torch.distributed's (rank, world_size) in this process, if its group is initialized."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _place(
    explicit: tuple[int, int] | None,
    *,
    inherited: tuple[int, int] | None = None,
    quiet: bool = False,
) -> tuple[int, int]:
    """This process's (rank, world_size) now: torch.distributed's when it is initialized (and
    then ``explicit`` must agree), else ``explicit``, else what the process that sent the
    dataset here read from its torch.distributed (``inherited``: a worker started by ``spawn``
    has no process group of its own), else (0, 1)."""
    found = _distributed() or inherited
    if found is not None:
        if explicit is not None and explicit != found:
            raise ValueError(
                f"rank={explicit[0]}, world_size={explicit[1]} disagree with torch.distributed "
                f"(rank {found[0]} of {found[1]}); leave them out to use torch.distributed's"
            )
        return found
    if explicit is not None:
        return explicit
    if not quiet:
        _warn_undistributed()
    return 0, 1


_warned_env = False


def _warn_undistributed() -> None:
    """Warn, once, when a launcher says there are several ranks but torch.distributed is not
    initialized: every process would read the whole epoch."""
    global _warned_env
    size = os.environ.get("WORLD_SIZE", "1")
    if _warned_env or not size.isdigit() or int(size) <= 1:
        return
    _warned_env = True
    log.warning(
        "WORLD_SIZE=%s in the environment, but torch.distributed is not initialized when the "
        "pass starts: this process reads the whole epoch as rank 0 of 1. Initialize the process "
        "group before iterating (Lightning, Accelerate and torchrun scripts that call "
        "init_process_group do), or pass rank= and world_size=",
        size,
    )


def _transform_seed(*parts: int) -> int:
    """A 63-bit seed from the integers that identify one batch of one consumer."""
    return hash_ints(*parts) >> 1


def _unbatch(batch: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """A batch of tensors as ``size`` samples (views, no copies)."""
    return [
        {name: value[i] if _indexable(value, size) else value for name, value in batch.items()}
        for i in range(size)
    ]


def _indexable(value: Any, size: int) -> bool:
    return isinstance(value, (torch.Tensor, list)) and len(value) == size


def _restack(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples back as one batch: tensors of one shape stacked, others as a list (tensors of
    varying shapes as a :class:`RaggedList`)."""
    out: dict[str, Any] = {}
    for name in samples[0]:
        column = [sample[name] for sample in samples]
        first = column[0]
        if isinstance(first, torch.Tensor) and all(
            isinstance(t, torch.Tensor) and t.shape == first.shape and t.dtype == first.dtype
            for t in column
        ):
            out[name] = torch.stack(column)
        elif all(isinstance(t, torch.Tensor) for t in column):
            out[name] = RaggedList.from_tensors(column)
        else:
            out[name] = column
    return out


Transform = Callable[[dict[str, Any]], dict[str, Any]]


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
    snapshot_or_fingerprint : Snapshot, Mixture or str
        A snapshot (materialized here if needed), a :func:`snapstore.mix` mixture, or a
        fingerprint (or unique prefix) to open under ``root``.
    root : str, PathLike or Store, optional
        Where to find a fingerprint; as for :func:`snapstore.open`.
    batch_size : int
        Samples per batch (with ``per_sample=True``: samples read at a time).
    options : ReaderOptions, optional
        How to read (:class:`snapstore.ReaderOptions`); ``shuffle`` defaults to True here.
    rank, world_size : int, optional
        This process's place among the ranks. By default it is read when each pass starts, in
        the process that reads: ``torch.distributed``'s rank and world size if the process
        group is initialized by then, otherwise 0 of 1. So a dataset made before the process
        group exists (a DataLoader built before ``trainer.fit``) reads its rank's share. Given,
        they must agree with ``torch.distributed``'s when it is initialized.
    ragged : {"list", "nested", "packed", "pad"}
        The form of varying-shape array fields. ``"list"`` (default): a :class:`RaggedList`,
        a list of tensors viewing one buffer. ``"nested"``: a ``torch.nested`` tensor, jagged
        layout where only the first dimension varies, strided layout otherwise. ``"packed"``:
        the values in one flat tensor with ``<name>_offsets`` (and ``<name>_shapes`` for fields
        of more than one dimension), as :meth:`snapstore.Snapshot.batches` gives them.
        ``"pad"``: zero-padded, with ``<name>_lengths``. Every form crosses from DataLoader
        workers as one buffer per field, not one per sample. Default: ``options.ragged``
        (``"list"`` unless set).
    transform : callable, optional
        ``transform(batch) -> batch``, run on each batch (a dict of tensors) in the process
        that reads it (the DataLoader worker), after the batch is assembled and before it is
        sent. Random augmentations drawn from torch's generator (``torch.rand``, torchvision
        transforms) are reproducible: the generator is seeded for each batch from (``seed``,
        epoch, rank, worker, the batch's place in the pass), so a resumed pass draws what the
        interrupted one would have, and torch's generator is restored afterwards.
    sample_transform : callable, optional
        ``sample_transform(sample) -> sample``, run on each sample of a batch (a dict of
        tensors, views into the batch), seeded as ``transform`` is, before ``transform``; the
        samples are stacked back into a batch (tensors of varying shapes as a
        :class:`RaggedList`).
    per_sample : bool
        Yield samples one at a time instead of batches, for a DataLoader that makes batches
        itself (``DataLoader(ds, batch_size=16)``, as Hugging Face Trainer builds it). Reading
        is still done ``batch_size`` samples at a time.
    **settings
        Any field of :class:`snapstore.ReaderOptions` as a keyword (``shuffle``, ``seed``,
        ``drop_last``, ``window_bytes``, ``prefetch_bytes``, ``decode_threads``...),
        overriding ``options``'s. The reader memory bound applies per worker. Inside
        DataLoader workers ``decode_threads`` defaults to the worker's share of the CPUs (at
        least 1, at most 4), so decoding does not steal the cores the workers' transforms run
        on.

    Notes
    -----
    **Epochs.** Each pass of a DataLoader over the dataset reads the next epoch: 0, 1, 2...
    :meth:`set_epoch` chooses the epoch of the next pass (and the count goes on from there).
    The rule is the same with ``num_workers=0``, with workers started for each pass and with
    ``persistent_workers=True``: the count lives in a few bytes of shared memory that the
    workers share with the dataset. Frameworks that call ``set_epoch`` (HF Trainer and
    Accelerate) and those that do not (Lightning: see :mod:`snapstore.lightning`) both get
    a new order each epoch.

    **Hugging Face Accelerate.** A loader prepared by ``accelerator.prepare`` is split once:
    with batches dispatched from process 0 (Accelerate's default for iterable datasets) the
    dataset reads the whole epoch on process 0 and nothing on the others; with
    ``dispatch_batches=False`` each process reads its own share and Accelerate's wrapper passes
    it through (see :mod:`snapstore.torch_accelerate`).

    **Resuming.** :meth:`state_dict` and :meth:`load_state_dict` follow the protocol of
    ``torchdata.stateful_dataloader.StatefulDataLoader``, which calls them inside each worker:
    a worker's state is its reader's position (:meth:`snapstore.BatchReader.get_state`, a dict
    of integers holding the epoch). A loader restored from ``StatefulDataLoader.state_dict()``
    with the same dataset settings, ranks and workers yields exactly the batches the
    interrupted run had left, in the same order, with the same random transforms.

    Examples
    --------
    >>> from torchdata.stateful_dataloader import StatefulDataLoader     # doctest: +SKIP
    >>> loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)  # doctest: +SKIP
    >>> state = loader.state_dict()  # after some batches, with the model's state
    >>> loader.load_state_dict(state)  # in a new process, then iterate   # doctest: +SKIP
    """

    def __init__(
        self,
        snapshot_or_fingerprint: Snapshot | Mixture | str,
        root: Any = None,
        *,
        batch_size: int,
        options: ReaderOptions | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        ragged: TorchRaggedForm | None = None,
        transform: Transform | None = None,
        sample_transform: Transform | None = None,
        per_sample: bool = False,
        **settings: Any,
    ) -> None:
        read = reader_options(options, settings)
        for name, fn in (("transform", transform), ("sample_transform", sample_transform)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name}: expected a callable, found {type(fn).__name__}")
        # A Mixture opens its own sources in each process (it pickles as their handles).
        self._location: SnapshotHandle | Mixture = (
            snapshot_or_fingerprint
            if isinstance(snapshot_or_fingerprint, Mixture)
            else SnapshotHandle.of(snapshot_or_fingerprint, root, "DataLoader workers")
        )
        self._explicit = _explicit_place(rank, world_size)
        self._inherited: tuple[int, int] | None = None
        if self._explicit is not None:
            _place(self._explicit)  # a disagreement with torch.distributed fails here already
        form: Any = read.ragged if ragged is None else ragged  # the reader's forms are torch's
        self.ragged: TorchRaggedForm = form
        shuffle = True if read.shuffle is None else read.shuffle
        self._options = read.replace(shuffle=shuffle, ragged=reader_form(form))
        self._batch_size = batch_size
        self.transform, self.sample_transform = transform, sample_transform
        self.per_sample = bool(per_sample)
        self._passes = PassCounter()
        self._split: AccelerateSplit | None = None
        self._passes_here = 0  # passes started by this copy, in this process
        self._reader: BatchReader | MixedBatchReader | None = None
        self._reader_pid = os.getpid()
        self._pending: dict[str, int] | None = None
        # per_sample, mid-way through a read batch: the state before it, with "sample", the
        # number of its samples yielded (None between batches: the reader's state says it).
        self._sample: dict[str, int] | None = None
        # Fail here, not in a worker, on a bad argument.
        self._make_reader(0, 0, 1, 0, 1).close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # its threads and caches stay in this process
        state["_passes_here"] = 0
        # Sent to a DataLoader worker as the pass starts: a spawned worker has no process
        # group, so it takes the rank its parent has now.
        state["_inherited"] = _distributed() or self._inherited
        return state

    @property
    def rank(self) -> int:
        """This process's rank, as a pass starting now would read it."""
        return _place(self._explicit, inherited=self._inherited, quiet=True)[0]

    @property
    def world_size(self) -> int:
        """The number of ranks, as a pass starting now would read it."""
        return _place(self._explicit, inherited=self._inherited, quiet=True)[1]

    @property
    def epoch(self) -> int:
        """The epoch the next pass will read (of this process's rank)."""
        return self._passes.next_epoch(self.rank)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` at the next pass; later passes go on from it (see Notes).

        Workers see it whether they are started for each pass or persistent.
        """
        epoch = operator.index(epoch)
        if epoch < 0:
            raise ValueError(f"set_epoch: expected an epoch >= 0, found {epoch}")
        self._passes.request(epoch)
        self._pending = None
        # Accelerate calls set_epoch as its prepared loader's pass starts, before the workers.
        self._split = accelerate_split(self)

    def _make_reader(
        self, epoch: int, rank: int, world_size: int, worker: int, num_workers: int
    ) -> BatchReader | MixedBatchReader:
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
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
        )

    def _pass_token(self) -> int:
        """Equal in every worker of one pass, different from the previous pass's."""
        info = get_worker_info()
        self._passes_here += 1
        if info is None:
            return pass_token(os.getpid(), id(self), self._passes_here)
        return pass_token(info.seed - info.id, os.getppid(), self._passes_here)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        previous, self._reader = self._reader, None
        if self._reader_pid != os.getpid():
            # Forked from a process that had read: that reader (its threads, its epoch) is the
            # parent's, neither this worker's previous pass nor ours to close.
            previous, self._reader_pid, self._passes_here = None, os.getpid(), 0
        if previous is not None:
            previous.close()
        rank, world_size = _place(self._explicit, inherited=self._inherited)
        split = self._split if self._explicit is None else None
        if info is None and split is None and self._explicit is None:
            split = accelerate_split(self)  # num_workers=0: the loader is iterating us now
        pending, self._pending = self._pending, None
        epoch = self._passes.start(
            self._pass_token(), rank, None if pending is None else pending["epoch"]
        )
        if split == "dispatch":
            if rank != 0:  # Accelerate sends these ranks their slices from process 0
                return iter(())
            rank, world_size = 0, 1
        if tracing.enabled():  # each consumer its own track group, in consumer order
            label = f"rank {rank}" if info is None else f"rank {rank} worker {worker}"
            tracing.label_process(label, sort_index=rank * num_workers + worker)
        reader = self._make_reader(epoch, rank, world_size, worker, num_workers)
        skip = 0 if pending is None else pending.pop("sample", 0)
        if pending is not None and "position" in pending:
            reader.set_state(pending)
        self._reader, self._sample = reader, None
        return self._batches(reader, (rank, worker), dispatched=split == "dispatch", skip=skip)

    def _batches(
        self,
        reader: BatchReader | MixedBatchReader,
        consumer: tuple[int, int],
        *,
        dispatched: bool = False,
        skip: int = 0,
    ) -> Iterator[dict[str, Any]]:
        schema, form = reader.reader.schema, self.ragged
        in_worker = get_worker_info() is not None
        if in_worker:
            # Each batch is gathered straight into a lease of the worker's pool of shared-memory
            # segments, recycled across batches (snapstore.torch_pool); share_batch then wraps
            # it, and it travels as its place in the pool, without another copy.
            reader.allocate = allocate_pooled
        transformed = self.transform is not None or self.sample_transform is not None
        before = reader.get_state() if self.per_sample else None
        for batch in reader:
            tensors = from_packed(to_tensors(batch), schema, form)
            if transformed:
                place = reader.get_state()
                index = (place["position"] - 1) // self._batch_size
                tensors = self._transform(tensors, (place["epoch"], *consumer, index))
            if self.per_sample:
                yield from self._samples(tensors, before, skip)
                skip, before = 0, reader.get_state()
                continue
            if dispatched:  # every batch has the fields of the first
                _check_dispatchable(tensors, form)
                dispatched = False
            yield share_batch(tensors) if in_worker else tensors

    def _samples(self, batch: dict[str, Any], before: Any, skip: int) -> Iterator[dict[str, Any]]:
        """A batch's samples from the ``skip``-th on, keeping in ``_sample`` where a resumed
        pass must go on: a state taken between two samples of one read batch reads that batch
        again (same samples, same transform draws) and skips those already yielded."""
        samples = _unbatch(batch, _batch_length(batch, 0))
        for k in range(skip, len(samples)):
            self._sample = None if k + 1 == len(samples) else {**before, "sample": k + 1}
            yield samples[k]

    def _transform(self, batch: dict[str, Any], where: tuple[int, ...]) -> dict[str, Any]:
        """The transforms on one batch, with torch's generator seeded for it, then restored."""
        seed = self._options.seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_transform_seed(seed, *where))
            if self.sample_transform is not None:
                size = _batch_length(batch, 0)
                batch = _restack([self.sample_transform(s) for s in _unbatch(batch, size)])
            if self.transform is not None:
                batch = self.transform(batch)
        if not isinstance(batch, dict):
            raise TypeError(
                f"transform: expected it to return a dict, found {type(batch).__name__}"
            )
        return batch

    def state_dict(self) -> dict[str, int]:
        """This worker's position: its reader's ``get_state()``, or the epoch before a pass.

        Returns
        -------
        dict of str to int
            ``BatchReader.get_state()`` (``epoch``, ``position`` and what they are valid for)
            plus ``dataset_version``; only ``epoch`` and ``dataset_version`` before the first
            pass. With ``per_sample=True``, between two samples of one read batch: the state
            before that batch, plus ``sample``, the number of its samples already yielded.
        """
        if self._sample is not None:
            return {"dataset_version": STATE_VERSION, **self._sample}
        if self._reader is not None:
            return {"dataset_version": STATE_VERSION, **self._reader.get_state()}
        if self._pending is not None:
            return {"dataset_version": STATE_VERSION, **self._pending}
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
        sample = state.get("sample", 0)
        if not isinstance(sample, int) or sample < 0 or (sample and not self.per_sample):
            raise ResumeError(
                f"resume state sample must be an int >= 0, and 0 unless per_sample=True (it "
                f"counts the samples of a read batch yielded), found {sample!r} with "
                f"per_sample={self.per_sample}"
            )
        self._pending = {k: v for k, v in state.items() if k != "dataset_version"}


def _check_dispatchable(batch: Mapping[str, Any], form: str) -> None:
    """Refuse a batch with a varying-shape field when Accelerate dispatches batches.

    Accelerate's dispatcher concatenates one batch per process along the first dimension and
    slices the result: a list of tensors fails there with a TypeError that does not say why, a
    nested tensor with a message about batch sizes, and packed values are sliced as if they
    were rows, silently wrong. Padded fields pass (Accelerate fails when widths differ).
    """
    for name, value in batch.items():
        if isinstance(value, Mapping):
            _check_dispatchable(value, form)
            continue
        listed = isinstance(value, list) and any(isinstance(v, torch.Tensor) for v in value)
        nested = isinstance(value, torch.Tensor) and value.is_nested
        packed = isinstance(value, torch.Tensor) and f"{name}_offsets" in batch
        if listed or nested or packed:
            raise ValueError(
                f"Accelerate dispatches this loader's batches (dispatch_batches, its default "
                f"for iterable datasets): process 0 concatenates one batch per process and "
                f"slices the result, which a varying-shape field does not survive; found field "
                f"{name!r} (ragged={form!r}). Pass Accelerator(dataloader_config="
                f"DataLoaderConfiguration(dispatch_batches=False)) (HF Trainer: "
                f"TrainingArguments(accelerator_config={{'dispatch_batches': False}})) so that "
                f"each process reads its own share, or make the field fixed-shape in transform="
            )


def _batch_length(batch: Mapping[str, Any], default: int) -> int:
    """The number of samples in a batch of tensors (its first tensor's or list's length)."""
    for value in batch.values():
        if isinstance(value, (torch.Tensor, list)):
            return len(value)
    return default


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
