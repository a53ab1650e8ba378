"""``snapstore verify``: read every block and check it."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
