"""What is under a root: the snapshots, their summaries, and removing them.

These are the tools' views (the CLI's ``ls``, ``info`` and ``rm``); readers never list
directories, they start from a commit record.
"""

from __future__ import annotations

from typing import Any

from . import format as fmt
from .errors import FormatError
from .reader import load_manifest
from .store import Store

__all__ = ["describe", "list_snapshots", "remove_snapshot"]


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
