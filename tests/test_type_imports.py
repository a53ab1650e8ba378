"""Imports for annotations only (under ``if TYPE_CHECKING:``) close no circle either.

:mod:`test_layers` leaves such imports out of its circle check: they never run. A type-only
import of a module that imports the first one back is still a circle in the design, hidden
from the interpreter: the lower module names the upper one. The lower module states what it
uses as a small ``typing.Protocol`` instead (:class:`snapstore.storage.trees.Listable`,
:class:`snapstore.fingerprint.explain.FingerprintParts`,
:class:`snapstore.fingerprint.codeid.ValueEncoder`), and mypy checks that the upper module's
class fits it where the two meet.
"""

from __future__ import annotations

import test_layers


def test_no_circle_through_a_type_only_import() -> None:
    full = test_layers._graph(type_checking=True)
    graph = {m: {t for t, _, _ in imports if t != m} for m, imports in full.items()}
    circle = test_layers._circle(graph)
    assert circle is None, (
        "import circle through a TYPE_CHECKING import: "
        + " -> ".join(circle or [])
        + "; describe what the lower module uses as a typing.Protocol of its own"
    )
