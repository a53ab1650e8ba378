"""PyTorch Lightning: the trainer's epoch as the dataset's epoch.

Lightning calls ``set_epoch`` on a DataLoader's sampler, never on an iterable dataset. A
:class:`~snapstore.torch.SnapshotIterableDataset` needs no call to read a new order each epoch
(each pass is the next epoch), but after a restart from a checkpoint its count starts again at
0 while the trainer goes on from its epoch. :class:`SnapshotEpochs` sets the epoch of every
snapstore dataset in the trainer's training loaders to ``trainer.current_epoch`` when each
epoch starts, so epoch ``e`` of the trainer reads epoch ``e`` of the snapshot, in a fresh run
and after a restart alike.

Lightning starts the first pass of a ``fit`` (its fit loop's ``setup_data`` makes the iterator,
and fetches a batch) before any hook sees the epoch restored from a checkpoint, and calls no
``on_train_epoch_start`` for an epoch resumed mid-way. So in a ``fit`` resumed from a
checkpoint, :class:`SnapshotEpochs` sets the epoch at ``on_train_start`` and has Lightning's
fetcher start that pass again; except when the epoch is resumed mid-way from a loader's saved
state (a ``StatefulDataLoader``), which holds the epoch and the position in it.

Import this module only where Lightning is installed (``lightning`` or ``pytorch_lightning``).

>>> trainer = Trainer(callbacks=[SnapshotEpochs()], strategy="ddp")  # doctest: +SKIP
>>> trainer.fit(model, train_dataloaders=loader)                      # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as exc:
        raise ImportError(
            f"snapstore.lightning needs PyTorch Lightning ({exc}); "
            "pip install lightning (or pytorch-lightning)"
        ) from exc

from .torch import SnapshotIterableDataset

__all__ = ["SnapshotEpochs", "snapshot_datasets"]

log = logging.getLogger(__name__)


def snapshot_datasets(loaders: Any) -> Iterator[SnapshotIterableDataset]:
    """The :class:`SnapshotIterableDataset`\\ s in ``loaders``: a DataLoader, Lightning's
    CombinedLoader, or lists, tuples and dicts of them, looking through wrappers that keep the
    dataset they wrap as ``.dataset`` (Accelerate's shards, torch's Subset-like wrappers)."""
    seen: set[int] = set()
    stack = [loaders]
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, SnapshotIterableDataset):
            yield obj
        elif isinstance(obj, Mapping):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        else:
            stack.extend(getattr(obj, name, None) for name in ("flattened", "dataset"))


class SnapshotEpochs(Callback):  # type: ignore[misc]
    """Sets each snapstore dataset's epoch to the trainer's at the start of every epoch.

    Add it to the trainer's callbacks. It finds the datasets in ``trainer.train_dataloader``
    (a DataLoader passed to ``fit``, returned by the module's or DataModule's
    ``train_dataloader``, or several of them) and calls ``set_epoch(trainer.current_epoch)`` on
    each.
    """

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Resumed from a checkpoint, the pass Lightning started in setup_data read the fresh
        # dataset's count (or a finished loader state's), not the restored epoch: see the
        # module's docstring.
        if trainer.ckpt_path is None:
            return
        datasets = list(snapshot_datasets(trainer.train_dataloader))
        if not datasets:
            return
        if trainer.fit_loop.restarted_mid_epoch and _stateful(trainer.train_dataloader):
            return  # the restored loader state holds the epoch and the position in it
        for dataset in datasets:
            dataset.set_epoch(trainer.current_epoch)
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        if fetcher is None:  # pragma: no cover - a Lightning release without it
            log.warning(
                "SnapshotEpochs: this Lightning release has no fit_loop._data_fetcher, so the "
                "first epoch after resuming (epoch %d) reads the dataset's own count, not the "
                "trainer's epoch; later epochs read the trainer's",
                trainer.current_epoch,
            )
            return
        iter(fetcher)  # start the pass again, at the epoch just set

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for dataset in snapshot_datasets(trainer.train_dataloader):
            dataset.set_epoch(trainer.current_epoch)


def _stateful(loaders: Any) -> bool:
    """Whether any loader in ``loaders`` restores its position (``load_state_dict``)."""
    if isinstance(loaders, Mapping):
        return any(_stateful(v) for v in loaders.values())
    if isinstance(loaders, (list, tuple)):
        return any(_stateful(v) for v in loaders)
    return callable(getattr(loaders, "load_state_dict", None))
