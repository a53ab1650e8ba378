"""``snapstore cp``: copy a committed snapshot between stores."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
