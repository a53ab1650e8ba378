"""Partition boundaries chosen by the inputs themselves, so that they stay put when inputs change.

Cutting a list of inputs into consecutive groups of ``k`` moves every later boundary when one
input is inserted near the front, and then every later partition is a new one. Here an input
ends its partition when a hash of its **name** (a file's stable name, or a plain input's value)
falls below ``1/k``: content-defined chunking, as deduplicating backups cut files into chunks.
Whether an input ends a partition depends on that input alone, so:

- inserting one input changes the partition it lands in (or splits it in two, when the new input
  ends a partition): at most 2 new partitions;
- deleting one input changes its partition (or merges it with the next, when it ended one): at
  most 2 partitions, 1 of them new;
- a prefix of the inputs, or any subset, keeps every partition all of whose members are there;
- an input whose content changed (same name) changes its own partition only.

Partitions hold ``k`` inputs on average, in a geometric distribution: about 5% hold more than
``3k``, and one in ``k`` holds a single input. There is no minimum or maximum size: either
would make a boundary depend on where the previous one fell, so that one insertion could move
boundaries far beyond it. ``k = 1`` makes every input a partition of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["BOUNDARY_SCHEME", "content_boundaries", "ends_partition"]

BOUNDARY_SCHEME = 1
"""Version of the rule below; a change moves boundaries (and so partition fingerprints)."""

_SPAN = 1 << 64


def ends_partition(name: str, size: int) -> bool:
    """Whether the input named ``name`` ends its partition, for partitions of about ``size``."""
    if size <= 1:
        return True
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=b"snapstore-cut").digest()
    return int.from_bytes(digest, "big") < _SPAN // size


def content_boundaries(names: Sequence[str], size: int) -> list[range]:
    """The partitions of inputs named ``names`` (in order), as ranges of their positions.

    Parameters
    ----------
    names : sequence of str
        One name per input, in the order the stage receives them.
    size : int
        The mean number of inputs per partition (``partition_size``), at least 1.

    Returns
    -------
    list of range
        Consecutive, covering ``range(len(names))``; empty for no inputs. The last partition
        ends at the last input whether or not its name ends one.

    Raises
    ------
    ValueError
        If ``size`` is below 1.
    """
    if size < 1:
        raise ValueError(f"partition_size: expected at least 1, found {size}")
    out: list[range] = []
    start = 0
    for i, name in enumerate(names):
        if ends_partition(name, size):
            out.append(range(start, i + 1))
            start = i + 1
    if start < len(names):
        out.append(range(start, len(names)))
    return out
