"""One consumer's share of an epoch, whichever reader reads it: a snapshot's
:class:`~snapstore.read.batches.BatchReader` or a mixture's
:class:`~snapstore.read.mixed.MixedBatchReader`.

The integrations that yield single samples (tf.data, Grain) read batches and split them; these
helpers let them treat both readers alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .batches import BatchReader
from .mixed import MixedBatchReader

__all__ = ["ConsumerReader", "consumer_samples", "every_batch"]

ConsumerReader = BatchReader | MixedBatchReader


def consumer_samples(reader: ConsumerReader) -> int:
    """Samples the reader's consumer reads in one epoch (what ``position`` counts up to)."""
    if isinstance(reader, MixedBatchReader):
        return reader.num_samples
    return reader.plan.num_samples


def every_batch(
    reader: ConsumerReader, resized: Callable[[int], ConsumerReader]
) -> Iterator[dict[str, Any]]:
    """The reader's batches, then the short last batch that ``drop_last`` left out, if any.

    For integrations that yield single samples: ``drop_last`` decides how the epoch is split
    among consumers, but none of a consumer's samples is dropped. ``resized(n)`` makes a
    reader like ``reader`` with batches of ``n`` samples; the reader is closed at the end.
    """
    with reader:
        yield from reader
        after = reader.get_state()
        left = consumer_samples(reader) - after["position"]
    if left > 0 and reader.settings.drop_last:
        with resized(left) as tail:
            tail.set_state(after)
            yield from tail
