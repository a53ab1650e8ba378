"""PyTorch Lightning: the trainer's epoch as the dataset's epoch.

Lightning calls ``set_epoch`` on a DataLoader's sampler, never on an iterable dataset. A
:class:`~snapstore.torch.SnapshotIterableDataset` needs no call to read a new order each epoch
(each pass is the next epoch), but after a restart from a checkpoint its count starts again at
0 while the trainer goes on from its epoch. :class:`SnapshotEpochs` sets the epoch of every
snapstore dataset in the trainer's training loaders to ``trainer.current_epoch`` when each
epoch starts, before Lightning starts the loader's workers, so epoch ``e`` of the trainer reads
epoch ``e`` of the snapshot, in a fresh run and after a restart alike.

Import this module only where Lightning is installed (``lightning`` or ``pytorch_lightning``).

>>> trainer = Trainer(callbacks=[SnapshotEpochs()], strategy="ddp")  # doctest: +SKIP
>>> trainer.fit(model, train_dataloaders=loader)                      # doctest: +SKIP
"""

from __future__ import annotations

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

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for dataset in snapshot_datasets(trainer.train_dataloader):
            dataset.set_epoch(trainer.current_epoch)
