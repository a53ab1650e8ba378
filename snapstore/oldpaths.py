"""Old import paths of the modules that moved into the layer subpackages.

Until the layer subpackages, every module sat directly in ``snapstore/``. ``import
snapstore.store`` and ``from snapstore.gc import collect_garbage`` keep working, with a
:class:`DeprecationWarning` naming the new path, and give the very same module object as the
new path (so classes, and objects pickled under either name, are the same). The finder is
appended to :data:`sys.meta_path` when :mod:`snapstore` is imported and answers only for the
names below.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

__all__ = ["MOVED", "OldPathFinder", "install", "moved_module"]

# old module (under snapstore.) -> where it lives now (under snapstore.). ``format`` and
# ``fingerprint`` are packages now: their old contents (in ``format.layout`` and
# ``fingerprint.digest``) are reached through the packages' ``__getattr__``.
MOVED = {
    "arraylike": "format.arraylike",
    "assemble": "read.assemble",
    "batches": "read.batches",
    "cache": "storage.cache",
    "catalog": "manage.catalog",
    "checks": "format.checks",
    "checksums": "format.checksums",
    "claims": "storage.claims",
    "codeid": "fingerprint.codeid",
    "columns": "format.columns",
    "copy": "manage.copy",
    "declare": "format.declare",
    "encode": "format.encode",
    "engines": "write.engines",
    "explain": "fingerprint.explain",
    "fields": "format.fields",
    "gc": "manage.gc",
    "handoff": "format.handoff",
    "hashing": "fingerprint.hashing",
    "hostindex": "storage.hostindex",
    "importname": "fingerprint.importname",
    "inference": "format.inference",
    "inputs": "fingerprint.inputs",
    "listing": "storage.listing",
    "lists": "format.lists",
    "options": "read.options",
    "parallel": "write.parallel",
    "partitions": "write.partitions",
    "pins": "storage.pins",
    "plan": "format.plan",
    "prefetch": "read.prefetch",
    "progress": "write.progress",
    "ragged": "format.ragged",
    "reader": "read.reader",
    "retry": "storage.retry",
    "roots": "storage.roots",
    "scalars": "format.scalars",
    "schema": "format.schema",
    "simulate": "storage.simulate",
    "store": "storage.store",
    "travel": "storage.travel",
    "trees": "storage.trees",
    "verify": "manage.verify",
    "webhdfs": "storage.webhdfs",
    "writer": "write.writer",
}


def moved_module(old: str, stacklevel: int = 2) -> types.ModuleType:
    """The module that ``snapstore.<old>`` became, imported, after a DeprecationWarning."""
    new = f"snapstore.{MOVED[old]}"
    warnings.warn(
        f"snapstore.{old} moved to {new}; import it from there (the old path goes away before 1.0)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    return importlib.import_module(new)


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path, leaving that module's spec alone."""

    def __init__(self, old: str) -> None:
        self.old = old
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = moved_module(self.old, stacklevel=8)  # past the import machinery's frames
        self.spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set it to the old name's spec


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds ``snapstore.<old>`` for each module in :data:`MOVED` (and nothing else)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, old = fullname.partition(".")
        if package != "snapstore" or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(old))


def install() -> None:
    """Append the finder to :data:`sys.meta_path` once (after the path finders)."""
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
