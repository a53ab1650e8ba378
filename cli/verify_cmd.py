"""``snapstore verify``: read every block and check it."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from snapstore.manage.catalog import list_fingerprints, resolve_fingerprint
from snapstore.manage.verify import SharedChecks, VerifyReport, verify_snapshot

from .common import Context, human_bytes, no_snapshots

__all__ = ["COMMANDS"]


class _Progress:
    """A click progress bar on stderr for one snapshot, shown only when stderr is a terminal
    (created on the first report, when the total is known)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty()
        self._bar: Any = None
        self._done = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            self._bar = click.progressbar(length=max(total, 1), label=self.label, file=sys.stderr)
            self._bar.__enter__()
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _format_report(report: VerifyReport) -> list[str]:
    state = "OK" if report.ok else "FAILED"
    reused = (
        f" ({human_bytes(report.bytes_reused)} in partitions checked before)"
        if report.bytes_reused
        else ""
    )
    counts = f"{report.blocks} block(s), {human_bytes(report.bytes)}{reused}, {report.seconds:.2f}s"
    if report.errors:
        counts += f", {len(report.errors)} problem(s)"
    if report.warnings:
        counts += f", {len(report.warnings)} warning(s)"
    lines = [f"{state:<7} {report.fingerprint}  {counts}"]
    for p in report.problems:
        level = "warning" if p in report.warnings else "error"
        lines.append(f"  {level} {p['kind']}: {p['message']}")  # messages name shard and offset
    return lines


@click.command("verify")
@click.argument("fingerprints", nargs=-1)
@click.option("--all", "verify_all", is_flag=True, help="Verify every committed snapshot.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Reads in flight at once.",
)
@click.pass_obj
def verify_command(
    obj: Context, fingerprints: tuple[str, ...], verify_all: bool, as_json: bool, jobs: int
) -> None:
    """Read every block of snapshots and check it; report every problem.

    Checks the commit record, manifest and block index, each shard's size, magic and footer,
    and each block's length, checksum, decoding and row count. Files in a run directory that
    the manifest does not name are reported as warnings. A partition several snapshots share
    is read once. Exit status 1 if any snapshot fails.
    """
    if verify_all == bool(fingerprints):
        raise click.UsageError("give fingerprints (or unique prefixes) or --all, not both")
    store = obj.store
    if verify_all:
        resolved = list_fingerprints(store)
    else:  # every name resolves before anything is read
        resolved = list(dict.fromkeys(resolve_fingerprint(store, p) for p in fingerprints))
    reports = []
    checked = SharedChecks()  # a partition several of them share is read once
    for fp in resolved:
        progress = _Progress(fp[:12])
        try:
            report = verify_snapshot(store, fp, progress=progress, jobs=jobs, checked=checked)
        finally:
            progress.close()
        reports.append(report)
        if not as_json:
            click.echo("\n".join(_format_report(report)))
    failed = sum(not r.ok for r in reports)
    if as_json:
        data = {
            "root": store.url,
            "snapshots": [r.to_json() for r in reports],
            "partitions": len(checked.partitions),
        }
        click.echo(json.dumps(data, indent=2))
    elif not reports:
        click.echo(no_snapshots(store))
    else:
        shared = len(checked.partitions)
        once = f"; {shared} shared partition(s), each read once" if shared else ""
        click.echo(f"{len(reports)} snapshot(s) verified, {failed} failed{once}")
    if failed:
        sys.exit(1)


COMMANDS: list[click.Command] = [verify_command]
