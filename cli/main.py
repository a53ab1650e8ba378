"""``snapstore``: list, inspect, compare and remove snapshots.

Every command takes ``--root`` (default ``$SNAPSTORE_ROOT``, else the per-user cache directory)
and prints a human table, or JSON with ``--json``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import time
from typing import Any

import click

from snapstore.errors import BusyError, SnapstoreError
from snapstore.format.schema import Field
from snapstore.manage.catalog import (
    describe,
    diff_snapshots,
    list_snapshots,
    list_snapshots_sharing,
    remove_snapshot,
    resolve_fingerprint,
)
from snapstore.manage.gc import Policy, collect_garbage, last_used, select_snapshots
from snapstore.manage.release import PartitionRelease, partitions_of, release_partitions
from snapstore.manage.verify import verify_snapshot
from snapstore.storage.retry import RetryPolicy

from .common import (
    Context,
    checked_root,
    human_bytes,
    no_snapshots,
    parse_duration,
    parse_options,
    parse_size,
    table,
)

__all__ = ["main"]


class _Group(click.Group):
    """Turns errors into one line on stderr and exit status 1; a traceback only with --debug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:  # `snapstore head ... | head -3`: the reader left, say nothing
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except Exception as exc:
            if isinstance(ctx.obj, Context) and ctx.obj.debug:
                raise
            if isinstance(exc, SnapstoreError):
                click.echo(f"error: {exc}", err=True)
            else:
                click.echo(
                    f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
                    err=True,
                )
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    envvar="SNAPSTORE_ROOT",
    default=None,
    metavar="URL",
    callback=checked_root,
    help="Where snapshots live (local path or fsspec URL). [env: SNAPSTORE_ROOT]",
)
@click.option(
    "-o",
    "--storage-option",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="fsspec storage option for --root, repeatable (endpoint_url=..., token=anon); "
    "values are JSON when they parse, else strings.",
)
@click.option(
    "--store-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Give up on a remote store that does not answer one operation (retries included) "
    "within this many seconds. [env: SNAPSTORE_STORE_TIMEOUT; default: 60]",
)
@click.option("-v", "--verbose", is_flag=True, help="Log what snapstore does.")
@click.option("--debug", is_flag=True, help="Show tracebacks, and log at debug level.")
@click.pass_context
def main(
    ctx: click.Context,
    root: str | None,
    storage_options: tuple[str, ...],
    store_timeout: float | None,
    verbose: bool,
    debug: bool,
) -> None:
    """Manage snapstore snapshots: materialized outputs of preprocessing stages."""
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(message)s")
    retry = None if store_timeout is None else RetryPolicy(timeout=store_timeout)
    ctx.obj = Context(root, parse_options(storage_options), retry)
    ctx.obj.debug = debug


SORT_KEYS = {
    "created": lambda i: i.get("created_at") or "",
    "read": lambda i: i.get("last_read") or "",
    "last-used": last_used,  # the later of the last read and the creation: gc's order
    "size": lambda i: i["bytes"],
    "stage": lambda i: i.get("stage") or "",
    "samples": lambda i: i.get("samples") or 0,
}


@main.command("ls")
@click.option("--stage", default=None, help="Only snapshots of this stage (substring match).")
@click.option(
    "--older-than", default=None, help="Only snapshots created before this long ago (7d, 12h)."
)
@click.option("--larger-than", default=None, help="Only snapshots larger than this (500MB, 2GiB).")
@click.option(
    "--sort",
    "sort_by",
    type=click.Choice(sorted(SORT_KEYS)),
    default="created",
    show_default=True,
    help="Order by creation, last use (the later of the last read and the creation: the order "
    "gc --keep-last keeps by), last read, size, stage or samples.",
)
@click.option("--reverse", is_flag=True, help="Reverse the order.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def ls_command(
    obj: Context,
    stage: str | None,
    older_than: str | None,
    larger_than: str | None,
    sort_by: str,
    reverse: bool,
    as_json: bool,
) -> None:
    """List the snapshots under the root: who made them, when, how big, whether in use.

    CREATED and LAST READ are UTC. CREATED is to the second; LAST READ is recorded to the
    hour (one marker per hour a reader opened the snapshot), so 2026-11-24T12:00:00 means a
    read between 12:00 and 13:00 UTC.
    """
    infos, sharing = list_snapshots_sharing(obj.store)
    if stage is not None:
        infos = [i for i in infos if stage in (i.get("stage") or "")]
    if older_than is not None:
        cutoff = time.time() - parse_duration(older_than)
        infos = [i for i in infos if 0 < _created(i) < cutoff]  # incomplete ones have no time
    if larger_than is not None:
        limit = parse_size(larger_than)
        infos = [i for i in infos if i["bytes"] > limit]
    infos.sort(key=SORT_KEYS[sort_by], reverse=reverse)
    # Each snapshot's bytes include its partitions; a partition several share counts once.
    own = sum(i["bytes"] - i.get("partition_bytes", 0) for i in infos)
    total = own + sharing.bytes_once(i["fingerprint"] for i in infos)
    if as_json:
        payload = {"root": obj.store.url, "snapshots": infos, "total_bytes": total}
        click.echo(json.dumps(payload, indent=2))
        return
    if not infos:
        click.echo(no_snapshots(obj.store))
        return
    rows = [
        [
            i["fingerprint"][:12],
            i.get("stage") or "-",
            (i.get("created_at") or "-")[:19],
            (i.get("last_read") or "-")[:19],  # the hour, written as CREATED is
            str(i.get("samples", "-")),
            human_bytes(i["bytes"]),
            _partitions_cell(i),
            _state(i),
        ]
        for i in infos
    ]
    header = ["FINGERPRINT", "STAGE", "CREATED", "LAST READ", "SAMPLES", "SIZE", "PARTS", "STATE"]
    if not any(i.get("partitions") for i in infos):  # the column only where it says something
        rows, header = [r[:6] + r[7:] for r in rows], header[:6] + header[7:]
    click.echo(table(rows, header))
    shared = any(i.get("partitions_shared") for i in infos)
    click.echo(
        f"{len(infos)} snapshot(s), {human_bytes(total)} under {obj.store.url}"
        + (" (a partition several of them share counted once)" if shared else "")
    )


def _partitions_cell(info: dict[str, Any]) -> str:
    """PARTS of ``ls``: how many partitions, and how many another snapshot shares."""
    count, shared = info.get("partitions") or 0, info.get("partitions_shared") or 0
    if not count:
        return "-"
    return f"{count} ({shared} shared)" if shared else str(count)


def _created(info: dict[str, Any]) -> float:
    text = info.get("created_at")
    try:
        return dt.datetime.fromisoformat(text).timestamp() if text else 0.0
    except ValueError:
        return 0.0


def _state(info: dict[str, Any]) -> str:
    state = str(info["state"])
    parts = info.get("partitions_committed")
    done = "" if parts is None else f"{parts} partition(s) committed"
    if state == "writing":
        return f"writing ({info.get('writer', '?')}{'; ' + done if done else ''})"
    if done:
        return f"{state} ({done})"
    if info.get("readers"):
        return f"{state}, {info['readers']} reader(s)"
    return state


@main.command("info")
@click.argument("fingerprint")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--verify", "check", is_flag=True, help="Also read and check every block.")
@click.pass_obj
def info_command(obj: Context, fingerprint: str, as_json: bool, check: bool) -> None:
    """Show one snapshot: schema, counts, sizes, fingerprint parts, integrity."""
    info = describe(obj.store, resolve_fingerprint(obj.store, fingerprint, committed_only=False))
    if info["state"] == "committed":
        info["integrity"] = "commit record, manifest and block index valid; blocks not read"
        if check:
            report = verify_snapshot(obj.store, info["fingerprint"])
            info["integrity"] = (
                f"every block verified ({report.blocks} blocks)"
                if report.ok
                else f"FAILED: {len(report.errors)} problem(s); run `snapstore verify`"
            )
    elif info["state"] == "corrupt":
        info["integrity"] = f"FAILED: {info.get('error')}"
    click.echo(json.dumps(info, indent=2) if as_json else _format_info(info))
    if info["state"] != "committed" or str(info.get("integrity", "")).startswith("FAILED"):
        sys.exit(1)


def _partition_lines(info: dict[str, Any]) -> list[str]:
    """``info``'s partitions line: how many, and which other snapshots share some."""
    count = info.get("partitions") or 0
    if not count:
        return []
    others = info.get("shared_with") or []
    if not info.get("partition_bytes") and not others:  # a snapshot's own, <fp>/parts/<p>
        return [f"partitions   {count}"]
    if not others:
        return [f"partitions   {count}, none shared with another snapshot"]
    names = ", ".join(fp[:12] for fp in others[:5]) + (", ..." if len(others) > 5 else "")
    return [
        f"partitions   {count}, {info['partitions_shared']} shared "
        f"({human_bytes(info['shared_bytes'])}) with {len(others)} other snapshot(s): {names}"
    ]


def _format_info(info: dict[str, Any]) -> str:
    lines = [f"fingerprint  {info['fingerprint']}", f"state        {info['state']}"]
    if info["state"] != "committed":
        return "\n".join([*lines, f"error        {info.get('error', '-')}"])
    ratio = info["compression_ratio"]
    lines += [
        f"stage        {info['stage']}",
        f"created      {info['created_at']} on {info['host']}",
        f"samples      {info['samples']}",
        f"blocks       {info['blocks']} in {info['shards']} shard(s)",
        f"size         {human_bytes(info['stored_bytes'])} stored, "
        f"{human_bytes(info['raw_bytes'])} raw"
        f" ({ratio if ratio is not None else '-'}x)",
        f"on store     {human_bytes(info['bytes'])} ({info['runs']} run(s)"
        + (
            f"; {human_bytes(info['partition_bytes'])} of it in its partitions)"
            if info.get("partition_bytes")
            else ")"
        ),
        *_partition_lines(info),
        f"version      {info['version'] or '-'}",
        f"last read    {info.get('last_read') or 'never'}"
        + (f", {info['readers']} reader(s) now" if info.get("readers") else ""),
        f"integrity    {info.get('integrity', '-')}",
        "schema:",
    ]
    for field in info["schema"]:  # uint8[64,64,3], int, str | None, {w: int, h: int}...
        lines.append(f"  {field['name']:<20} {Field.from_json(field).describe()}")
    lines.append("fingerprint parts:")
    for name, digest in sorted(info["fingerprint_parts"].items()):
        lines.append(f"  {name:<20} {digest[:16]}")
    return "\n".join(lines)


@main.command("diff")
@click.argument("old")
@click.argument("new")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_obj
def diff_command(obj: Context, old: str, new: str, as_json: bool) -> None:
    """Say why NEW's fingerprint differs from OLD's, part by part."""
    a = resolve_fingerprint(obj.store, old)
    b = resolve_fingerprint(obj.store, new)
    result = diff_snapshots(obj.store, a, b)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{a[:12]} -> {b[:12]}")
    for sentence in result["differences"] or ["no fingerprint part differs"]:
        click.echo(f"  {sentence}")
    for line in _partition_diff_lines(result["partitions"]):
        click.echo(line)


def _partition_diff_lines(partitions: dict[str, list[str]] | None) -> list[str]:
    """``diff``'s partitions: counts and stage keys, then the new and dropped partitions by the
    first 12 digits of their fingerprints."""
    if partitions is None:
        return []
    counts = ", ".join(f"{len(partitions[k])} {k}" for k in ("shared", "new", "dropped"))
    old = {r.split("/")[0][:12] for r in partitions["shared"] + partitions["dropped"]}
    new = {r.split("/")[0][:12] for r in partitions["shared"] + partitions["new"]}
    sides = (old, new) if old != new else (old,)
    keys = " -> ".join(", ".join(sorted(k)) or "none" for k in sides)
    lines = [f"  partitions: {counts} (stage key {keys})"]
    for kind in ("new", "dropped"):
        refs = partitions[kind]
        if refs:
            shown = ", ".join(r.split("/")[1][:12] for r in refs[:8])
            more = f" and {len(refs) - 8} more" if len(refs) > 8 else ""
            lines.append(f"    {kind:<8} {shown}{more}")
    return lines


@main.command("rm")
@click.argument("fingerprints", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Show what would be removed, remove nothing.")
@click.option("--force", is_flag=True, help="Remove even snapshots that readers hold open.")
@click.pass_obj
def rm_command(obj: Context, fingerprints: tuple[str, ...], dry_run: bool, force: bool) -> None:
    """Remove snapshots, committed or left incomplete (by fingerprint or unique prefix).

    A snapshot that a reader holds open is kept (and the exit status is 1) unless --force.
    """
    resolved = [resolve_fingerprint(obj.store, p, committed_only=False) for p in fingerprints]
    total, kept = 0, 0
    for fp in dict.fromkeys(resolved):  # all names resolve before anything is removed
        if dry_run:
            info = describe(obj.store, fp)
            busy = info["readers"] and not force
            # Its shared partitions count only where no other snapshot or job holds them.
            plan = PartitionRelease()
            if not info["readers"]:
                plan = release_partitions(obj.store, partitions_of(obj.store, fp), exclude=fp,
                                          dry_run=True)  # fmt: skip
            size = info["bytes"] - info.get("partition_bytes", 0) + plan.bytes
            click.echo(f"{'would keep (in use)' if busy else 'would remove'} {fp}  "
                       f"{human_bytes(size)}")  # fmt: skip
            _echo_partitions(plan, "would remove")
            total += 0 if busy else size
            kept += bool(busy)
            continue
        released: list[PartitionRelease] = []
        try:
            freed = remove_snapshot(obj.store, fp, respect_pins=not force, report=released.append)
        except BusyError as exc:
            click.echo(f"kept {fp}: {exc}", err=True)
            kept += 1
            continue
        total += freed
        click.echo(f"removed {fp}  {human_bytes(freed)}")
        for release in released:
            _echo_partitions(release, "removed")
    click.echo(f"{'would free' if dry_run else 'freed'} {human_bytes(total)}")
    if kept:
        sys.exit(1)


def _echo_partitions(release: PartitionRelease, verb: str) -> None:
    """What removing a snapshot does to its shared partitions: one line, none if it has none."""
    if not release.removed and not release.kept:
        return
    why: dict[str, int] = {}
    for reason in release.kept.values():
        why[reason] = why.get(reason, 0) + 1
    kept = "; ".join(f"{reason} ({n})" for reason, n in why.items())
    click.echo(f"  shared partitions: {verb} {len(release.removed)} "
               f"({human_bytes(release.bytes)}) no other snapshot uses"
               + (f"; kept {len(release.kept)}: {kept}" if release.kept else ""))  # fmt: skip


@main.command("gc")
@click.option(
    "--older-than",
    default=None,
    help="Remove snapshots not used (read or created) for this long (7d, 12h).",
)
@click.option(
    "--keep-last",
    type=click.IntRange(min=0),
    default=None,
    help="Keep only the N most recently used (read, or created if later) snapshots of each stage.",
)
@click.option(
    "--max-size",
    default=None,
    help="Then remove least recently used snapshots until the rest fit (100GiB).",
)
@click.option(
    "--min-age",
    default="1h",
    show_default=True,
    help="Failed attempts younger than this are left alone (a writer may still run).",
)
@click.option(
    "--dry-run", is_flag=True, help="Show what would go and how much it frees; remove nothing."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_obj
def gc_command(
    obj: Context,
    older_than: str | None,
    keep_last: int | None,
    max_size: str | None,
    min_age: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove failed attempts, stale claims and pins; and snapshots by policy.

    Garbage (runs no commit record names, expired claims, pins of readers that are gone) always
    goes. Snapshots go only by the policies given, least recently used first, never one that a
    reader holds open or a job is writing.
    """
    policy = Policy(
        older_than=parse_duration(older_than) if older_than else None,
        keep_last=keep_last,
        max_size=parse_size(max_size) if max_size else None,
    )
    store = obj.store
    garbage = collect_garbage(store, min_age=parse_duration(min_age), dry_run=dry_run)
    chosen = select_snapshots(list_snapshots(store), policy)
    removed = []
    for info, reason in chosen:
        entry = {
            "fingerprint": info["fingerprint"],
            "stage": info.get("stage"),
            "bytes": info["bytes"],
            "reason": reason,
            "removed": False,
            "error": None,
        }
        if not dry_run:
            try:
                # What it freed: its shared partitions only where nothing else holds them.
                entry["bytes"] = remove_snapshot(store, info["fingerprint"])
                entry["removed"] = True
            except BusyError as exc:
                entry["error"] = str(exc)
        removed.append(entry)
    # Sizes of snapshots were taken after the garbage went; in a dry run it is still inside
    # them, so it must not be counted twice.
    chosen_dirs = tuple(f"{e['fingerprint']}/" for e in removed)
    counted = [g for g in garbage if not (dry_run and g.path.startswith(chosen_dirs))]
    freed = sum(g.bytes for g in counted) + sum(
        e["bytes"] for e in removed if e["removed"] or dry_run
    )
    if as_json:
        payload = {"root": store.url, "dry_run": dry_run,
                   "garbage": [g.as_dict() for g in garbage], "snapshots": removed,
                   "freed_bytes": freed}  # fmt: skip
        click.echo(json.dumps(payload, indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    for g in garbage:
        click.echo(f"{verb} {g.kind:9} {g.path}  {human_bytes(g.bytes)}  ({g.reason})")
    for e in removed:
        if e["error"]:
            click.echo(f"kept     {e['fingerprint'][:12]}  {e['error']}")
        else:
            click.echo(f"{verb} snapshot  {e['fingerprint'][:12]} {e['stage'] or '-'}  "
                       f"{human_bytes(e['bytes'])}  ({e['reason']})")  # fmt: skip
    click.echo(f"{'would free' if dry_run else 'freed'} {human_bytes(freed)} under {store.url}")


def _register() -> None:
    """Add the commands that live in their own modules."""
    from . import copy_cmd, inspect_cmd, trace_cmd, verify_cmd

    for module in (verify_cmd, copy_cmd, inspect_cmd, trace_cmd):
        for command in module.COMMANDS:
            main.add_command(command)


_register()

if __name__ == "__main__":
    main()
