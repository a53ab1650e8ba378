"""Fingerprints of a stage call: canonical hashing of code, values and inputs into named parts.

A fingerprint is sha256 over named parts, each itself a sha256 hex digest (scheme 3)::

    scheme     FINGERPRINT_SCHEME
    code       the stage's code and, transitively, the user code it reaches (see codeid)
    arguments  the bound arguments, one digest per name (or hash_value(key(...)))
    inputs     arguments with __snapstore_inputs__() -> {input name: identity}, one per name
    upstream   arguments with __snapstore_upstream__() -> a fingerprint, one per name
    format     the on-disk format version
    version    the user's version string, or None

The digest is the first 128 bits of sha256 over the sorted ``(name, part digest)`` pairs. All
parts are always present (``inputs`` and ``upstream`` hash an empty mapping when no argument has
the hook). An inputs digest is sha256 over the sorted ``(name, identity)`` pairs; details keep a
16-hex digest per input (up to 100,000 inputs) so a diff can count changed, added and removed
inputs. Nested in a container, a hooked object hashes as what it declares, within ``arguments``.

Values are hashed by a typed, length-prefixed encoding fed into sha256: never ``hash()``,
``id()`` or pickle, so the result does not depend on ``PYTHONHASHSEED``, the process, the working
directory or the machine. Dicts and sets are order-independent (entries sorted by digest);
lists and tuples are ordered and distinct; ``1``, ``True`` and ``1.0`` differ; floats hash
through ``float.hex`` (``-0.0`` differs from ``0.0``, nan is stable). Numpy dtypes and library
classes hash by qualified name; user functions and classes by their code identity (see
:mod:`snapstore.fingerprint.codeid`, which also says which code is the user's), and instances of
user dataclasses, enums, namedtuples and callable classes bring their class's code too. An object
with ``__snapstore_key__()`` hashes as what that returns (its class's code is not read). A generator
or other iterator is refused: it cannot be hashed without consuming it. Any other type is a
:class:`FingerprintError` that names where it was found and the ways out, never a silent fallback.
Changing a rule here or in :mod:`snapstore.fingerprint.codeid` must bump
:data:`FINGERPRINT_SCHEME` and regenerate the golden file.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import inspect
import pathlib
import re
import reprlib
import types
import uuid
from collections.abc import Callable, Collection
from typing import Any

import numpy as np

from ..errors import FingerprintError, FormatError
from .codeid import CodeWalk, package_of
from .hashing import (
    BUILTIN_CALLABLES,
    Buffer,
    Sink,
    Unhashable,
    callable_name,
    feed_item,
    is_callable_object,
    is_code,
    qualname_of,
    underlying_function,
)

__all__ = [
    "FINGERPRINT_SCHEME",
    "Fingerprint",
    "Hasher",
    "combine_parts",
    "declared_digest",
    "diff_parts",
    "fingerprint_key",
    "fingerprint_stage",
    "hash_code",
    "hash_value",
    "upstream_digest",
]

FINGERPRINT_SCHEME = 3
_DIGEST_CHARS = 32  # 128 bits: collisions need ~2**64 snapshots
_MAX_DEPTH = 100  # a few stack frames per level stays far below the interpreter's recursion limit
_REPR_CHARS = 80
_MAX_INPUT_DETAILS = 100_000  # per-input digests kept in details up to this many inputs
_HOOK_PARTS = ("inputs", "upstream")  # __snapstore_inputs__(), __snapstore_upstream__()
_TEXT_TYPES = (  # exact types whose str() is canonical; subclasses (pandas Timestamp) are refused
    datetime.date, datetime.datetime, datetime.time, datetime.timedelta,
    decimal.Decimal, fractions.Fraction, uuid.UUID,
)  # fmt: skip
_ITERATORS = (collections.abc.Iterator, types.AsyncGeneratorType, collections.abc.AsyncIterator)


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """The fingerprint of one stage call, with the parts it hashes and their explanation.

    Attributes
    ----------
    digest : str
        32 lowercase hex characters: the first 128 bits of sha256 over the sorted parts.
    parts : dict of str to str
        Part name (``"code"``, ``"arguments"``...) to the full sha256 hex digest of that part.
    details : dict
        JSON-able explanation: stage name; ``code`` (stage, ``functions`` ``{"mod.qualname":
        16-hex digest}``, ``packages`` ``{"numpy": "2.4.6"}``, ignored globals); per-argument
        digests and reprs; ``inputs`` (count, digest, per-input digests) and ``upstream``
        (fingerprint) per argument; ignored arguments, key, version, format version, scheme.
    """

    digest: str
    parts: dict[str, str]
    details: dict[str, Any]

    def __hash__(self) -> int:
        return hash(self.digest)

    def __str__(self) -> str:
        return self.digest

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict that :meth:`from_json` turns back into an equal fingerprint."""
        return {"digest": self.digest, "parts": dict(self.parts), "details": dict(self.details)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        """Rebuild a fingerprint stored by :meth:`to_json`.

        Raises
        ------
        FormatError
            If fields are missing or, for the current scheme, the digest does not match the parts.
        """
        digest, parts, details = data.get("digest"), data.get("parts"), data.get("details", {})
        if not (isinstance(digest, str) and isinstance(parts, dict) and isinstance(details, dict)):
            raise FormatError(
                f"expected a fingerprint record with 'digest', 'parts' and 'details'; found "
                f"keys {sorted(data)}. The manifest is corrupt or not written by snapstore."
            )
        combined = combine_parts(parts)
        if details.get("scheme") == FINGERPRINT_SCHEME and combined != digest:
            raise FormatError(
                f"fingerprint {digest} does not match its parts (they give {combined}); "
                "the record is corrupt. Remove the snapshot and write it again."
            )
        return cls(digest, dict(parts), dict(details))


def _int_bytes(value: int) -> bytes:
    return int.to_bytes(value, (value.bit_length() + 8) // 8, "big", signed=True)


_SCALARS: dict[type, tuple[bytes, Callable[[Any], Buffer]]] = {
    type(None): (b"none", lambda v: b""),
    type(...): (b"ellipsis", lambda v: b""),
    bool: (b"bool", lambda v: b"\x01" if v else b"\x00"),
    int: (b"int", _int_bytes),
    float: (b"float", lambda v: float.hex(v).encode()),
    complex: (b"complex", lambda v: f"{float.hex(v.real)},{float.hex(v.imag)}".encode()),
    str: (b"str", lambda v: str.encode(v, "utf-8", "surrogatepass")),
    bytes: (b"bytes", lambda v: v),
    bytearray: (b"bytearray", lambda v: v),
}


def _dtype_text(dtype: np.dtype[Any]) -> str:
    return dtype.str if dtype.fields is None else repr(dtype.descr)


def _segment(kind: str, key: Any) -> str:
    """One step of an error path: ``[3]``, ``['name']``, ``.field``, ``key 'x'``, ``{'x'}``."""
    if kind == "index":
        return f"[{key}]"
    if kind == "attr":
        return f".{key}"
    text = _short_repr(key)
    return {"key": f"[{text}]", "dictkey": f"key {text}"}.get(kind, f"{{{text}}}")


class Hasher:
    """One hashing walk over values (refusing reference cycles); code goes to the code walk."""

    def __init__(self, walk: CodeWalk) -> None:
        self._active: set[int] = set()  # id() only detects cycles; it never reaches a digest
        self.walk = walk
        walk.encoder = self

    def digest(self, value: Any, depth: int, kind: str, key: Any) -> bytes:
        h = hashlib.sha256()
        self.child(h, value, depth, kind, key)
        return h.digest()

    def child(self, h: Sink, value: Any, depth: int, kind: str, key: Any) -> None:
        try:
            self.encode(h, value, depth)
        except Unhashable as exc:
            exc.segments.append(_segment(kind, key))
            raise

    def encode(self, h: Sink, value: Any, depth: int = 0) -> None:
        cls = type(value)
        scalar = _SCALARS.get(cls)
        if scalar is not None:
            feed_item(h, scalar[0], scalar[1](value))
            return
        if depth >= _MAX_DEPTH:
            raise Unhashable(qualname_of(cls), f"values nested deeper than {_MAX_DEPTH} levels")
        if id(value) in self._active:
            raise Unhashable(qualname_of(cls), "a reference cycle: the value contains itself")
        self._active.add(id(value))
        try:
            self._compound(h, value, cls, depth + 1)
        finally:
            self._active.discard(id(value))

    def _compound(self, h: Sink, value: Any, cls: type, depth: int) -> None:
        if isinstance(value, type):
            self.code(h, value, depth)
        elif getattr(cls, "__snapstore_key__", None) is not None:
            feed_item(h, b"key", qualname_of(cls).encode())
            self.child(h, value.__snapstore_key__(), depth, "attr", "__snapstore_key__()")
        elif any(_hook(value, f"__snapstore_{part}__") for part in _HOOK_PARTS):
            for part in _HOOK_PARTS:  # nested in a container: hashed as what it declares
                found = _declared(value, part)
                feed_item(h, part.encode(), (found[0] if found else "").encode())
        elif cls is np.ndarray or cls is np.memmap:
            if value.dtype.hasobject:
                raise Unhashable(f"numpy array of dtype {value.dtype}", "objects have no bytes")
            shape = ",".join(map(str, value.shape))
            feed_item(h, b"ndarray", f"{_dtype_text(value.dtype)}|{shape}".encode())
            flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)  # no copy if contiguous
            feed_item(h, b"data", flat.data)
        elif isinstance(value, np.generic) and not value.dtype.hasobject:
            feed_item(h, b"npscalar", _dtype_text(value.dtype).encode())
            feed_item(h, b"data", value.tobytes())
        elif isinstance(value, enum.Enum):
            feed_item(h, b"enum", f"{qualname_of(cls)}.{value.name}".encode())
            self.code(h, cls, depth)
        elif isinstance(value, np.dtype):
            feed_item(h, b"dtype", _dtype_text(value).encode())
        elif callable(value) and (is_code(value) or is_callable_object(value)):
            feed_item(h, b"code")
            self.code(h, value, depth)
        elif dataclasses.is_dataclass(value):
            self._fields(h, value, depth)
        elif isinstance(value, pathlib.PurePath):
            feed_item(h, b"path", f"{cls.__name__}:{value.as_posix()}".encode())
        elif cls is range:
            feed_item(h, b"range", f"{value.start}:{value.stop}:{value.step}".encode())
        elif cls is slice:
            feed_item(h, b"slice")
            for name in ("start", "stop", "step"):
                self.child(h, getattr(value, name), depth, "attr", name)
        elif cls in _TEXT_TYPES:
            feed_item(h, b"text", f"{qualname_of(cls)}:{value}".encode())
        elif cls is re.Pattern:  # not str(): it cuts long patterns
            feed_item(h, b"regex", repr((value.pattern, value.flags)).encode())
        elif cls is memoryview:
            feed_item(h, b"memoryview", f"{value.format}|{value.shape}".encode())
            feed_item(h, b"data", value.tobytes())
        elif isinstance(value, tuple) and hasattr(cls, "_fields"):
            feed_item(h, b"namedtuple", f"{qualname_of(cls)}|{len(value)}".encode())
            self.code(h, cls, depth)
            for name, item in zip(cls._fields, value, strict=True):
                feed_item(h, b"field", name.encode())
                self.child(h, item, depth, "attr", name)
        elif isinstance(value, (list, tuple, dict, set, frozenset, *_SCALARS)):
            self._builtin(h, value, cls, depth)
        elif isinstance(value, _ITERATORS):
            raise Unhashable(
                qualname_of(cls),
                "a generator or iterator, which cannot be hashed without consuming it; pass a "
                "list or tuple of its items instead, or key=",
            )
        else:
            raise Unhashable(qualname_of(cls), "no deterministic hash is defined for this type")

    def _builtin(self, h: Sink, value: Any, cls: type, depth: int) -> None:
        base = next(
            b for b in (list, tuple, dict, set, frozenset, *_SCALARS) if isinstance(value, b)
        )
        if cls is not base:  # a subclass: its name and code matter, and so does its state
            feed_item(h, b"subclass", qualname_of(cls).encode())
            self.code(h, cls, depth)
            extra = getattr(value, "__dict__", None)
            if extra:
                self.child(h, extra, depth, "attr", "__dict__")
        if base in _SCALARS:
            feed_item(h, _SCALARS[base][0], _SCALARS[base][1](value))
        elif base in (list, tuple):
            feed_item(h, base.__name__.encode(), len(value).to_bytes(8, "big"))
            for i, item in enumerate(value):
                self.child(h, item, depth, "index", i)
        elif base is dict:
            entries = sorted(
                (self.digest(k, depth, "dictkey", k), self.digest(v, depth, "key", k))
                for k, v in value.items()
            )
            feed_item(h, b"dict", b"".join(k + v for k, v in entries))
        else:
            items = sorted(self._element(item, depth) for item in value)
            feed_item(h, base.__name__.encode(), b"".join(items))

    def _element(self, item: Any, depth: int) -> bytes:
        """A set element's digest: code in it is walked apart, as set order is arbitrary."""
        if type(item) in _SCALARS:
            return self.digest(item, depth, "elem", item)
        alone = Hasher(CodeWalk(self.walk.ignore))
        digest = alone.digest(item, depth, "elem", item)
        alone.walk.run()
        self.walk.packages.update(alone.walk.packages)
        return hashlib.sha256(digest + alone.walk.digest(b"", packages=False).encode()).digest()

    def _fields(self, h: Sink, value: Any, depth: int) -> None:
        feed_item(h, b"dataclass", qualname_of(type(value)).encode())
        self.code(h, type(value), depth)
        for field in dataclasses.fields(value):
            feed_item(h, b"field", field.name.encode())
            self.child(h, getattr(value, field.name), depth, "attr", field.name)

    def code(self, h: Sink, fn: Any, depth: int) -> None:
        """Feed a callable's or class's code identity: user code by key (joining the walk)."""
        if isinstance(fn, functools.partial):
            feed_item(h, b"partial")
            self.child(h, fn.func, depth, "attr", "func")
            self.child(h, fn.args, depth, "attr", "args")
            self.child(h, fn.keywords, depth, "attr", "keywords")
        elif isinstance(fn, types.MethodType):
            feed_item(h, b"method")
            self.code(h, fn.__func__, depth)
            self.child(h, fn.__self__, depth, "attr", "__self__")
        elif isinstance(fn, (types.FunctionType, type)):
            tag, name = self.walk.reference(fn)
            feed_item(h, b"class" if isinstance(fn, type) else b"function")
            feed_item(h, tag, name.encode())
            wrapped = getattr(fn, "__wrapped__", None)  # a library decorator's wrapper
            if tag == b"ext" and isinstance(wrapped, types.FunctionType):
                self.child(h, wrapped, depth, "attr", "__wrapped__")
        elif isinstance(fn, BUILTIN_CALLABLES):
            feed_item(h, b"builtin", qualname_of(fn).encode())
            self.walk.note_package(package_of(fn))
            owner = getattr(fn, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.child(h, owner, depth, "attr", "__self__")
        elif callable(getattr(fn, "__wrapped__", None)):  # lru_cache, class-based decorators
            feed_item(h, b"wrapped")
            self.code(h, type(fn), depth)
            self.child(h, fn.__wrapped__, depth, "attr", "__wrapped__")
        elif is_callable_object(fn):
            feed_item(h, b"callable")
            self.code(h, type(fn), depth)
            if getattr(type(fn), "__snapstore_key__", None) is not None:
                self.child(h, fn.__snapstore_key__(), depth, "attr", "__snapstore_key__()")
            elif dataclasses.is_dataclass(fn):
                self._fields(h, fn, depth)
            elif isinstance(getattr(fn, "__dict__", None), dict):
                self.child(h, vars(fn), depth, "attr", "__dict__")
            else:
                raise Unhashable(qualname_of(type(fn)), "a callable object without a __dict__")
        else:
            raise Unhashable(qualname_of(type(fn)), "not a function this scheme can hash")


# -- protocol hooks -------------------------------------------------------------------------


def _hook(value: Any, name: str) -> Callable[[], Any] | None:
    """``value.name`` when its class defines a callable ``name`` (a class itself has none)."""
    if isinstance(value, type) or not callable(getattr(type(value), name, None)):
        return None
    return getattr(value, name)  # type: ignore[no-any-return]


def _declared(value: Any, part: str) -> tuple[str, Any] | None:
    """``(digest, details)`` of what ``value`` declares through the ``part`` hook, or None."""
    hook = _hook(value, f"__snapstore_{part}__")
    if hook is None:
        return None
    result, h = hook(), hashlib.sha256()
    if part == "upstream" and isinstance(result, str):
        return upstream_digest(result), result
    if part == "upstream" or not (
        isinstance(result, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in result.items())
    ):
        expected = {"upstream": "the upstream snapshot's fingerprint as a str"}.get(
            part, "a dict of str (a stable name of each input) to str (its identity)"
        )
        raise Unhashable(
            qualname_of(type(value)),
            f"__snapstore_{part}__() returned {type(result).__name__}, expected {expected}",
        )
    items = {k: result[k].encode("utf-8", "surrogatepass") for k in sorted(result)}
    feed_item(h, b"inputs", len(items).to_bytes(8, "big"))
    for name, identity in items.items():
        feed_item(h, b"name", name.encode("utf-8", "surrogatepass"))
        feed_item(h, b"identity", identity)
    detail: dict[str, Any] = {"count": len(items), "digest": h.hexdigest()[:16]}
    if len(items) <= _MAX_INPUT_DETAILS:
        detail["items"] = {k: hashlib.sha256(v).hexdigest()[:16] for k, v in items.items()}
    return h.hexdigest(), detail


def _split_declared(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plain arguments, and per hook part the ``{arg: digest}`` and ``{arg: details}``."""
    plain: dict[str, Any] = {}
    declared: dict[str, Any] = {part: ({}, {}) for part in _HOOK_PARTS}
    for arg, value in values.items():
        try:
            found = {part: _declared(value, part) for part in _HOOK_PARTS}
        except Unhashable as exc:
            raise _explain(f"argument {arg!r}", exc, arg) from None
        for part, result in found.items():
            if result is not None:
                declared[part][0][arg], declared[part][1][arg] = result
        if not any(found.values()):
            plain[arg] = value
    return plain, declared


# -- public hashing -------------------------------------------------------------------------


def _explain(where: str, exc: Unhashable, argument: str | None) -> FingerprintError:
    steps = exc.segments[::-1]
    if len(steps) > 12:  # a path 100 levels deep says no more than its two ends
        steps = [*steps[:6], "...", *steps[-6:]]
    if exc.context is not None:  # read by the code: a global, closure variable, class attribute
        path = " -> ".join([exc.context, *steps])
        name = exc.hint or "<the name>"
        return FingerprintError(
            f"cannot fingerprint {path}: found {exc.found} ({exc.reason}). What the stage's "
            "code reads (globals, closure variables, default values, class attributes) is part "
            "of its fingerprint, so it must be plain data. Ways out: define "
            "__snapstore_key__(self) on its class, returning plain data that identifies it; "
            f'or pass ignore_globals=["{name}"] to snapshot() to leave it out (with version="...",'
            " bumped by hand when that value changes the data)."
        )
    path = " -> ".join([where, *steps])
    ignore = f'ignore=["{argument}"]' if argument else "ignore=[<the argument>]"
    return FingerprintError(
        f"cannot fingerprint {path}: found {exc.found} ({exc.reason}). Expected plain data "
        "(None, bool, int, float, str, bytes, list, tuple, dict, set, numpy array, dataclass, "
        'Enum, path, function). Ways out: pass version="..." together with '
        f"{ignore} to snapshot() (and bump the version by hand when it changes the data); "
        "pass key= to snapshot(), a function of the stage's arguments returning plain data "
        "that identifies them; or define __snapstore_key__(self) on the class, returning "
        "plain data that identifies the object."
    )


def _encode(hasher: Hasher, value: Any, where: str, argument: str | None = None) -> str:
    h = hashlib.sha256()
    try:
        hasher.encode(h, value)
    except Unhashable as exc:
        raise _explain(where, exc, argument) from None
    return h.hexdigest()


def hash_value(value: Any, where: str = "value") -> str:
    """The sha256 hex digest of ``value``'s canonical typed encoding.

    Functions and classes of the user's code inside ``value`` count by their code identity
    (transitively, see :mod:`snapstore.fingerprint.codeid`); library ones by qualified name.

    Parameters
    ----------
    value : object
        Plain data (see the module docstring for the supported types).
    where : str
        How to name ``value`` in an error message, e.g. ``"argument 'cfg'"``.

    Returns
    -------
    str
        64 lowercase hex characters, equal in every process and on every machine.

    Raises
    ------
    FingerprintError
        If ``value`` holds something without a deterministic hash, or a reference cycle; the
        message gives the path to it and the ways out.

    Examples
    --------
    >>> hash_value({"a": 1, "b": 2}) == hash_value({"b": 2, "a": 1})
    True
    >>> hash_value([1]) == hash_value((1,))
    False
    """
    walk = CodeWalk()
    digest = _encode(Hasher(walk), value, where)
    try:
        walk.run()
    except Unhashable as exc:
        raise _explain(where, exc, None) from None
    if not walk.functions:
        return digest
    h = hashlib.sha256()  # user code inside the value: its identities, not package versions
    feed_item(h, b"value", digest.encode())
    feed_item(h, b"code", walk.digest(b"", packages=False).encode())
    return h.hexdigest()


def hash_code(fn: Callable[..., Any], *, ignore_globals: Collection[str] = ()) -> str:
    """The sha256 hex digest of a callable's code identity: the ``code`` part of its fingerprint.

    Functions hash by normalized source, defaults, closure and the names they read, following
    the user's functions and classes transitively (:mod:`snapstore.fingerprint.codeid`); library
    code by name and package version; partials add their arguments, bound methods ``__self__``.

    Parameters
    ----------
    fn : callable
        A stage, helper, partial, bound method or callable object.
    ignore_globals : collection of str
        Names the code reads that are left out (see :mod:`snapstore.fingerprint.codeid`).

    Raises
    ------
    FingerprintError
        If part of the code identity (a global the code reads, a bound ``__self__``, a partial's
        arguments) cannot be hashed; the message names it and the ways out.

    Examples
    --------
    >>> hash_code(len) == hash_code(len)
    True
    """
    walk = CodeWalk(ignore_globals, skip_defaults=underlying_function(fn))
    return _code_part(fn, Hasher(walk))


def _code_part(fn: Any, hasher: Hasher) -> str:
    """Walk ``fn``'s code (and any code the hasher met in arguments) into the code part."""
    root, where = hashlib.sha256(), f"code of {callable_name(fn)}"
    try:
        hasher.code(root, fn, 0)
        hasher.walk.run()
    except Unhashable as exc:
        raise _explain(where, exc, None) from None
    return hasher.walk.digest(root.digest())


def _short_repr(value: Any) -> str:
    if isinstance(value, (types.FunctionType, type, *BUILTIN_CALLABLES)):
        return f"<{type(value).__name__} {qualname_of(value)}>"  # no memory address
    text = _REPR.repr(value)
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR_CHARS


def declared_digest(value: Any, part: str = "inputs") -> str | None:
    """The digest ``value`` contributes to the ``inputs`` (or ``upstream``) part through its
    ``__snapstore_inputs__`` (``__snapstore_upstream__``) hook, or None if it has none.

    Raises
    ------
    FingerprintError
        If the hook returns something that is not what the part hashes.
    """
    try:
        found = _declared(value, part)
    except Unhashable as exc:
        raise _explain(f"{part} of {type(value).__name__}", exc, None) from None
    return None if found is None else found[0]


def combine_parts(parts: dict[str, str]) -> str:
    """The digest of a fingerprint with these parts (docs/format.md, section 13)."""
    h = hashlib.sha256()
    feed_item(h, b"snapstore-fingerprint")
    for name in sorted(parts):
        feed_item(h, b"part", name.encode())
        feed_item(h, b"digest", parts[name].encode())
    return h.hexdigest()[:_DIGEST_CHARS]


def upstream_digest(fingerprint: str) -> str:
    """What an upstream snapshot's fingerprint contributes, per argument, to the ``upstream``
    part (a mapping of argument name to this, hashed by :func:`hash_value`)."""
    h = hashlib.sha256()
    feed_item(h, b"upstream", fingerprint.encode())
    return h.hexdigest()


def _bind_arguments(
    fn: Callable[..., Any],
    name: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    ignore: Collection[str],
) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied, ignored names left out."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot read the signature of {name}: {exc}") from exc
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{name}{sig} cannot be called with these arguments: {exc}") from exc
    bound.apply_defaults()
    var_kw = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    unknown = sorted(n for n in ignore if n not in sig.parameters)
    if unknown and var_kw is None:
        raise TypeError(f"ignore= names {unknown}, which are not parameters of {name}{sig}")
    values = {n: v for n, v in bound.arguments.items() if n not in ignore}
    if var_kw in values:  # ignore= may also name keywords caught by **kwargs
        values[var_kw] = {k: v for k, v in values[var_kw].items() if k not in ignore}
    return values


def fingerprint_stage(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    format_version: int,
    version: str | None = None,
    key: Callable[..., Any] | None = None,
    ignore: Collection[str] = (),
    ignore_globals: Collection[str] = (),
) -> Fingerprint:
    """The fingerprint of calling ``fn(*args, **kwargs)``.

    Parameters
    ----------
    fn : callable
        The stage (undecorated).
    args, kwargs
        The call's arguments; bound to ``fn``'s signature with defaults applied, so
        ``f(x)`` and ``f(x, n=DEFAULT)`` fingerprint equally. An argument whose value has
        ``__snapstore_inputs__()`` or ``__snapstore_upstream__()`` goes into the ``inputs`` or
        ``upstream`` part instead of ``arguments``.
    format_version : int
        The on-disk format version.
    version : str, optional
        The user's version, folded in as its own part.
    key : callable, optional
        ``key(*args, **kwargs)`` is hashed instead of the arguments (code and inputs stay).
    ignore : collection of str
        Argument names (or keywords caught by ``**kwargs``) left out; recorded in details.
    ignore_globals : collection of str
        Names the code reads (globals, closure variables, class attributes) left out of the
        code part; see :mod:`snapstore.fingerprint.codeid`.

    Returns
    -------
    Fingerprint

    Raises
    ------
    TypeError
        If the arguments do not fit ``fn``'s signature, or ``ignore`` names no parameter.
    FingerprintError
        If an argument or the code cannot be hashed; the message says where and how to fix it.
    """
    name = callable_name(fn)
    values = _bind_arguments(fn, name, args, kwargs, ignore)
    walk = CodeWalk(ignore_globals, skip_defaults=underlying_function(fn))
    hasher = Hasher(walk)
    plain, declared = _split_declared(values)
    digests: dict[str, str] = {}
    if key is None:
        for arg, value in plain.items():
            digests[arg] = _encode(hasher, value, f"argument {arg!r}", argument=arg)
        arguments = hash_value(digests, "argument digests")
    else:
        arguments = _encode(hasher, key(*args, **kwargs), f"key(...) of {name}")
    parts = {
        "scheme": hash_value(FINGERPRINT_SCHEME),
        "code": _code_part(fn, hasher),
        "arguments": arguments,
        "inputs": hash_value(declared["inputs"][0], "input digests"),
        "upstream": hash_value(declared["upstream"][0], "upstream digests"),
        "format": hash_value(format_version),
        "version": hash_value(version),
    }
    details: dict[str, Any] = {
        "stage": name,
        "code": {"stage": name, **walk.details()},
        "arguments": digests,
        "argument_values": {arg: _short_repr(value) for arg, value in plain.items()},
        "inputs": declared["inputs"][1],
        "upstream": declared["upstream"][1],
        "ignored": sorted(ignore),
        "key": None if key is None else callable_name(key),
        "version": version,
        "format_version": format_version,
        "scheme": FINGERPRINT_SCHEME,
    }
    return Fingerprint(combine_parts(parts), parts, details)


def fingerprint_key(
    name: str, key: Any, *, version: str | None = None, format_version: int | None = None
) -> Fingerprint:
    """The fingerprint of data that no Python stage function produces (a Ray Data pipeline, an
    external job): identified by a ``name`` and a ``key`` the caller vouches for.

    The parts are those of :func:`fingerprint_stage`, with ``code`` the hash of ``name`` and
    ``arguments`` the hash of ``key``; ``inputs`` and ``upstream`` hash an empty mapping. Same
    name, key, version and format version give the same fingerprint in every process.

    Parameters
    ----------
    name : str
        What the data is (recorded as the stage name), e.g. ``"tokenized"``.
    key : object
        Plain data identifying the exact contents (source paths and their versions, settings);
        anything :func:`hash_value` accepts.
    version : str, optional
        The user's version, folded in as its own part.
    format_version : int, optional
        The on-disk format version; default :data:`snapstore.format.layout.FORMAT_VERSION`.

    Raises
    ------
    FingerprintError
        If ``key`` cannot be hashed.
    TypeError
        If ``name`` is not a non-empty str.

    Examples
    --------
    >>> a = fingerprint_key("tokens", {"src": "gs://b/raw", "max_len": 512})
    >>> a == fingerprint_key("tokens", {"max_len": 512, "src": "gs://b/raw"})
    True
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name: expected a non-empty str naming the data, found {name!r}")
    if format_version is None:
        from ..format.layout import FORMAT_VERSION

        format_version = FORMAT_VERSION
    parts = {
        "scheme": hash_value(FINGERPRINT_SCHEME),
        "code": hash_value(("named data", name), "name"),
        "arguments": hash_value(key, f"key of {name!r}"),
        "inputs": hash_value({}, "input digests"),
        "upstream": hash_value({}, "upstream digests"),
        "format": hash_value(format_version),
        "version": hash_value(version),
    }
    details: dict[str, Any] = {
        "stage": name,
        "code": name,
        "arguments": {},
        "argument_values": {"key": _short_repr(key)},
        "inputs": {},
        "upstream": {},
        "ignored": [],
        "key": "key",
        "version": version,
        "format_version": format_version,
        "scheme": FINGERPRINT_SCHEME,
    }
    return Fingerprint(combine_parts(parts), parts, details)


from .explain import diff_parts  # noqa: E402  (re-exported: its documented home)
