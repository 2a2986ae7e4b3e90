"""`/v1/status` as built from the driver's records: ranks, decisions, and never the token."""

from __future__ import annotations

import asyncio

import httpx

from elastic.driver.rendezvous.membership import Rendezvous
from elastic.driver.rendezvous.memory_store import MemoryKeyValueStore
from elastic.driver.server.app import create_app
from elastic.driver.server.services import Services
from elastic.driver.server.status import describe_job
from elastic.protocol.http import DecisionRecord, DurableStatus, HostStatus, JobStatus
from tests.support.policy_views import F, L, M, worker

TOKEN = "s3cret-token-value"
HOSTS = [HostStatus(hostname="a", slots=2), HostStatus(hostname="b", slots=1, state="drained")]
DECISIONS = [
    DecisionRecord(time=1.0, round=1, reason="worker j joined"),
    DecisionRecord(time=2.0, round=2, reason="worker r0 died; worker r1 died"),
]


def job() -> JobStatus:
    rendezvous = Rendezvous()
    rendezvous.form([("w#1", "a"), ("w#2", "a"), ("w#3", "b")])
    workers = [
        worker("w#0", F, exit_code=9, pid=10),
        worker("w#1", M, pid=11),
        worker("w#2", M, slot=1, pid=12),
        worker("w#3", M, host="b", pid=13),
        worker("w#4", L, host="b", slot=1),
    ]
    return describe_job("run-7", rendezvous, workers, HOSTS, DECISIONS)


def test_members_have_their_ranks_and_other_workers_none() -> None:
    status = job()
    assert (status.job_id, status.round, status.size) == ("run-7", 1, 3)
    seen = [(w.worker_id, w.rank, w.local_rank, w.state) for w in status.workers]
    assert seen == [
        ("w#0", None, None, "failed"),
        ("w#1", 0, 0, "member"),
        ("w#2", 1, 1, "member"),
        ("w#3", 2, 0, "member"),
        ("w#4", None, None, "launching"),
    ]
    assert [(w.pid, w.exit_code) for w in status.workers][:2] == [(10, 9), (11, None)]
    assert status.hosts == HOSTS


def test_durable_commits_show_the_newest_written_and_a_stale_copy_of_live_workers() -> None:
    rendezvous = Rendezvous()
    rendezvous.form([("w#1", "a")])
    writer, dead = worker("w#1", M, pid=11), worker("w#0", F, exit_code=9, pid=10)
    assert describe_job("j", rendezvous, [dead, writer], HOSTS, []).durable is None
    with_dir = describe_job("j", rendezvous, [dead, writer], HOSTS, [], checkpoint_dir="/c")
    assert with_dir.durable == DurableStatus(newest=0, stale=False)
    dead.durable, dead.durable_stale = 40, True  # a failed worker's last word no longer holds
    writer.durable = 30
    assert describe_job("j", rendezvous, [dead, writer], HOSTS, []).durable == DurableStatus(
        newest=40, stale=False
    )
    writer.durable_stale = True
    status = describe_job("j", rendezvous, [dead, writer], HOSTS, [], checkpoint_dir="/c")
    assert status.durable == DurableStatus(newest=40, stale=True)


def test_decisions_are_listed_in_order_with_their_reasons() -> None:
    assert [d.reason for d in job().decisions] == [
        "worker j joined",
        "worker r0 died; worker r1 died",
    ]


def test_the_status_served_never_contains_the_token() -> None:
    services = Services(TOKEN, MemoryKeyValueStore(), Rendezvous(), job)

    async def fetch() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://driver") as client:
            return await client.get("/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})

    answer = asyncio.run(fetch())
    assert answer.status_code == 200
    assert answer.json()["workers"][1]["rank"] == 0
    assert TOKEN not in answer.text
    assert "token" not in answer.text.lower()
