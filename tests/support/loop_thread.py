"""An asyncio event loop in a thread of its own, for servers a test talks to synchronously."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class Loop:
    """An event loop running in its own daemon thread until `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Any, timeout: float = 10.0) -> Any:
        """Run `coroutine` on the loop and return its result (waiting up to `timeout` s)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
