"""Managing what a store holds: listing, removing, collecting garbage, verifying, copying.

The catalog of snapshots (:mod:`~snapstore.manage.catalog`), garbage collection by policy
(:mod:`~snapstore.manage.gc`), verification of every byte (:mod:`~snapstore.manage.verify`) and
copying between stores (:mod:`~snapstore.manage.copy`). The ``snapstore`` command line is built
on these.

Layer: above :mod:`snapstore.write`; imports it and the layers below.
"""

from .catalog import (
    describe,
    diff_snapshots,
    list_snapshots,
    remove_snapshot,
    resolve_fingerprint,
)
from .copy import CopyResult, copy_snapshot
from .gc import Policy, collect_garbage, find_garbage
from .verify import VerifyReport, verify_snapshot

__all__ = [
    "CopyResult",
    "Policy",
    "VerifyReport",
    "collect_garbage",
    "copy_snapshot",
    "describe",
    "diff_snapshots",
    "find_garbage",
    "list_snapshots",
    "remove_snapshot",
    "resolve_fingerprint",
    "verify_snapshot",
]
