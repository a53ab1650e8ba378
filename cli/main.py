"""``snapstore``: list, inspect, compare and remove snapshots.

Every command takes ``--root`` (default ``$SNAPSTORE_ROOT``, else the per-user cache directory)
and prints a human table, or JSON with ``--json``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from snapstore.catalog import describe, diff_snapshots, list_snapshots, remove_snapshot
from snapstore.errors import SnapstoreError
from snapstore.snapshot import resolve_fingerprint

from .common import Context, human_bytes, table

__all__ = ["main"]


class _Group(click.Group):
    """Turns snapstore's errors into one line on stderr and exit status 1, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SnapstoreError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    envvar="SNAPSTORE_ROOT",
    default=None,
    metavar="URL",
    help="Where snapshots live (local path or fsspec URL). [env: SNAPSTORE_ROOT]",
)
@click.option("-v", "--verbose", is_flag=True, help="Log what snapstore does.")
@click.pass_context
def main(ctx: click.Context, root: str | None, verbose: bool) -> None:
    """Manage snapstore snapshots: materialized outputs of preprocessing stages."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    ctx.obj = Context(root)


@main.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_obj
def ls_command(obj: Context, as_json: bool) -> None:
    """List the snapshots under the root."""
    infos = list_snapshots(obj.store)
    if as_json:
        click.echo(json.dumps({"root": obj.store.url, "snapshots": infos}, indent=2))
        return
    if not infos:
        click.echo(f"no snapshots under {obj.store.url}")
        return
    rows = [
        [
            i["fingerprint"][:12],
            i.get("stage") or "-",
            (i.get("created_at") or "-")[:19],
            str(i.get("samples", "-")),
            human_bytes(i["bytes"]),
            i["state"],
        ]
        for i in infos
    ]
    click.echo(table(rows, ["FINGERPRINT", "STAGE", "CREATED", "SAMPLES", "SIZE", "STATE"]))
    total = sum(i["bytes"] for i in infos)
    click.echo(f"{len(infos)} snapshot(s), {human_bytes(total)} under {obj.store.url}")


@main.command("info")
@click.argument("fingerprint")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.pass_obj
def info_command(obj: Context, fingerprint: str, as_json: bool) -> None:
    """Show one snapshot: schema, counts, sizes, fingerprint parts."""
    info = describe(obj.store, resolve_fingerprint(obj.store, fingerprint, committed_only=False))
    click.echo(json.dumps(info, indent=2) if as_json else _format_info(info))
    if info["state"] != "committed":
        sys.exit(1)


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
        f"on store     {human_bytes(info['bytes'])} ({info['runs']} run(s))",
        f"version      {info['version'] or '-'}",
        "schema:",
    ]
    for field in info["schema"]:
        shape = (
            ""
            if field["kind"] != "array"
            else "[" + ",".join("*" if d is None else str(d) for d in field["shape"]) + "]"
        )
        lines.append(f"  {field['name']:<20} {field.get('dtype') or field['kind']}{shape}")
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


@main.command("rm")
@click.argument("fingerprints", nargs=-1, required=True)
@click.option("--dry-run", is_flag=True, help="Show what would be removed, remove nothing.")
@click.pass_obj
def rm_command(obj: Context, fingerprints: tuple[str, ...], dry_run: bool) -> None:
    """Remove snapshots, committed or left incomplete (by fingerprint or unique prefix)."""
    resolved = [resolve_fingerprint(obj.store, p, committed_only=False) for p in fingerprints]
    total = 0
    for fp in dict.fromkeys(resolved):  # all names resolve before anything is removed
        freed = describe(obj.store, fp)["bytes"] if dry_run else remove_snapshot(obj.store, fp)
        total += freed
        click.echo(f"{'would remove' if dry_run else 'removed'} {fp}  {human_bytes(freed)}")
    click.echo(f"{'would free' if dry_run else 'freed'} {human_bytes(total)}")


def _register() -> None:
    """Add the commands that live in their own modules."""
    from . import copy_cmd, inspect_cmd, verify_cmd

    for module in (verify_cmd, copy_cmd, inspect_cmd):
        for command in module.COMMANDS:
            main.add_command(command)


_register()

if __name__ == "__main__":
    main()
