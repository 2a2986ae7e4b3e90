"""What a round's asynchronous collectives hold: the names in flight and the deferred calls.

Horovod keys a collective by its name: a name is taken from the call until the operation is
done, and a second call of a name still taken is refused on the rank that makes it (see
`negotiation.py`). Here a name is taken from the call until its handle is synchronized; a
handle dropped without being synchronized gives its name back at the next cross-rank
exchange after it started (by then every rank has started the same operation).

A named asynchronous call that the other ranks do not make at the same moment is *deferred*:
it waits here, and starts when the other ranks call the same name (`negotiation.py`).
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["InFlight"]

_DEFERRED = -1  # `started_at` of a call that has not started yet


class InFlight:
    """The round's named asynchronous calls not yet synchronized, and the deferred ones.

    Truthy while any named call is in flight or deferred.
    """

    __slots__ = ("_named", "deferred", "exchanges")

    def __init__(self) -> None:
        # name -> (the handle, weakly; the exchange count when it started, or _DEFERRED)
        self._named: dict[str, tuple[weakref.ref[Any], int]] = {}
        self.deferred: list[Any] = []  # handles waiting for the other ranks, oldest first
        self.exchanges = 0  # cross-rank exchanges made in this round so far

    def taken(self, name: str) -> bool:
        """Whether `name` is held by a call in flight (a dropped handle's name is given back
        once an exchange followed its start)."""
        entry = self._named.get(name)
        if entry is None:
            return False
        ref, started_at = entry
        handle = ref()
        if handle is not None and not handle._done:
            return True
        if handle is None and started_at == self.exchanges:
            return True
        del self._named[name]
        return False

    def hold(self, name: str, handle: Any, deferred: bool = False) -> None:
        """`handle`'s call holds `name` from now on (started now, or deferred)."""
        self._named[name] = (weakref.ref(handle), _DEFERRED if deferred else self.exchanges)
        if deferred:
            self.deferred.append(handle)

    def started(self, name: str | None, handle: Any) -> None:
        """A deferred `handle` started now."""
        if handle in self.deferred:
            self.deferred.remove(handle)
        if name is not None:
            self._named[name] = (weakref.ref(handle), self.exchanges)

    def release(self, name: str | None, handle: Any) -> None:
        """`handle` is done (synchronized, or failed): its name is free again."""
        if handle in self.deferred:
            self.deferred.remove(handle)
        entry = self._named.get(name) if name is not None else None
        if entry is not None and entry[0]() is handle:
            del self._named[name]

    def __len__(self) -> int:
        return sum(1 for name in list(self._named) if self.taken(name)) + len(self.deferred)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.taken(name)
