"""``snapstore head``, ``bench`` and ``du``."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
