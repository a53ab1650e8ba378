"""The on-disk format, and the pure transformations around it.

What a sample may hold (:mod:`~snapstore.format.schema`, :mod:`~snapstore.format.fields`,
ragged lists), how samples become columns and compressed blocks
(:mod:`~snapstore.format.columns`, :mod:`~snapstore.format.encode`), the shard, index, manifest
and commit layout with its checksums (:mod:`~snapstore.format.layout`,
:mod:`~snapstore.format.checksums`; the specification is ``docs/format.md``), and the epoch plan
that says which blocks a reader visits in what order (:mod:`~snapstore.format.plan`).

Layer: the lowest but one. Modules here import only :mod:`snapstore.errors` and each other; they
do no I/O beyond a local file.
"""

from ..oldpaths import moved_attribute
from .declare import nullable
from .layout import FORMAT_VERSION, READABLE_VERSIONS, CommitRecord
from .plan import EpochPlan, PlanOptions
from .ragged import RaggedRows
from .schema import Field, Schema

__all__ = [
    "FORMAT_VERSION",
    "READABLE_VERSIONS",
    "CommitRecord",
    "EpochPlan",
    "Field",
    "PlanOptions",
    "RaggedRows",
    "Schema",
    "nullable",
]


def __getattr__(name: str) -> object:
    """Names of the old ``snapstore.format`` module (now :mod:`snapstore.format.layout`)."""
    from . import layout

    return moved_attribute("snapstore.format", layout, name)
