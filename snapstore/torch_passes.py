"""Which epoch a pass of a DataLoader over a dataset reads, in whichever process reads it.

A DataLoader with workers never iterates its dataset in the main process: each pass runs in
worker processes, started anew for the pass (the default) or kept (``persistent_workers``). So
neither the main process nor a worker can count passes on its own. :class:`PassCounter` keeps
the count in a few words of shared memory that the dataset carries to its workers (inherited on
``fork``, sent as shared memory on ``spawn``):

- each pass is told apart by a token that every worker of the pass computes alike (the
  DataLoader's base seed for the pass, and the number of passes the worker has run);
- the first worker of a pass to arrive finds an older token and takes the next epoch (or the one
  :meth:`PassCounter.request` asked for); a later worker of the same pass finds its own token and
  takes the epoch recorded with it. Both write the same word, so no lock is needed: a record is
  one aligned 64-bit word, written and read whole.

Records are kept per rank (a dataset sent to the ranks of ``ddp_spawn`` shares its memory with
them): 64 slots, rank ``r`` in slot ``r % 64``.
"""

from __future__ import annotations

import hashlib
import operator
from typing import Any

import torch

__all__ = ["PassCounter", "hash_ints", "pass_token"]

_SLOTS = 64
_TOKEN_BITS = 24
_GEN_BITS = 8
_EPOCH_SHIFT = _TOKEN_BITS + _GEN_BITS
MAX_EPOCH = (1 << (63 - _EPOCH_SHIFT)) - 2


def hash_ints(*parts: int) -> int:
    """A 64-bit hash of some integers, the same in every process (no ``PYTHONHASHSEED``)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def pass_token(*parts: int) -> int:
    """A 24-bit token, never 0, from integers that identify a pass."""
    return hash_ints(*parts) % ((1 << _TOKEN_BITS) - 1) + 1


def _pack(epoch: int, gen: int, token: int) -> int:
    return ((epoch + 1) << _EPOCH_SHIFT) | (gen << _TOKEN_BITS) | token


def _unpack(word: int) -> tuple[int, int, int]:
    """(epoch or -1 when empty, generation, token)."""
    epoch = (word >> _EPOCH_SHIFT) - 1
    return epoch, (word >> _TOKEN_BITS) & ((1 << _GEN_BITS) - 1), word & ((1 << _TOKEN_BITS) - 1)


class PassCounter:
    """The epoch of each pass, shared by a dataset's copies in its DataLoader's processes.

    Parameters
    ----------
    first : int
        The epoch of the first pass, unless :meth:`request` asks for another.
    """

    def __init__(self, first: int = 0) -> None:
        self.first = operator.index(first)
        # Row 0: each rank's last pass (epoch, the request it used, token); row 1: the epoch
        # asked for by request() with its generation. Shared memory from the start, so that a
        # forked worker writes where its parent and siblings read.
        words = torch.zeros((2, _SLOTS), dtype=torch.int64)
        self._words = words.share_memory_()  # type: ignore[no-untyped-call]

    def __getstate__(self) -> dict[str, Any]:
        # Sent to a DataLoader worker, the tensor travels as shared memory (torch's pickler for
        # processes); pickled otherwise (a checkpoint, Ray), it travels as a copy.
        return {"first": self.first, "_words": self._words}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.first, self._words = state["first"], state["_words"]
        if not self._words.is_shared():  # a copy: make it shared again for its own workers
            self._words = self._words.clone().share_memory_()

    def request(self, epoch: int) -> None:
        """Read epoch ``epoch`` at the next pass (of every rank that shares this counter)."""
        if not 0 <= epoch <= MAX_EPOCH:
            raise ValueError(f"expected an epoch in [0, {MAX_EPOCH}], found {epoch}")
        requests = self._words[1]
        _, gen, _ = _unpack(int(requests[0]))
        word = _pack(epoch, (gen + 1) % (1 << _GEN_BITS) or 1, 1)
        requests.fill_(word)

    def requested(self, rank: int = 0) -> int | None:
        """The epoch :meth:`request` asked for, if no pass of ``rank`` has read it yet."""
        slot = rank % _SLOTS
        epoch, gen, _ = _unpack(int(self._words[1, slot]))
        _, used, _ = _unpack(int(self._words[0, slot]))
        return epoch if epoch >= 0 and gen != used else None

    def next_epoch(self, rank: int = 0) -> int:
        """The epoch the next pass of ``rank`` will read, as :meth:`start` would decide it."""
        asked = self.requested(rank)
        if asked is not None:
            return asked
        last, _, _ = _unpack(int(self._words[0, rank % _SLOTS]))
        return self.first if last < 0 else last + 1

    def start(self, token: int, rank: int = 0, epoch: int | None = None) -> int:
        """The epoch of the pass ``token`` of ``rank``, recorded for the other workers of the
        pass and for the next one. ``epoch`` (a resumed state's) overrides the count."""
        slot = rank % _SLOTS
        passes = self._words[0]
        last, used, seen = _unpack(int(passes[slot]))
        if seen == token and epoch is None:
            return last  # another worker of this pass decided already
        request_epoch, gen, _ = _unpack(int(self._words[1, slot]))
        if epoch is None:
            if request_epoch >= 0 and gen != used:
                epoch, used = request_epoch, gen
            else:
                epoch = self.first if last < 0 else last + 1
        elif request_epoch >= 0:
            used = gen  # a resumed epoch answers any request made before it
        passes[slot] = _pack(min(epoch, MAX_EPOCH), used, token)
        return epoch
