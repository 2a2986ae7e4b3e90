"""Waiting on the event loop for a condition over state that `notify()` announces changes to."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ChangeNotifier:
    """Coroutines wait until a predicate holds; whoever changes the state calls `notify()`."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """Wake every waiter so it re-checks its predicate."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Return True as soon as `ready()` holds, False if it still fails after `timeout` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return ready()
        return True
