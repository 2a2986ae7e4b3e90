"""Forming an epoch's process group after an earlier attempt failed, with real processes.

A survivor whose group creation failed (a peer never came, or a newer epoch formed) must still
form the next group with a fresh joiner: torch names each default group from a per-process
counter, so both must start from the same name (soak seed 1 stalled with names "1" and "0").
"""

from __future__ import annotations

import multiprocessing
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from elastic.worker.group.process_group import CONNECT_TIMEOUT, abandon_group, create_group

pytestmark = pytest.mark.timeout(120)

CPU = torch.device("cpu")


def _reap(process: multiprocessing.process.BaseProcess, grace: float = 30) -> None:
    """Let `process` end within `grace` seconds, then SIGKILL it."""
    process.join(timeout=grace)
    if process.is_alive():
        process.kill()
        process.join(timeout=10)


def _rank_1(store_path: str, result: multiprocessing.Queue, patient: bool = False) -> None:
    """Form the group as rank 1 and all-reduce a one; `patient`: over a `PatientStore`, with
    a 1 s connection timeout, waiting 3 s (longer) before the all-reduce."""
    store = PatientStore(store_path) if patient else dist.FileStore(store_path, 2)
    try:
        if patient:
            create_group(store, 1, 2, CPU, timedelta(seconds=30), timedelta(seconds=1))
            time.sleep(3)  # longer than the connection timeout: collectives must not mind
        else:
            create_group(store, 1, 2, CPU, timedelta(seconds=20))
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        result.put(float(tensor.item()))
    except Exception as err:  # reported to the test, which fails with it
        result.put(repr(err))
    finally:
        abandon_group()


def test_a_group_forms_with_a_fresh_joiner_after_a_failed_attempt(tmp_path: Path) -> None:
    lonely = dist.FileStore(str(tmp_path / "epoch-1"), 2)
    with pytest.raises((RuntimeError, TimeoutError)):  # rank 1 never comes
        create_group(lonely, 0, 2, CPU, timedelta(seconds=1))
    assert not dist.is_initialized()

    context = multiprocessing.get_context("spawn")
    result: multiprocessing.Queue = context.Queue()
    joiner = context.Process(target=_rank_1, args=(str(tmp_path / "epoch-2"), result))
    joiner.start()
    try:
        # Waiting as the runtime's store waits (the round's timeout, not Gloo's 2 s connection
        # timeout): the spawned joiner imports torch first, over 2 s on a busy small machine.
        create_group(PatientStore(str(tmp_path / "epoch-2")), 0, 2, CPU, timedelta(seconds=20))
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        assert tensor.item() == 2.0
        assert result.get(timeout=30) == 2.0
    finally:
        abandon_group()
        _reap(joiner)


class PatientStore(dist.Store):
    """A FileStore whose waits last at least `floor`, as a `DriverStore`'s do (Gloo passes
    its shorter connection timeout)."""

    def __init__(self, path: str, floor: timedelta = timedelta(seconds=30)) -> None:
        super().__init__()
        self._store = dist.FileStore(path, 2)
        self._floor = floor

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)

    def add(self, key, amount):
        return self._store.add(key, amount)

    def check(self, keys):
        return self._store.check(keys)

    def num_keys(self):
        return self._store.num_keys()

    def delete_key(self, key):
        return self._store.delete_key(key)

    def compare_set(self, key, expected, desired):
        return self._store.compare_set(key, expected, desired)

    def wait(self, keys, timeout=None):
        self._store.wait(keys, max(timeout or self._floor, self._floor))


def _gone_peer(store_path: str) -> None:
    """Publish rank 1's address as Gloo does, then die before connecting."""
    create_group(PatientStore(store_path), 1, 2, CPU, timedelta(seconds=30), timedelta(seconds=1))


def test_the_group_s_collectives_wait_the_full_timeout_not_the_connection_s(
    tmp_path: Path,
) -> None:
    context = multiprocessing.get_context("spawn")
    result: multiprocessing.Queue = context.Queue()
    path = str(tmp_path / "epoch-1")
    peer = context.Process(target=_rank_1, args=(path, result, True))
    peer.start()
    try:
        create_group(PatientStore(path), 0, 2, CPU, timedelta(seconds=30), timedelta(seconds=1))
        tensor = torch.ones(1)
        dist.all_reduce(tensor)  # waits ~3 s for the peer: more than the connection timeout
        assert tensor.item() == 2.0
        assert result.get(timeout=30) == 2.0
    finally:
        abandon_group()
        _reap(peer)


def test_a_peer_that_dies_while_the_ranks_connect_fails_the_group_within_the_connection_timeout(
    tmp_path: Path,
) -> None:
    """Rank 1 publishes its address and is SIGKILLed while rank 0 connects to it: rank 0 raises
    RuntimeError after the connection timeout, not after the group's 60 s."""
    context = multiprocessing.get_context("spawn")
    path = str(tmp_path / "epoch-1")
    store = PatientStore(path)
    peer = context.Process(target=_gone_peer, args=(path,))
    peer.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and store.num_keys() < 2:
            time.sleep(0.05)  # rank 1 has written its address
        peer.kill()
        peer.join(timeout=10)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="connectFullMesh"):
            create_group(store, 0, 2, CPU, timedelta(seconds=60), timedelta(seconds=2))
        assert time.monotonic() - start < 30
        assert not dist.is_initialized()
    finally:
        _reap(peer, 0)


def _member_of_three(store_path: str, rank: int, result: multiprocessing.Queue) -> None:
    """Form a 3-rank group with the default connection timeout, then, a second later, all-reduce
    a one; report how it ended: the all-reduce's sum, or the error that ended it."""
    started = time.monotonic()
    try:
        store = PatientStore(store_path, floor=timedelta(seconds=12))
        create_group(store, rank, 3, CPU, timedelta(seconds=60))
        time.sleep(1)  # the test's kill comes first
        tensor = torch.ones(1)
        dist.all_reduce(tensor)
        result.put((rank, f"summed {tensor.item()}", time.monotonic() - started))
    except Exception as err:  # reported to the test
        result.put((rank, repr(err), time.monotonic() - started))
    finally:
        abandon_group()


def test_a_peer_gone_while_three_ranks_connect_holds_the_others_ten_seconds_at_most(
    tmp_path: Path,
) -> None:
    """Rank 1 of 3 is SIGKILLed once every address is published: the others fail within five
    connection timeouts (Gloo's side waiting for a peer to connect in waits that long; at the
    former 10 s timeout that was 50 s), or at once when their connection is refused. A store
    wait for a key the dead rank never wrote ends at the store's 12 s here; a `DriverStore`
    ends it with `RoundSuperseded` when the next round forms. A rank whose connections all
    completed before the kill has formed the group; its first all-reduce fails instead, as
    fast."""
    context = multiprocessing.get_context("spawn")
    path = str(tmp_path / "epoch-1")
    result: multiprocessing.Queue = context.Queue()
    members = [
        context.Process(target=_member_of_three, args=(path, rank, result)) for rank in range(3)
    ]
    for member in members:
        member.start()
    try:
        store = PatientStore(path)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and store.num_keys() < 3:
            time.sleep(0.005)  # every rank has published its address
        members[1].kill()
        ended = sorted(result.get(timeout=60) for _ in range(2))
        assert [rank for rank, _, _ in ended] == [0, 2]
        for rank, how, took in ended:
            assert not how.startswith("summed"), f"rank {rank} all-reduced with a dead peer"
            assert took < 5 * CONNECT_TIMEOUT.total_seconds() + 5, (rank, how, took)
    finally:
        for member in members:
            _reap(member, 10)


# A rank that forms a 2-rank group, starts an all-reduce its peer never joins (the peer is
# SIGSTOPped: silent, its connections open, as a vanished or partitioned host's), abandons the
# group as a re-form does, and then returns from its script.
_ABANDONING_RANK = """
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from elastic.worker.group.process_group import abandon_group, create_group

rank = int(sys.argv[2])
store = dist.FileStore(sys.argv[1], 2)
create_group(store, rank, 2, torch.device("cpu"), timedelta(seconds=60))
print("formed", flush=True)
if rank == 1:
    time.sleep(600)
sys.stdin.readline()  # the test has stopped rank 1
dist.all_reduce(torch.ones(1), async_op=True)
time.sleep(0.5)
abandon_group()
print("abandoned", flush=True)
"""


def next_line(rank: subprocess.Popen[str]) -> str:
    """The rank's next line of its own on stdout: torch 2.9's Gloo prints there too ("[Gloo]
    Rank 0 is connected to 1 peer ranks. ...")."""
    assert rank.stdout is not None
    line = rank.stdout.readline()
    while line.startswith("[Gloo] "):
        line = rank.stdout.readline()
    return line


def test_a_process_that_abandoned_a_group_blocked_on_a_silent_peer_exits_at_once(
    tmp_path: Path,
) -> None:
    """Destroying an abandoned group at interpreter exit would join its threads, which wait
    for a silent peer until the collective timeout (a finished job's launcher never exited:
    multi-host bed, a host cut off from its peers earlier in the job)."""
    store = str(tmp_path / "epoch-1")
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _ABANDONING_RANK, store, str(rank)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        for rank in ranks:
            assert next_line(rank) == "formed\n"
        ranks[1].send_signal(signal.SIGSTOP)
        assert ranks[0].stdin is not None
        ranks[0].stdin.write("go\n")
        ranks[0].stdin.flush()
        assert next_line(ranks[0]) == "abandoned\n"
        started = time.monotonic()
        assert ranks[0].wait(timeout=30) == 0
        assert time.monotonic() - started < 10
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
