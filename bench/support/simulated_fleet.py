"""The client processes of simulated workers (`simulated_workers`) as one fleet, seen from the
benchmark that drives a real driver against them: which worker runs where, what each reported
in the current trial (rounds formed, told, evicted, retries), and the deaths it orders.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from bench.support.simulated_job import Changes, ClientProcess


class Fleet:
    """The client processes, and what their simulated workers reported in the current trial."""

    def __init__(self, processes: int, start_spread: float = 0.0, seed: int = 0) -> None:
        """`start_spread`: each worker starts after a random delay up to that many seconds
        after its launch (0: at once)."""
        self.clients = [ClientProcess(self._on_report) for _ in range(processes)]
        self.start_spread = start_spread
        self._random = random.Random(seed)
        self.changes = Changes()
        self.stopped_all = 0
        self.reset()

    def reset(self) -> None:
        """Forget the previous trial."""
        self.owner: dict[str, ClientProcess] = {}
        self.launched: list[str] = []
        self.first_launch: float | None = None
        self.formed: dict[str, list[tuple[int, float]]] = {}  # id -> [(round, t)]
        self.told: dict[str, list[tuple[int, float]]] = {}  # id -> [(round it leaves, t)]
        self.killed: set[str] = set()  # died by the benchmark's hand
        self.stopped: set[str] = set()  # stopped by the driver (declared dead, job end)
        self.gone: set[str] = set()  # evicted (NOT_FOUND), left, or failed on their own
        self.errors: list[str] = []  # workers that failed on their own, before the job's end
        self.recording = True  # False once the job is stopping (its calls are cancelled)
        self.retries: Counter[str] = Counter()  # failed calls tried again, by call and code
        self.register_cancelled: set[str] = set()  # workers whose Register was CANCELLED
        self._target = 0
        self._missing: set[str] = set()

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.clients]

    async def start(self) -> None:
        for client in self.clients:
            await client.start()

    def why_broken(self) -> str | None:
        if not all(c.running for c in self.clients):
            return "a client process exited"
        return None

    def route(self, command: dict[str, Any]) -> None:
        """A launcher command from the driver: start a worker (round robin), or stop one."""
        worker_id = command.get("worker_id") or command["id"]
        if command["op"] == "start":
            command["delay"] = self.start_spread * self._random.random()
            client = self.clients[len(self.launched) % len(self.clients)]
            self.owner[worker_id] = client
            self.launched.append(worker_id)
            if self.first_launch is None:
                self.first_launch = command["t"]
        else:
            self.stopped.add(worker_id)
            self._missing.discard(worker_id)
            client = self.owner[worker_id]
        client.send(command)
        self.changes.notify()

    def kill(self, ids: list[str]) -> None:
        """Those workers die now (as SIGKILLed processes: no goodbye)."""
        groups: dict[ClientProcess, list[str]] = {}
        for worker_id in ids:
            groups.setdefault(self.owner[worker_id], []).append(worker_id)
        self.killed.update(ids)
        for client, group in groups.items():
            client.send({"op": "kill", "ids": group})

    def alive(self) -> list[str]:
        out = self.killed | self.stopped | self.gone
        return [i for i in self.launched if i not in out]

    def round_of(self, worker_id: str) -> int:
        formed = self.formed.get(worker_id)
        return formed[-1][0] if formed else 0

    def expect(self, ids: list[str], round_: int) -> None:
        """From now on `missing` counts those of `ids` not yet in `round_` or a later one."""
        out = self.stopped | self.gone
        self._target = round_
        self._missing = {i for i in ids if self.round_of(i) < round_ and i not in out}

    @property
    def missing(self) -> int:
        return len(self._missing)

    def _on_report(self, doc: dict[str, Any]) -> None:
        event = doc["ev"]
        if event == "formed":
            self.formed.setdefault(doc["id"], []).append((doc["epoch"], doc["t"]))
            if doc["epoch"] >= self._target:
                self._missing.discard(doc["id"])
        elif event == "told":
            self.told.setdefault(doc["id"], []).append((doc["epoch"], doc["t"]))
        elif event in ("evicted", "left", "error"):
            self.gone.add(doc["id"])
            self._missing.discard(doc["id"])
            if event != "left" and self.recording:
                self.errors.append(f"{doc['id']}: {doc.get('error', event)}")
        elif event == "retry" and self.recording:
            self.retries[doc["what"]] += 1
            if doc["what"] == "Register CANCELLED":
                self.register_cancelled.add(doc["id"])
        elif event == "stopped_all":
            self.stopped_all += 1
        self.changes.notify()

    async def stop_all(self) -> None:
        """Stop every simulated worker left, in every client process."""
        before = self.stopped_all
        for client in self.clients:
            client.send({"op": "stop_all"})
        target = before + len(self.clients)
        await self.changes.wait(lambda: self.stopped_all >= target, "stop_all", 120)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
