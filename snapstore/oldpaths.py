"""Old import paths of the modules that moved into the layer subpackages.

Until the layer subpackages, every module sat directly in ``snapstore/``. ``import
snapstore.store`` and ``from snapstore.gc import collect_garbage`` keep working, with a
:class:`DeprecationWarning` naming the new path, and give the very same module object as the
new path (so classes, and objects pickled under either name, are the same). The finder is
appended to :data:`sys.meta_path` when :mod:`snapstore` is imported and answers only for the
names below.

The old names also live on where a name is identity: :func:`historic_name` is what fingerprints
hash a snapstore class or function as, and what its module's logger is called, so a stage that
reads ``snapstore.Columns`` keeps its snapshots and ``logging.getLogger("snapstore.store")``
keeps configuring the store's messages.
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

__all__ = [
    "HISTORIC_MODULES",
    "HISTORIC_NAMES",
    "MOVED",
    "OldPathFinder",
    "historic_name",
    "install",
    "moved_attribute",
    "moved_module",
]

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


# The module each module of the package was before the subpackages, and the objects that moved
# between modules in the same release: what fingerprints hash a snapstore name as, and what
# loggers are called, so that neither changes with the layout (a stage whose code reads
# ``snapstore.Field`` or takes a ``WriteOptions`` keeps its snapshots; ``logging.getLogger(
# "snapstore.store")`` still configures the store's messages). Modules new since then keep
# their own names.
HISTORIC_MODULES = {f"snapstore.{new}": f"snapstore.{old}" for old, new in MOVED.items()} | {
    "snapstore.format.layout": "snapstore.format",
    "snapstore.fingerprint.digest": "snapstore.fingerprint",
    "snapstore.storage.base": "snapstore.store",
    "snapstore.storage.local": "snapstore.store",
    "snapstore.storage.fsspec_store": "snapstore.store",
    "snapstore.write.jobs": "snapstore.snapshot",
}
HISTORIC_NAMES = {
    **{f"snapstore.format.fields.{name}": f"snapstore.schema.{name}" for name in ("Field",)},
    **{
        f"snapstore.format.inference.{name}": f"snapstore.schema.{name}"
        for name in ("infer_schema", "field_of", "check_keys", "sample_items")
    },
    **{
        f"snapstore.format.checks.{name}": f"snapstore.schema.{name}"
        for name in ("check_sample", "sample_checker")
    },
    "snapstore.format.ragged.pad_ragged": "snapstore.columns.pad_ragged",
    "snapstore.storage.roots.default_root": "snapstore.store.default_root",
    "snapstore.storage.travel.portable": "snapstore.store.portable",
    "snapstore.storage.travel.reopen": "snapstore.store.reopen",
    "snapstore.storage.listing.root_missing": "snapstore.roots.root_missing",
    "snapstore.manage.catalog.list_fingerprints": "snapstore.snapshot.list_fingerprints",
    "snapstore.manage.catalog.resolve_fingerprint": "snapstore.snapshot.resolve_fingerprint",
    "snapstore.fingerprint.importname.module_name": "snapstore.codeid.module_name",
}


def historic_name(module: str, qualname: str = "") -> str:
    """``module`` (or ``module.qualname``) as it was named before the subpackages; any other
    name as it is."""
    if qualname:
        full = f"{module}.{qualname}"
        if full in HISTORIC_NAMES:
            return HISTORIC_NAMES[full]
        return f"{HISTORIC_MODULES.get(module, module)}.{qualname}"
    return HISTORIC_MODULES.get(module, module)


def moved_module(old: str, stacklevel: int = 2) -> types.ModuleType:
    """The module that ``snapstore.<old>`` became, imported, after a DeprecationWarning."""
    new = f"snapstore.{MOVED[old]}"
    warnings.warn(
        f"snapstore.{old} moved to {new}; import it from there (the old path goes away before 1.0)",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    return importlib.import_module(new)


def moved_attribute(package: str, module: types.ModuleType, name: str) -> object:
    """``<package>.<name>`` for the two modules that became packages (``snapstore.format``,
    ``snapstore.fingerprint``): the value of ``name`` in ``module``, where it lives now, after
    a DeprecationWarning at the caller's line (the package's ``__getattr__`` calls this).

    Raises
    ------
    AttributeError
        If ``module`` has no such value (its private names and imported modules are not
        forwarded).
    """
    value = getattr(module, name, None)
    if name.startswith("_") or value is None or isinstance(value, types.ModuleType):
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} moved to {module.__name__}.{name}", DeprecationWarning, stacklevel=3
    )
    return value


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path, leaving that module's spec alone."""

    def __init__(self, old: str) -> None:
        self.old = old
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = moved_module(self.old, stacklevel=2)  # warnings skips importlib's frames
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
