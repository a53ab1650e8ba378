"""snapstore: materialize an expensive preprocessing stage once and read it back fast.

>>> import snapstore                                                   # doctest: +SKIP
>>> @snapstore.snapshot(root="/data/snaps")                            # doctest: +SKIP
... def tokenized(paths, max_len=1024):
...     for p in paths:
...         yield {"tokens": ..., "label": 3}
>>> snap = tokenized(paths, max_len=512).materialize()                # doctest: +SKIP
>>> for batch in snap.batches(256, shuffle=True, epoch=0): ...       # doctest: +SKIP
"""

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
    StoreTimeoutError,
)
from .fingerprint import Fingerprint, InputError, Inputs, files
from .format import FORMAT_VERSION, Field, Schema, nullable
from .mix import Mixture, mix
from .oldpaths import MOVED, install, moved_module
from .read import BatchReader, ReaderOptions, ReadStats
from .snapshot import Snapshot, Stage, open, snapshot
from .storage import FsspecStore, LocalStore, RetryPolicy, Store, default_root, open_store
from .tracing import trace
from .write import Columns, StageOptions, WriteOptions

install()  # `import snapstore.store` and the other old module paths keep working

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
    "Mixture",
    "Schema",
    "SchemaError",
    "Snapshot",
    "SnapshotNotFoundError",
    "SnapshotRemovedError",
    "SnapstoreError",
    "Stage",
    "StageError",
    "StageOptions",
    "Store",
    "StoreError",
    "StoreTimeoutError",
    "WriteOptions",
    "default_root",
    "files",
    "mix",
    "nullable",
    "open",
    "open_store",
    "snapshot",
    "trace",
]


def __getattr__(name: str) -> object:
    """``snapstore.store`` and the other modules that moved into subpackages, by their old
    names (see :mod:`snapstore.oldpaths`)."""
    if name in MOVED:
        module = moved_module(name)
        globals()[name] = module  # one warning, not one per look (`from snapstore import gc`)
        return module
    raise AttributeError(f"module 'snapstore' has no attribute {name!r}")
