"""What a driver saves about its job, read back as a restarted driver reads it."""

from __future__ import annotations

import random
from dataclasses import replace

from elastic.driver.discovery import HostTracker
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.journal.job_token import GivenToken
from elastic.driver.journal.journal import sealed
from elastic.driver.journal.record import JobSpec
from elastic.driver.journal.resume import (
    ENDED_KEPT,
    SERIAL_GAP,
    Resumed,
    Tally,
    restore_hosts,
    resumed,
    settings_document,
    snapshot,
    worker_record,
)
from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.settings import BackendSettings, ElasticSettings, Settings
from elastic.driver.workers import Worker
from elastic.protocol.etcd_trust import token_check
from tests.support.policy_views import LV, F, L, M, X, worker

TOKEN = "s3cret-token-value-" + "v" * 20
COOLDOWN = 10.0  # seconds a failed host is excluded (no jitter: the range is one value)
SETTINGS = Settings(
    np=None, hosts=[], command=["python", "train.py"],
    elastic=ElasticSettings(min_np=1, max_np=4, discovery_script="./hosts.sh"),
)  # fmt: skip
BACKEND = BackendSettings(job_id="run-7")


def tracker() -> HostTracker:
    return HostTracker(Cooldown(COOLDOWN, COOLDOWN, random.Random(0)))


def saved_and_read(
    workers: list[Worker], hosts: HostTracker, members: list[str] | None = None, **changes
) -> Resumed:
    """The job saved by one driver and read back by the next one; the round's `members` are
    the workers in MEMBER state or handing over unless given."""
    rendezvous = Rendezvous()
    if members is None:
        members = [w.worker_id for w in workers if w.state is M or w.handing_over]
    by_id = {w.worker_id: w for w in workers}
    rendezvous.restore(7, [(m, by_id[m].hostname) for m in members])
    arguments = dict(
        tally=Tally(resets=3, update_version=4, newest_commit=5),
        serial=len(workers), finishing=False, wall_offset=1000.0,
    )  # fmt: skip
    arguments.update(changes)
    state = snapshot(rendezvous, workers, hosts, **arguments)
    spec = JobSpec(
        job_id="run-7", created=0.0, settings=settings_document(SETTINGS), log_root="/tmp/r7"
    )
    documents = sealed({"spec": spec.model_dump_json().encode(), "state": state}, TOKEN, "run-7")
    documents["token_check"] = token_check(TOKEN, "run-7").encode()
    return resumed(documents, BACKEND, "run-7", GivenToken(TOKEN, "the test"), str)


def fleet() -> list[Worker]:
    return [
        worker("d#1", X, exit_code=0, pid=11),
        worker("d#2", M, host="b", pid=12, registered=True, joined=True, commit=5,
               launcher_pid=912, log_dir="/tmp/r7/2", offsets={"stdout": 40}),
        worker("d#3", LV, slot=1, pid=13, registered=True, joined=True, commit=5,
               handing_over=True, leave_reason="SIGTERM"),
        worker("d#4", L, slot=2),
    ]  # fmt: skip


def test_a_saved_job_reads_back_with_its_round_workers_and_counters() -> None:
    workers = fleet()
    back = saved_and_read(workers, tracker())
    state = back.state
    assert (state.round, state.members) == (7, ["d#2", "d#3"])
    records = {w.worker_id: worker_record(w) for w in back.workers}
    assert records == {w.worker_id: worker_record(w) for w in workers}
    assert all(w.process is None for w in back.workers)  # to be adopted
    assert (state.resets, state.update_version, state.newest_commit) == (3, 4, 5)
    assert state.finishing is False
    assert back.token == TOKEN
    assert back.settings == replace(SETTINGS, backend=BACKEND)
    assert back.log_root == "/tmp/r7"


def test_a_finishing_job_reads_back_as_finishing() -> None:
    assert saved_and_read(fleet(), tracker(), finishing=True).state.finishing is True


def test_worker_numbers_skip_a_gap_for_those_launched_after_the_last_save() -> None:
    back = saved_and_read(fleet(), tracker(), serial=12)
    assert back.state.serial == 12 + SERIAL_GAP


def test_only_the_newest_ended_workers_are_kept() -> None:
    ended = [worker(f"d#{n}", F if n % 2 else X, exit_code=n % 2) for n in range(ENDED_KEPT + 5)]
    live = worker("d#live", M, slot=1)
    workers = [*ended[:10], live, *ended[10:]]
    back = saved_and_read(workers, tracker())
    kept = {w.worker_id for w in back.workers}
    assert kept == {"d#live", *(w.worker_id for w in ended[5:])}


def test_discovered_hosts_and_cooldowns_survive_a_new_monotonic_clock() -> None:
    hosts = tracker()
    hosts.discovered([HostSpec("a", 2), HostSpec("b", 1)], now=40.0)
    hosts.host_failed("b", now=50.0)  # excluded until 60 on the old driver's clock
    back = saved_and_read(fleet(), hosts, wall_offset=1000.0)  # wall time: 1050 then 1060

    again = tracker()  # the new driver: its monotonic clock says 5 at wall time 1057
    restore_hosts(again, back.state, wall_offset=1052.0, now=5.0)
    assert again.discovered_hosts == (HostSpec("a", 2), HostSpec("b", 1))
    assert again.hosts == (HostSpec("a", 2),)
    assert again.cooldown.until("b") == 8.0  # still 3 s to go, as on the old clock
    assert again.cooldown.failures("b") == 1
    assert again.refresh(7.9).change is None
    change = again.refresh(8.0).change
    assert change is not None and change.added == ("b",)


def test_a_drained_host_stays_drained_for_the_next_driver() -> None:
    hosts = tracker()
    hosts.discovered([HostSpec("a", 2), HostSpec("b", 1)], now=40.0)
    hosts.drain("b", True, now=41.0)
    back = saved_and_read(fleet(), hosts)
    again = tracker()
    restore_hosts(again, back.state, wall_offset=1052.0, now=5.0)
    assert again.drained == {"b"} and again.hosts == (HostSpec("a", 2),)


def test_every_member_of_the_saved_round_keeps_its_record() -> None:
    """d#0, launched first, died; the job is short of --min-np, so no round re-formed, while
    more than ENDED_KEPT replacement workers failed to start after it."""
    members = [worker("d#0", F, exit_code=9), worker("d#live", M, slot=1)]
    failed_starts = [worker(f"d#{n}", F, exit_code=127) for n in range(1, ENDED_KEPT + 2)]
    workers = [members[0], *failed_starts, members[1]]
    back = saved_and_read(workers, tracker(), members=["d#0", "d#live"])
    assert back.state.members == ["d#0", "d#live"]
    kept = {w.worker_id for w in back.workers}
    assert set(back.state.members) <= kept, "a member of the round has no record"
