"""Reading a snapshot back: metadata, prefetching, decoding, and batches.

The reader (:mod:`~snapstore.read.reader`) starts from the commit record and loads the manifest
and block index; the prefetcher (:mod:`~snapstore.read.prefetch`) fetches and decodes the
blocks an epoch plan names, ahead of use, with parallel byte-range requests; batches are
gathered from decoded blocks (:mod:`~snapstore.read.assemble`) and served, resumably, by
:class:`~snapstore.read.batches.BatchReader` with the settings of
:class:`~snapstore.read.options.ReaderOptions`.

Layer: above :mod:`snapstore.fingerprint`; imports it and the layers below.
"""

from .batches import BatchReader
from .options import ReaderOptions
from .prefetch import Prefetcher, ReadStats
from .reader import SnapshotMetadata, SnapshotReader

__all__ = [
    "BatchReader",
    "Prefetcher",
    "ReadStats",
    "ReaderOptions",
    "SnapshotMetadata",
    "SnapshotReader",
]
