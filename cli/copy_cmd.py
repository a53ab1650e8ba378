"""``snapstore cp``: copy a committed snapshot between stores."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from snapstore.manage.catalog import resolve_fingerprint
from snapstore.manage.copy import CopyResult, copy_snapshot
from snapstore.storage.store import open_store

from .common import Context, checked_root, human_bytes, parse_options

__all__ = ["COMMANDS", "cp_command"]


class _Bar:
    """A progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._shown = 0

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = click.progressbar(
                length=total, label="copying", file=sys.stderr, show_pos=False, show_percent=True
            )
            self._bar.__enter__()
        self._bar.update(done - self._shown)
        self._shown = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)


def _summary(result: CopyResult) -> str:
    if result.already_present:
        return f"{result.fingerprint} is already present at {result.destination}; nothing copied"
    resumed = f", {human_bytes(result.bytes_skipped)} already there" if result.bytes_skipped else ""
    parts = result.partitions_copied + result.partitions_present
    if parts:
        resumed += (
            f" ({result.partitions_copied} of its {parts} partition(s) copied, "
            f"{result.partitions_present} already there)"
        )
    rate = result.bytes_copied / result.seconds if result.seconds > 0 else 0.0
    return (
        f"copied {result.fingerprint} to {result.destination}: "
        f"{human_bytes(result.bytes_copied)} in {result.files} file(s){resumed}, "
        f"{result.seconds:.1f} s ({human_bytes(rate)}/s)"
    )


@click.command("cp")
@click.argument("fingerprint")
@click.argument("dest_root", metavar="DEST_ROOT", callback=checked_root)
@click.option(
    "--dest-option",
    "dest_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=lambda _ctx, _param, pairs: parse_options(pairs, "--dest-option"),
    help="Storage option for DEST_ROOT (repeatable); VALUE is parsed as JSON when it can be.",
)
@click.option(
    "--jobs", type=click.IntRange(min=1), default=8, show_default=True, help="Shards at once."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a summary line.")
@click.pass_obj
def cp_command(
    obj: Context, fingerprint: str, dest_root: str, dest_options: dict[str, Any], jobs: int,
    as_json: bool,
) -> None:  # fmt: skip
    """Copy the committed snapshot FINGERPRINT (or a unique prefix) from --root to DEST_ROOT.

    Every block is checked against its checksum on the way. An interrupted copy resumes where
    it stopped when run again; the snapshot appears at DEST_ROOT only once complete. A snapshot
    made of shared partitions is copied with them, except those DEST_ROOT already holds.
    """
    source = obj.store
    full = resolve_fingerprint(source, fingerprint)
    dest = open_store(dest_root, retry=obj.retry, **dest_options)
    bar = _Bar() if sys.stderr.isatty() else None
    try:
        result = copy_snapshot(source, full, dest, jobs=jobs, progress=bar)
    finally:
        if bar is not None:
            bar.close()
        dest.close()
    click.echo(json.dumps(result.to_json(), indent=2) if as_json else _summary(result))


COMMANDS: list[click.Command] = [cp_command]
