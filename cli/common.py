"""What the commands share: the root, tables and humanized sizes."""

from __future__ import annotations

from snapstore.store import Store, default_root, open_store

__all__ = ["Context", "human_bytes", "table"]


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
    def __init__(self, root: str | None) -> None:
        self.root = root or default_root()
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.root)
        return self._store
