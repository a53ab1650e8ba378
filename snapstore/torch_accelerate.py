"""How Hugging Face Accelerate splits a dataset across processes, seen from the dataset.

``accelerator.prepare(loader)`` (and HF Trainer, which calls it) splits an iterable dataset in
one of two ways:

- ``dispatch_batches=True`` (Accelerate's default for iterable datasets): process 0 alone
  iterates the loader, concatenates one batch per process and sends each process its slice. The
  dataset on process 0 must then read the whole epoch, and the others need read nothing.
- ``dispatch_batches=False``: every process iterates the dataset wrapped in Accelerate's
  ``IterableDatasetShard``, which groups ``batch_size x processes`` items and keeps its slice.
  With ``DataLoader(batch_size=None)`` (whole batches from the dataset) that wrapper fails
  (it multiplies the ``None``), and with a batch size it makes every process read everything.

:class:`snapstore.torch.SnapshotIterableDataset` splits an epoch across ranks itself, evenly
and without reading what another rank reads, so :func:`accelerate_split` tells it which case
holds: ``"dispatch"`` (read the whole epoch on process 0, nothing elsewhere) or ``"shard"``
(read this rank's share; the wrapper is set to pass every item through, so nothing is read
twice and ``batch_size=None`` works). It looks at the loaders Accelerate is iterating now
(``GradientState``'s references, set when a prepared loader's pass starts, before it calls
``set_epoch`` and starts its workers), and never imports Accelerate itself.

With ``use_stateful_dataloader=True`` the workers may be older than the pass: Accelerate asks
the StatefulDataLoader for its state as it prepares the loader, and the StatefulDataLoader
answers by starting its workers, with copies of the shard wrapper and the dataset made before
either was set. Those workers are stopped and the pass starts new ones (:func:`_restart_workers`).
"""

from __future__ import annotations

import sys
from typing import Any, Literal

__all__ = ["AccelerateSplit", "accelerate_split"]

AccelerateSplit = Literal["dispatch", "shard"]


def _active_loaders() -> list[Any]:
    """The loaders Accelerate is iterating in this process, most recent last."""
    state = sys.modules.get("accelerate.state")
    if state is None:
        return []
    shared = getattr(getattr(state, "GradientState", None), "_shared_state", None)
    refs = shared.get("_dataloader_references_ref") if isinstance(shared, dict) else None
    loaders = []
    for ref in refs or []:
        loader = ref() if callable(ref) else None
        if loader is not None:
            loaders.append(loader)
    return loaders


def accelerate_split(dataset: Any) -> AccelerateSplit | None:
    """How the Accelerate loader now iterating ``dataset`` splits it, or None if none does.

    For ``"shard"``, Accelerate's ``IterableDatasetShard`` around ``dataset`` is set to pass
    every item through (one process of batch size 1), so that ``dataset``'s own split by rank
    is the only one.
    """
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return None
    dispatcher = getattr(module, "DataLoaderDispatcher", None)
    shard_type = getattr(module, "IterableDatasetShard", None)
    for loader in reversed(_active_loaders()):
        inner = getattr(loader, "dataset", None)
        if inner is dataset and dispatcher is not None and isinstance(loader, dispatcher):
            _restart_workers(loader)
            return "dispatch"
        if shard_type is not None and isinstance(inner, shard_type) and inner.dataset is dataset:
            inner.num_processes, inner.process_index, inner.batch_size = 1, 0, 1
            inner.split_batches = False
            _restart_workers(loader)
            return "shard"
    return None


def _restart_workers(loader: Any) -> None:
    """Stop the workers a StatefulDataLoader under ``loader`` started before its first pass.

    ``StatefulDataLoader.state_dict()`` starts the workers of the next pass when there is no pass
    yet, and that pass then uses them. Accelerate calls it as it prepares the loader, so the
    workers hold the dataset as it was then, without the split decided at the pass's start. The
    next ``__iter__`` starts new workers; a position the early iterator was restored to (a
    ``load_state_dict`` before the ``state_dict`` call) is handed on to them.
    """
    base: Any = getattr(loader, "base_dataloader", None)
    early = getattr(base, "_iterator", None)
    if early is None or not getattr(base, "_initial_iter_for_state_dict", False):
        return
    if not getattr(base, "num_workers", 0):
        return  # no workers: the dataset is read in this process, as set now
    state = early.state_dict() if getattr(early, "_num_yielded", 0) else None
    base._iterator, base._initial_iter_for_state_dict = None, False
    base.next_iter_state = state
    shutdown = getattr(early, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
