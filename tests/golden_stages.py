"""Stage calls whose snapshots, written by earlier releases, are kept under tests/golden/stages/
(see tests/test_upgrade.py): an upgrade must find and read them, computing nothing.

Do not edit the two stages, their defaults or what they read: an upgrade finds a snapshot by the
fingerprint of the stage's code, which must stay the one the releases computed. They read no
library (a library's version is part of the fingerprint, and would change with the test
environment), only builtins.

Each release wrote its directory by importing this module (run as a script, fingerprint scheme 2
would name the stages ``__main__.golden_rows``), with the release's checkout first on the path
(``write`` uses only what every release since fingerprint scheme 2 has)::

    PYTHONPATH=<checkout of the release>:tests python -c \
        'import golden_stages as g; print(*g.write("<dir>", "<prefix>"))'
"""

from __future__ import annotations

from typing import Any

GOLDEN_ROWS = 24


def golden_rows(n, prefix="row"):
    for i in range(n):
        yield {
            "i": i,
            "half": i / 2,
            "even": i % 2 == 0,
            "text": f"{prefix} {i}",
            "raw": bytes([i]) * (i % 4),
        }


def golden_pairs(rows, step=2):
    for row in rows:
        if int(row["i"]) % step == 0:
            yield {"i": int(row["i"]) // step, "text": str(row["text"])}


def expected_rows(prefix: str, n: int = GOLDEN_ROWS) -> list[dict[str, Any]]:
    """What ``golden_rows(n, prefix)`` yields."""
    return list(golden_rows(n, prefix))


def write(root: str, prefix: str) -> tuple[str, str]:
    """Materialize ``golden_rows(GOLDEN_ROWS, prefix)`` and the pairs of it under ``root``;
    their fingerprints."""
    from snapstore import snapshot

    rows = snapshot(golden_rows, root=root)(GOLDEN_ROWS, prefix)
    rows.materialize()
    pairs = snapshot(golden_pairs, root=root)(rows)
    pairs.materialize()
    return rows.fingerprint, pairs.fingerprint
