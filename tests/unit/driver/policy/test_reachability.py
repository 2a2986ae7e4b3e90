"""Reachability between a round's peers: which host the driver cuts off when members report
peers that answer no probe (pure), and the worker's probes over real UDP sockets."""

from __future__ import annotations

import socket
import time

import pytest

from elastic.driver.policy.actions import BreakRound, CoolDown, Reform, Signal
from elastic.driver.policy.phase import Phase
from elastic.driver.policy.reachability import cut_off
from elastic.worker.group.reachability import (
    TRIES,
    TRY_EVERY,
    ProbeResponder,
    probe_targets,
    silent_peers,
)
from tests.support.policy_views import NOW, M, view, worker

# --- which host goes (pure) ----------------------------------------------------------------


def four_hosts():
    workers = [worker(f"w{i}", M, host=f"h{i}") for i in range(4)]
    return workers, view(*workers, members=tuple(w.worker_id for w in workers))


def killed(decision) -> set[str]:
    return {a.worker_id for a in decision.actions if isinstance(a, Signal) and a.kill}


def test_the_host_its_peers_cannot_reach_is_cut_off_not_the_ones_it_cannot_reach() -> None:
    _, job = four_hosts()
    # h0 is cut off from the others: it reports all three; each of them reports h0.
    reports = {"w0": {1, 2, 3}, "w1": {0}, "w2": {0}, "w3": {0}}
    decision = cut_off(job, 1, reports, NOW)
    assert killed(decision) == {"w0"}
    assert "host h0 is unreachable from its peers on host(s) h1, h2, h3" in decision.reason
    assert CoolDown("h0", "is unreachable from its peers on host(s) h1, h2, h3") in (
        decision.actions
    )
    assert any(isinstance(a, BreakRound) and a.number == 1 for a in decision.actions)
    assert any(isinstance(a, Reform) and a.broken for a in decision.actions)


def test_between_hosts_with_equal_votes_the_one_that_reaches_fewest_goes() -> None:
    _, job = four_hosts()
    # h0 is cut off; only one of its peers' reports is in (the others are slow to probe):
    # every host has one vote, and h0 is the one that reports every other.
    assert killed(cut_off(job, 1, {"w0": {1, 2, 3}, "w1": {0}}, NOW)) == {"w0"}
    # Only h0's report: h1, h2, h3 one vote each and none reports anyone: the newest goes.
    assert killed(cut_off(job, 1, {"w0": {1, 2, 3}}, NOW)) == {"w3"}


def test_two_hosts_that_cannot_reach_each_other_keep_the_older() -> None:
    a, b = worker("a0", M, host="a"), worker("b0", M, host="b")
    job = view(a, b, members=("a0", "b0"))
    assert killed(cut_off(job, 1, {"a0": {1}, "b0": {0}}, NOW)) == {"b0"}


def test_every_worker_of_the_cut_off_host_goes() -> None:
    workers = [
        worker("a0", M, host="a", slot=0),
        worker("a1", M, host="a", slot=1),
        worker("b0", M, host="b"),
        worker("c0", M, host="c"),
    ]
    job = view(*workers, members=("b0", "c0", "a0", "a1"))  # a holds ranks 2 and 3
    assert killed(cut_off(job, 1, {"b0": {2, 3}, "c0": {2}}, NOW)) == {"a0", "a1"}


@pytest.mark.parametrize(
    ("number", "reports", "fields", "why"),
    [
        (0, {"w1": {0}}, {}, "an older round's reports"),
        (1, {"w1": {1}}, {}, "a worker reporting itself"),
        (1, {"nobody": {0}}, {}, "a reporter the driver does not know"),
        (1, {"w1": {9}}, {}, "a rank the round does not have"),
        (1, {"w1": {0}}, {"phase": Phase.FINISHING}, "a job that forms no more rounds"),
        (1, {"w1": {0}}, {"elastic": None}, "a static job"),
    ],
)
def test_reports_that_name_no_other_host_of_the_round_change_nothing(
    number, reports, fields, why
) -> None:
    workers, _ = four_hosts()
    job = view(*workers, members=tuple(w.worker_id for w in workers), **fields)
    assert cut_off(job, number, reports, NOW).actions == (), why


def test_ranks_on_the_reporters_own_host_are_no_vote() -> None:
    workers = [worker("a0", M, host="a", slot=0), worker("a1", M, host="a", slot=1)]
    job = view(*workers, worker("b0", M, host="b"), members=("a0", "a1", "b0"))
    assert cut_off(job, 1, {"a0": {1}}, NOW).actions == ()


# --- which peers answer (real sockets) ------------------------------------------------------


def test_probe_targets_cover_a_small_round_and_stay_logarithmic_in_a_large_one() -> None:
    assert probe_targets(0, 1) == []
    assert probe_targets(1, 4) == [0, 2, 3]
    assert all(probe_targets(r, 16) == sorted(set(range(16)) - {r}) for r in range(16))
    large = probe_targets(17, 10_000)
    assert 17 not in large and len(large) <= 28
    assert {16, 18, 15, 19} <= set(large)
    assert all(len(probe_targets(r, 100)) <= 14 for r in range(100))
    # Every rank is probed by someone.
    probed = {t for r in range(100) for t in probe_targets(r, 100)}
    assert probed == set(range(100))


def closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_responder_answers_and_a_port_nobody_serves_is_silent() -> None:
    responders = [ProbeResponder("127.0.0.1") for _ in range(2)]
    try:
        addresses = {0: responders[0].address, 1: responders[1].address}
        addresses[2] = f"127.0.0.1:{closed_udp_port()}"
        started = time.monotonic()
        assert silent_peers(addresses) == {2}
        assert time.monotonic() - started < TRIES * TRY_EVERY + 1.0
        assert silent_peers({0: responders[0].address}) == set()
    finally:
        for responder in responders:
            responder.close()
    # A closed responder answers no more.
    assert silent_peers({0: responders[0].address}, tries=2, every=0.05) == {0}


def test_a_responder_ignores_datagrams_that_are_not_probes() -> None:
    responder = ProbeResponder("127.0.0.1")
    host, port = responder.address.rsplit(":", 1)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.settimeout(0.3)
            for junk in (b"", b"hello", b"elastic-probe\x00" + b"x" * 100):
                sender.sendto(junk, (host, int(port)))
                with pytest.raises(TimeoutError):
                    sender.recv(1024)
        assert silent_peers({0: responder.address}) == set()  # and it still answers probes
    finally:
        responder.close()
