"""Each worker's stream of control events, kept for a worker while its stream is closed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from elastic.driver.control.events import ControlEvent

MAX_UNDELIVERED = 16  # events kept for a worker whose stream is closed (the newest)


class ControlChannels:
    """Delivers control events to workers' open streams.

    An event for a worker whose stream is closed (reconnecting, or not yet found after a
    driver restart) is kept, the newest `MAX_UNDELIVERED`, and delivered when its stream opens
    again: a worker blocked in a collective of a broken round learns only from this message.
    """

    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[ControlEvent]] = {}
        self._undelivered: dict[str, list[ControlEvent]] = {}

    def open(self, worker_id: str) -> asyncio.Queue[ControlEvent]:
        """A new stream of `worker_id`'s events, starting with those kept for it."""
        queue: asyncio.Queue[ControlEvent] = asyncio.Queue()
        for event in self._undelivered.pop(worker_id, []):
            queue.put_nowait(event)
        self._queues[worker_id] = queue
        return queue

    def close(self, worker_id: str, queue: asyncio.Queue[ControlEvent]) -> bool:
        """The stream of `queue` ended; False if it was an older stream of a worker that has
        opened a newer one since (which stays open)."""
        if self._queues.get(worker_id) is not queue:
            return False
        del self._queues[worker_id]
        return True

    def send(self, event: ControlEvent, worker_ids: Iterable[str]) -> None:
        """Deliver `event` to each worker, or keep it until its stream opens."""
        for worker_id in worker_ids:
            queue = self._queues.get(worker_id)
            if queue is not None:
                queue.put_nowait(event)
            else:
                kept = self._undelivered.setdefault(worker_id, [])
                kept.append(event)
                del kept[:-MAX_UNDELIVERED]

    def forget(self, worker_id: str) -> None:
        """`worker_id` exited: drop what was kept for it."""
        self._undelivered.pop(worker_id, None)
