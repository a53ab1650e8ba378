"""Why two fingerprints differ, in sentences a person can act on.

:func:`diff_parts` compares the parts and details two
:class:`~snapstore.fingerprint.digest.Fingerprint` records hold (code per function and package, each
argument, input files, upstream snapshots, version, format): ``snapstore diff`` and the log line on
a cache miss print its sentences. It is re-exported as ``snapstore.fingerprint.digest.diff_parts``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["FingerprintParts", "diff_parts"]


class FingerprintParts(Protocol):
    """What :func:`diff_parts` reads of a :class:`~snapstore.fingerprint.digest.Fingerprint`
    (a protocol, so this module needs nothing of the one that hashes)."""

    @property
    def parts(self) -> dict[str, str]: ...

    @property
    def details(self) -> dict[str, Any]: ...


_PART_ORDER = ("scheme", "code", "arguments", "inputs", "upstream", "format", "version")


def _argument_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if a.get("key") or b.get("key"):
        return [f"arguments changed (as identified by key function {b.get('key')!r})"]
    old, new = a.get("arguments", {}), b.get("arguments", {})
    old_values, new_values = a.get("argument_values", {}), b.get("argument_values", {})
    out = []
    for arg in sorted(set(old) | set(new)):
        if arg not in new:
            now_ignored = arg in b.get("ignored", ())
            out.append(f"argument {arg!r} {'is now ignored' if now_ignored else 'removed'}")
        elif arg not in old:
            was_ignored = arg in a.get("ignored", ())
            out.append(f"argument {arg!r} {'is no longer ignored' if was_ignored else 'added'}")
        elif old[arg] != new[arg]:
            before, after = old_values.get(arg), new_values.get(arg)
            change = f" ({before} -> {after})" if before != after else ""
            out.append(f"argument {arg!r} changed{change}")
    return out or ["arguments changed"]


def _mapping_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], ...]:
    """Keys changed, added and removed between two mappings, each sorted."""
    changed = sorted(k for k in set(old) & set(new) if old[k] != new[k])
    return changed, sorted(set(new) - set(old)), sorted(set(old) - set(new))


def _code_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    ca, cb = a.get("code"), b.get("code")
    if not (isinstance(ca, dict) and isinstance(cb, dict)):  # scheme 1 kept no per-function details
        return [f"code of stage {b.get('stage')!r} changed"]
    changes = zip(
        ("changed", "added", "removed"), _mapping_changes(ca["functions"], cb["functions"])
    )
    out = [f"code: {key} {what}" for what, keys in changes for key in keys]
    old, new = ca["packages"], cb["packages"]
    changed, added, removed = _mapping_changes(old, new)
    out += [f"package {k} {old[k]} -> {new[k]}" for k in changed]
    out += [f"package {k} {new[k]} added" for k in added]
    out += [f"package {k} {old[k]} removed" for k in removed]
    if ca.get("ignored_globals") != cb.get("ignored_globals"):
        out.append(f"ignored globals changed ({ca['ignored_globals']} -> {cb['ignored_globals']})")
    return out or [f"code of stage {b.get('stage')!r} changed"]


def _declared_changes(part: str) -> Callable[[dict[str, Any], dict[str, Any]], list[str]]:
    def changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
        old, new = a.get(part, {}), b.get(part, {})
        out = []
        for arg in sorted(set(old) | set(new)):
            before, after = old.get(arg), new.get(arg)
            if before is None or after is None:
                out.append(f"{part} {arg!r} {'added' if before is None else 'removed'}")
            elif part == "upstream" and before != after:
                out.append(f"upstream {arg!r} changed ({before[:8]} -> {after[:8]})")
            elif part == "inputs" and before.get("digest") != after.get("digest"):
                out.append(f"inputs {arg!r}: {_input_counts(before, after)}")
        return out or [f"{part} changed"]

    return changes


def _input_counts(before: dict[str, Any], after: dict[str, Any]) -> str:
    if "items" not in before or "items" not in after:
        return (
            f"{after.get('count')} inputs changed (was {before.get('count')}; per-input "
            "details not stored)"
        )
    changed, added, removed = _mapping_changes(before["items"], after["items"])
    counts = [(len(changed), "changed"), (len(added), "added"), (len(removed), "removed")]
    return ", ".join(f"{n} {what}" for n, what in counts if n) or "changed"


def diff_parts(a: FingerprintParts, b: FingerprintParts) -> list[str]:
    """Sentences saying why ``b`` differs from ``a``, part by part.

    Code differences are named per function and package (``code: helpers.normalize changed``,
    ``package numpy 2.4.6 -> 2.5.0``), arguments per argument, inputs as counts of changed,
    added and removed inputs, upstream snapshots by fingerprint prefix.

    Returns
    -------
    list of str
        Empty when every part is equal, e.g. ``["argument 'max_len' changed (512 -> 1024)"]``.

    Examples
    --------
    >>> def f(n=1):
    ...     yield n
    >>> diff_parts(fingerprint_stage(f, (), {}, format_version=1),
    ...            fingerprint_stage(f, (2,), {}, format_version=1))
    ["argument 'n' changed (1 -> 2)"]
    """
    da, db = a.details, b.details
    known = [p for p in _PART_ORDER if p in a.parts or p in b.parts]
    explain: dict[str, Callable[[dict[str, Any], dict[str, Any]], list[str]]] = {
        "code": _code_changes,
        "arguments": _argument_changes,
        "inputs": _declared_changes("inputs"),
        "upstream": _declared_changes("upstream"),
    }
    scalars = {
        "format": ("format_version", "format version"),
        "scheme": ("scheme", "fingerprint scheme"),
        "version": ("version", "version"),
    }
    out: list[str] = []
    for part in known + sorted((set(a.parts) | set(b.parts)) - set(_PART_ORDER)):
        old, new = a.parts.get(part), b.parts.get(part)
        if old == new:
            continue
        if old is None or new is None:
            out.append(f"part {part!r} {'added' if old is None else 'removed'}")
        elif part in explain:
            out.extend(explain[part](da, db))
        elif part in scalars:
            field, label = scalars[part]
            before, after = da.get(field), db.get(field)
            if part == "version":
                before, after = repr(before), repr(after)
            out.append(f"{label} changed ({before} -> {after})")
        else:
            out.append(f"part {part!r} changed")
    return out
