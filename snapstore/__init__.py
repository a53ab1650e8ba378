"""snapstore: materialize an expensive preprocessing stage once and read it back fast.

>>> import snapstore                                                   # doctest: +SKIP
>>> @snapstore.snapshot(root="/data/snaps")                            # doctest: +SKIP
... def tokenized(paths, max_len=1024):
...     for p in paths:
...         yield {"tokens": ..., "label": 3}
>>> snap = tokenized(paths, max_len=512).materialize()                # doctest: +SKIP
>>> for batch in snap.batches(256, shuffle=True, epoch=0): ...       # doctest: +SKIP
"""

from .batches import BatchReader
from .declare import nullable
from .errors import (
    AmbiguousFingerprintError,
    BusyError,
    CorruptBlockError,
    FingerprintError,
    FormatError,
    ResumeError,
    SchemaError,
    SnapshotNotFoundError,
    SnapshotRemovedError,
    SnapstoreError,
    StageError,
    StoreError,
)
from .fingerprint import Fingerprint
from .format import FORMAT_VERSION
from .inputs import InputError, Inputs, files
from .options import ReaderOptions
from .prefetch import ReadStats
from .schema import Field, Schema
from .snapshot import Snapshot, Stage, open, snapshot
from .store import FsspecStore, LocalStore, RetryPolicy, Store, default_root, open_store
from .writer import Columns, WriteOptions

__version__ = "0.1.0"

__all__ = [
    "FORMAT_VERSION",
    "AmbiguousFingerprintError",
    "BusyError",
    "BatchReader",
    "Columns",
    "CorruptBlockError",
    "Field",
    "Fingerprint",
    "FingerprintError",
    "FormatError",
    "FsspecStore",
    "ReadStats",
    "ReaderOptions",
    "ResumeError",
    "RetryPolicy",
    "InputError",
    "Inputs",
    "LocalStore",
    "Schema",
    "SchemaError",
    "Snapshot",
    "SnapshotNotFoundError",
    "SnapshotRemovedError",
    "SnapstoreError",
    "Stage",
    "StageError",
    "Store",
    "StoreError",
    "WriteOptions",
    "default_root",
    "files",
    "nullable",
    "open",
    "open_store",
    "snapshot",
]
