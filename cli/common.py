"""What the commands share: the root, tables and humanized sizes."""

from __future__ import annotations

import json
import re
from typing import Any

import click

from snapstore.storage.listing import root_missing
from snapstore.storage.roots import check_root
from snapstore.storage.store import RetryPolicy, Store, default_root, open_store

__all__ = [
    "Context",
    "checked_root",
    "human_bytes",
    "no_snapshots",
    "parse_duration",
    "parse_options",
    "parse_size",
    "table",
]


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]
    ]
    return "\n".join(lines)


class Context:
    """The root the command works on, opened on first use with the storage options and the
    retry policy (``--store-timeout``; None: the default, or ``$SNAPSTORE_STORE_TIMEOUT``)."""

    def __init__(
        self,
        root: str | None,
        options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.root = root if root is not None else default_root()
        self.options = dict(options or {})
        self.retry = retry
        self.debug = False
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.root, retry=self.retry, **self.options)
        return self._store


def checked_root(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: a root that the library would refuse (``--root ''``, which would be the
    working directory) is a usage error naming the option."""
    name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
    try:
        check_root(value, name)
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc), ctx) from None
    return value


def no_snapshots(store: Store) -> str:
    """What an empty listing prints: says so when the root does not exist (a mistyped path)."""
    if root_missing(store):
        return (
            f"no snapshots under {store.url}: the directory does not exist (yet); check the "
            "path if you expected snapshots there (--root or $SNAPSTORE_ROOT)"
        )
    return f"no snapshots under {store.url}"


def parse_options(pairs: tuple[str, ...], option: str = "--storage-option") -> dict[str, Any]:
    """``("key=value", ...)`` as storage options; a value is JSON when it parses, else a string.

    Raises
    ------
    click.BadParameter
        If a pair has no ``=`` or an empty key.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY=VALUE (e.g. endpoint_url=http://host:4443), got {pair!r}",
                param_hint=f"'{option}'",
            )
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


_SIZE_UNITS = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
    "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
    "tib": 1 << 40,
}  # fmt: skip
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _split(text: str) -> tuple[float, str]:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match:
        raise ValueError(text)
    return float(match.group(1)), match.group(2).lower()


def parse_size(text: str) -> int:
    """'10GiB' -> 10737418240; '500MB' -> 500000000; '1024' -> 1024 (bytes)."""
    try:
        number, unit = _split(text)
        return int(number * _SIZE_UNITS[unit])
    except (ValueError, KeyError):
        raise click.BadParameter(
            f"expected a size such as 500MB, 10GiB or 1024 (bytes), found {text!r}"
        ) from None


def parse_duration(text: str) -> float:
    """'7d' -> 604800.0; '12h', '30m', '45s' or plain seconds."""
    try:
        number, unit = _split(text)
        return number * _DURATION_UNITS[unit]
    except (ValueError, KeyError):
        raise click.BadParameter(
            f"expected a duration such as 7d, 12h, 30m or 45s, found {text!r}"
        ) from None
