"""What is under a root: the snapshots, their summaries, and removing them.

These are the tools' views (the CLI's ``ls``, ``info`` and ``rm``); readers never list
directories, they start from a commit record.
"""

from __future__ import annotations

from typing import Any

from . import format as fmt
from .errors import FormatError
from .fingerprint import Fingerprint, diff_parts
from .reader import load_manifest
from .store import Store

__all__ = [
    "describe",
    "diff_snapshots",
    "list_snapshots",
    "previous_of_stage",
    "remove_snapshot",
    "stored_fingerprint",
]


def describe(store: Store, fingerprint: str) -> dict[str, Any]:
    """A JSON-able summary of one fingerprint's directory, committed or not.

    ``state`` is ``committed``, ``incomplete`` (runs without a commit: being written, or left by
    a crash) or ``corrupt`` (a commit record whose manifest does not validate; ``error`` says why).
    """
    runs = store.list_dir(f"{fingerprint}/runs")
    info: dict[str, Any] = {"fingerprint": fingerprint, "runs": len(runs)}
    if not store.exists(f"{fingerprint}/{fmt.COMMIT_NAME}"):
        info.update(state="incomplete", bytes=store.disk_usage(fingerprint))
        return info
    try:
        manifest = load_manifest(store, fingerprint)
    except FormatError as exc:
        info.update(state="corrupt", error=str(exc), bytes=store.disk_usage(fingerprint))
        return info
    raw, stored = int(manifest["raw_bytes"]), int(manifest["stored_bytes"])
    info.update(
        state="committed",
        stage=manifest.get("stage"),
        created_at=manifest.get("created_at"),
        host=manifest.get("host"),
        run=manifest.get("run"),
        samples=int(manifest["num_samples"]),
        blocks=int(manifest["num_blocks"]),
        shards=len(manifest["shards"]),
        raw_bytes=raw,
        stored_bytes=stored,
        compression_ratio=round(raw / stored, 3) if stored else None,
        bytes=store.disk_usage(fingerprint),
        schema=manifest["schema"],
        fingerprint_parts=manifest.get("fingerprint_parts", {}),
        fingerprint_details=manifest.get("fingerprint_details", {}),
        version=manifest.get("version"),
        format_version=manifest.get("format_version"),
    )
    return info


def list_snapshots(store: Store) -> list[dict[str, Any]]:
    """Summaries of every snapshot directory (committed or not) under the root, by fingerprint."""
    from .snapshot import list_fingerprints

    return [describe(store, name) for name in list_fingerprints(store, committed_only=False)]


def remove_snapshot(store: Store, fingerprint: str) -> int:
    """Remove a snapshot; returns the bytes freed.

    The commit record goes first, so the snapshot stops being visible in one step and a crash
    half-way leaves only unreferenced garbage, never a committed snapshot with missing shards.
    """
    freed = store.disk_usage(fingerprint)
    commit = f"{fingerprint}/{fmt.COMMIT_NAME}"
    if store.exists(commit):
        store.remove_tree(commit)
    store.remove_tree(fingerprint)
    return freed


def stored_fingerprint(store: Store, fingerprint: str) -> Fingerprint:
    """The fingerprint (digest, parts, details) recorded in a committed snapshot's manifest."""
    manifest = load_manifest(store, fingerprint)
    return Fingerprint(
        fingerprint,
        dict(manifest.get("fingerprint_parts") or {}),
        dict(manifest.get("fingerprint_details") or {}),
    )


def diff_snapshots(store: Store, a: str, b: str) -> dict[str, Any]:
    """Why snapshot ``b``'s fingerprint differs from ``a``'s, part by part.

    Returns
    -------
    dict
        ``{"a", "b", "differences": [sentences], "parts": {name: {"a", "b", "same"}}}``.
    """
    fa, fb = stored_fingerprint(store, a), stored_fingerprint(store, b)
    names = sorted(set(fa.parts) | set(fb.parts))
    parts = {
        n: {"a": fa.parts.get(n), "b": fb.parts.get(n), "same": fa.parts.get(n) == fb.parts.get(n)}
        for n in names
    }
    return {"a": a, "b": b, "differences": diff_parts(fa, fb), "parts": parts}


def previous_of_stage(store: Store, stage: str, exclude: str) -> str | None:
    """The most recently created committed snapshot of ``stage`` other than ``exclude``."""
    from .snapshot import list_fingerprints

    best: tuple[str, str] | None = None
    for fp in list_fingerprints(store):
        if fp == exclude:
            continue
        try:
            manifest = load_manifest(store, fp)
        except FormatError:
            continue  # a damaged snapshot explains nothing; `snapstore verify` reports it
        if manifest.get("stage") == stage:
            created = str(manifest.get("created_at", ""))
            if best is None or created > best[0]:
                best = (created, fp)
    return best[1] if best else None
