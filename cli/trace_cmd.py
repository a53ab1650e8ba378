"""``snapstore trace summary`` and ``trace merge``: a trace's verdict, and its parts joined.

A trace is recorded with ``$SNAPSTORE_TRACE``, ``snapstore.trace(path)`` or ``snapstore bench
--trace PATH`` (see docs/guide/where-the-time-goes.md); these commands read it and need no root.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from snapstore import tracing
from snapstore.verdict import analyze, check_events

from .inspect_cmd import Rate

__all__ = ["COMMANDS"]

# Problems of the trace event format shown before a summary: enough to see what is wrong.
_SHOWN_PROBLEMS = 3


def _existing(path: str) -> Path:
    """``path`` if it is a trace file or has parts, else a usage error naming both places."""
    found = Path(path)
    parts = tracing.parts_dir(found)
    if not found.is_file() and not any(parts.glob("*.jsonl")):
        raise click.BadParameter(
            f"no trace at {path}: expected a trace file there or its parts in {parts}/",
            param_hint="PATH",
        )
    return found


@click.group("trace")
def trace_group() -> None:
    """Read traces of what snapstore did: the verdict on what limits training, or the parts
    of a trace merged into one file."""


@trace_group.command("summary")
@click.argument("path")
@click.option(
    "--bandwidth",
    type=Rate(),
    default=None,
    help="The most the store or the link delivers (e.g. 1.25GB/s): reads near it are "
    "bandwidth-bound (a trace alone cannot tell).",
)
@click.option(
    "--cpus",
    type=click.IntRange(min=1),
    default=None,
    help="The cores of the machine that read, if known: readers keeping nearly all of them "
    "busy are CPU-bound whatever their settings.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def summary_command(path: str, bandwidth: float | None, cpus: int | None, as_json: bool) -> None:
    """Say where the time of the trace PATH went, and what limits: the input-bound share, the
    reader's stages, the bottleneck with the setting to change.

    PATH is a merged trace, or one still in parts (PATH.parts/), as a job left it.
    """
    found = _existing(path)
    try:
        events = tracing.read_events(found)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="PATH") from None
    problems = check_events(events)
    for problem in problems[:_SHOWN_PROBLEMS]:
        click.echo(f"warning: not trace event format: {problem}", err=True)
    verdict = analyze(events, bandwidth=bandwidth, cpus=cpus)
    if as_json:
        figures = {k: v for k, v in verdict.as_dict().items() if k != "trace"}
        click.echo(json.dumps({"trace": str(found), "events": len(events), **figures}, indent=2))
        return
    click.echo(verdict.text())


@trace_group.command("merge")
@click.argument("path")
@click.option(
    "--run",
    default=None,
    help="Only the parts of this run (their names start with it); default: all of them.",
)
def merge_command(path: str, run: str | None) -> None:
    """Merge the parts in PATH.parts/ into the trace file PATH (Chrome trace JSON).

    Processes append their parts as they go; the process that ends a trace merges them, but a
    worker that flushed after it, or a job killed before, leaves parts behind.
    """
    parts = tracing.parts_dir(path)
    found = sorted(parts.glob(f"{run or ''}*.jsonl")) if parts.is_dir() else []
    if not found:
        raise click.BadParameter(
            f"no parts of a trace in {parts}/"
            + (f" whose names start with {run!r}" if run else ""),
            param_hint="PATH",
        )
    merged = tracing.merge(path, run or "")
    with open(merged, encoding="utf-8") as f:
        events = len(json.load(f)["traceEvents"])
    click.echo(f"merged {events} events from {len(found)} part(s) into {merged}")


COMMANDS: list[click.Command] = [trace_group]
