"""The snapstore exception tree.

Every error raised on purpose by snapstore derives from :class:`SnapstoreError`; where the
meaning overlaps a builtin, the class also derives from that builtin so existing ``except``
clauses keep working::

    SnapstoreError(Exception)
    ├── SchemaError(SnapstoreError, TypeError)        a sample does not fit the schema
    ├── FingerprintError(SnapstoreError, TypeError)   a value or function cannot be hashed
    ├── SnapshotNotFoundError(SnapstoreError, FileNotFoundError)
    │   └── SnapshotRemovedError                      removed (rm, gc) while being opened
    ├── SnapshotExistsError(SnapstoreError, FileExistsError)   a write of a committed snapshot
    ├── AmbiguousFingerprintError(SnapstoreError, KeyError)
    ├── FormatError(SnapstoreError, ValueError)       a file is not what the format says
    │   └── CorruptBlockError                         a block's checksum does not match
    ├── ResumeError(SnapstoreError, ValueError)       a resume state does not fit the reader
    ├── StageError(SnapstoreError, RuntimeError)      the stage did not return samples
    │   └── CannotTravelError                         a stage cannot go to a worker process
    │                                                 (in snapstore.write.engines)
    ├── BusyError(SnapstoreError, RuntimeError)       another job holds the claim (on_busy="error")
    └── StoreError(SnapstoreError, OSError)           the storage backend failed
        └── StoreTimeoutError(StoreError, TimeoutError)  it did not answer within the deadline

Messages say what was expected, what was found and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "AmbiguousFingerprintError",
    "BusyError",
    "CorruptBlockError",
    "FingerprintError",
    "FormatError",
    "ResumeError",
    "SchemaError",
    "SnapshotExistsError",
    "SnapshotNotFoundError",
    "SnapshotRemovedError",
    "SnapstoreError",
    "StageError",
    "StoreError",
    "StoreTimeoutError",
]


class SnapstoreError(Exception):
    """Base class of every error snapstore raises on purpose."""


class SchemaError(SnapstoreError, TypeError):
    """A sample does not fit the snapshot's schema, or holds an unsupported type."""


class FingerprintError(SnapstoreError, TypeError):
    """A value, argument or function cannot be hashed deterministically."""


class SnapshotNotFoundError(SnapstoreError, FileNotFoundError):
    """No committed snapshot matches the fingerprint under the given root."""


class SnapshotRemovedError(SnapshotNotFoundError):
    """The snapshot a reader had opened was removed (``snapstore rm``, ``gc``) or replaced
    before the reader's pin was confirmed; what was already read is intact."""


class AmbiguousFingerprintError(SnapstoreError, KeyError):
    """A fingerprint prefix matches more than one committed snapshot."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class FormatError(SnapstoreError, ValueError):
    """A manifest, index or shard is malformed, foreign, or of an unsupported version."""


class CorruptBlockError(FormatError):
    """A block's bytes do not match the checksum recorded in the block index.

    Attributes
    ----------
    shard : str
        Path of the shard file, relative to the snapshot.
    offset : int
        Byte offset of the block inside the shard.
    """

    def __init__(self, message: str, *, shard: str, offset: int) -> None:
        super().__init__(message)
        self.shard = shard
        self.offset = offset


class StageError(SnapstoreError, RuntimeError):
    """The stage did not return an iterable of samples.

    An exception raised *inside* the stage propagates unchanged (with a note saying that
    nothing was committed), so ``except ValueError`` in user code keeps working.
    """


class StoreError(SnapstoreError, OSError):
    """The storage backend failed (permission, space, network, missing bucket)."""


class StoreTimeoutError(StoreError, TimeoutError):
    """The store did not answer within the deadline of one operation (its retries included).

    Raised by remote stores (see :class:`snapstore.storage.retry.RetryPolicy`, ``timeout``);
    the message names the URL, the endpoint, the operation and the seconds waited. ``errno``
    is ``ETIMEDOUT``.

    Attributes
    ----------
    endpoint : str
        The service that did not answer (``http://host:port``, or the client's default).
    waited : float
        Seconds the operation waited, its retries included.
    """

    def __init__(self, message: str, *, endpoint: str = "", waited: float = 0.0) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.waited = waited


class ResumeError(SnapstoreError, ValueError):
    """A resume state does not fit the reader: another snapshot, order or partition."""


class SnapshotExistsError(SnapstoreError, FileExistsError):
    """A write was started for a snapshot that is already committed (``snapstore.ray``)."""


class BusyError(SnapstoreError, RuntimeError):
    """Another job is computing this snapshot, and ``on_busy="error"`` says not to wait."""
