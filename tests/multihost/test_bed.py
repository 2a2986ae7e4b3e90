"""The multi-host bed itself: hosts reached through ssh, and each fault doing what it says.

Real namespaces, sshds and sockets; the programs run inside hosts are tests/multihost/probes.py.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.bed import Bed
from tests.multihost.conftest import build_bed
from tests.multihost.leftovers import survey, sweep_orphans
from tests.support.processes import pids_alive
from tests.support.scripts import write_script

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(60)]

PROBES = Path(__file__).with_name("probes.py")
REPOSITORY = Path(__file__).resolve().parents[2]
ECHO_PORT = 7007
SSH_PORT = 22

# Builds a one-host bed in the directory argv[1], prints what it made, waits to be killed.
OWNER = """\
import sys
import threading
import time
from pathlib import Path

from tests.multihost.bed import Bed

bed = Bed(1, Path(sys.argv[1]))
print(" ".join(bed.names()), flush=True)
time.sleep(60)
"""


def probe(bed: Bed, host: str, *args: object) -> str:
    """Run probes.py in `host` with `args`; return what it printed."""
    done = bed.run(host, [sys.executable, str(PROBES), *map(str, args)], timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def start_echo(bed: Bed, host: str) -> str:
    """Start an echo server on `host`'s address, port ECHO_PORT; return that address once it
    listens."""
    address = bed.address(host)
    argv = [sys.executable, str(PROBES), "echo", address, str(ECHO_PORT)]
    server = bed.start(host, argv, stdout=subprocess.PIPE)
    assert server.stdout is not None
    assert select.select([server.stdout], [], [], 10)[0], "the echo server did not start"
    assert server.stdout.readline() == b"ready\n"
    return address


def ssh(bed: Bed, host: str, command: str) -> subprocess.CompletedProcess[str]:
    """Run shell `command` on `host` through its sshd, from the root namespace."""
    return subprocess.run(
        bed.ssh_command(host, command),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def echoes(conn: socket.socket) -> bool:
    conn.sendall(b"x")
    return conn.recv(1) == b"x"


def test_every_host_answers_ssh_in_its_own_namespace(bed: Bed) -> None:
    for host in bed.hosts:
        report = "ip -4 -o addr show dev eth0; readlink /proc/self/ns/net; echo $PYTHONPATH"
        done = ssh(bed, host.name, report)
        assert done.returncode == 0, done.stderr
        address, namespace, pythonpath = done.stdout.splitlines()
        assert f" {host.address}/24 " in address
        assert namespace == os.readlink(f"/proc/{bed.pids(host.name)[0]}/ns/net")
        assert namespace != os.readlink("/proc/self/ns/net")
        assert pythonpath == str(REPOSITORY)


def test_a_vanished_host_goes_silent(bed: Bed) -> None:
    address = start_echo(bed, "h1")
    with socket.create_connection((address, ECHO_PORT), timeout=5) as conn:
        assert echoes(conn)
        bed.vanish("h1")
        assert bed.pids("h1") == []
        conn.settimeout(3)
        with pytest.raises(TimeoutError):  # no FIN (b""), no RST (ConnectionResetError)
            conn.recv(1)
    with pytest.raises(TimeoutError):  # not ConnectionRefusedError: nothing answers
        socket.create_connection((address, ECHO_PORT), timeout=2)


def test_a_host_that_is_back_runs_sshd_and_nothing_of_its_past(bed: Bed) -> None:
    bed.start("h2", ["sleep", "60"])
    deadline = time.monotonic() + 10  # `ip netns exec` enters the namespace after it starts
    while len(before := bed.pids("h2")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(before) == 2  # sshd, sleep
    bed.vanish("h2")
    bed.back("h2")

    after = bed.pids("h2")  # its new sshd (and a child serving the bed's banner probe)
    assert after and not set(after) & set(before)
    assert pids_alive(before) == []
    done = ssh(bed, "h2", "true")
    assert done.returncode == 0, done.stderr


@pytest.fixture
def driver_port(bed: Bed) -> Iterator[int]:
    """A port listening on the driver's address, in the root namespace."""
    with socket.create_server((bed.driver_address, 0)) as listener:
        yield listener.getsockname()[1]


def driver_mac(bed: Bed) -> str:
    """The MAC address of the root-namespace interface that holds the driver's address."""
    links = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip
    (mac,) = [
        link["address"]
        for link in links
        if any(a.get("local") == bed.driver_address for a in link.get("addr_info", []))
    ]
    return mac


def test_the_driver_s_mac_stays_while_hosts_vanish_and_come_back(bed: Bed) -> None:
    """Other hosts keep the driver's MAC in their ARP caches: had it changed with a port of
    the bridge, every host would lose its heartbeats when one vanished."""
    before = driver_mac(bed)
    for host in bed.hosts:
        bed.vanish(host.name)
        assert driver_mac(bed) == before
    for host in bed.hosts:
        bed.back(host.name)
        assert driver_mac(bed) == before


def test_a_partition_from_the_driver_leaves_the_peers(bed: Bed, driver_port: int) -> None:
    driver, h1, h2 = bed.driver_address, bed.address("h1"), bed.address("h2")
    bed.partition("h1", from_="driver")
    # silent both ways: a timeout, not the EPERM of a local drop, nor a refusal
    assert probe(bed, "h1", "connect", driver, driver_port, 1) == "TimeoutError"
    with pytest.raises(TimeoutError):
        socket.create_connection((h1, SSH_PORT), timeout=1)
    assert probe(bed, "h1", "connect", h2, SSH_PORT, 2) == "connected"
    assert probe(bed, "h2", "connect", h1, SSH_PORT, 2) == "connected"

    bed.heal("h1")
    assert probe(bed, "h1", "connect", driver, driver_port, 2) == "connected"
    socket.create_connection((h1, SSH_PORT), timeout=2).close()


def test_a_partition_from_the_peers_leaves_the_driver(bed: Bed, driver_port: int) -> None:
    driver, h1, h2, h3 = bed.driver_address, *(host.address for host in bed.hosts)
    bed.partition("h1", from_="peers")
    assert probe(bed, "h1", "connect", h2, SSH_PORT, 1) == "TimeoutError"
    assert probe(bed, "h2", "connect", h1, SSH_PORT, 1) == "TimeoutError"
    assert probe(bed, "h1", "connect", driver, driver_port, 2) == "connected"
    socket.create_connection((h1, SSH_PORT), timeout=2).close()
    assert probe(bed, "h2", "connect", h3, SSH_PORT, 2) == "connected"

    bed.heal("h1")
    assert probe(bed, "h1", "connect", h2, SSH_PORT, 2) == "connected"


def test_slow_adds_its_delay_to_round_trips(bed: Bed) -> None:
    address = start_echo(bed, "h2")
    before = json.loads(probe(bed, "h1", "rtt", address, ECHO_PORT, 20))
    bed.slow("h1")  # 50 ms, 1 % loss: h1's requests wait, h2's replies do not
    slowed = json.loads(probe(bed, "h1", "rtt", address, ECHO_PORT, 20))
    bed.fast("h1")
    after = json.loads(probe(bed, "h1", "rtt", address, ECHO_PORT, 20))

    fast, slow, fast_again = (statistics.median(times) for times in (before, slowed, after))
    print(f"median h1<->h2 round trip: {fast:.2f} ms, slow {slow:.2f}, fast again {fast_again:.2f}")
    assert fast < 10 and fast_again < 10, (fast, fast_again)
    assert 45 <= slow - fast <= 80, (fast, slow)


def test_slow_loses_the_share_of_packets_it_is_told(bed: Bed) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind((bed.driver_address, 0))
        bed.slow("h1", delay_ms=0, loss_pct=50)
        probe(bed, "h1", "udp", bed.driver_address, receiver.getsockname()[1], 400)
        received = 0
        while select.select([receiver], [], [], 0.5)[0]:
            receiver.recv(64)
            received += 1
    assert 120 <= received <= 280, received  # binomial(400, 0.5): 200 +- 10


def carrier(bed: Bed, host: str) -> bool:
    """Whether `host`'s interface sees its wire up."""
    return bed.run(host, ["cat", "/sys/class/net/eth0/carrier"]).stdout.strip() == "1"


def test_a_flap_keeps_connections_that_outlast_it(bed: Bed) -> None:
    address = start_echo(bed, "h1")
    with socket.create_connection((address, ECHO_PORT), timeout=10) as conn:
        assert echoes(conn)
        flap = threading.Thread(target=bed.flap, args=("h1", 1.5))
        flap.start()
        deadline = time.monotonic() + 1.0
        while carrier(bed, "h1"):  # polling the link's state: the deadline bounds it
            assert time.monotonic() < deadline, "the wire never went down"
        conn.sendall(b"y")  # lost while the wire is down, retransmitted after
        flap.join()
        assert carrier(bed, "h1")
        assert conn.recv(1) == b"y"


def test_two_beds_coexist_on_their_own_subnets(bed: Bed, tmp_path: Path) -> None:
    with build_bed(1, tmp_path / "second") as second:
        assert second.subnet != bed.subnet
        assert not second.names() & bed.names()
        for each in (bed, second):
            done = ssh(each, "h1", "true")
            assert done.returncode == 0, done.stderr


def test_a_closed_bed_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="a failing test"), build_bed(2, tmp_path) as bed:
        made = bed.names()
        bed.slow("h1")
        bed.partition("h2", from_="peers")
        bed.start("h2", ["sleep", "60"])
        pids = bed.pids("h1") + bed.pids("h2")
        assert made <= survey().names()
        raise RuntimeError("a failing test")
    assert not made & survey().names()
    assert pids_alive(pids) == []


def test_the_next_bed_sweeps_what_a_killed_owner_left(tmp_path: Path) -> None:
    build_bed(1, tmp_path / "probe").close()  # skips where no bed can be built
    script = write_script(tmp_path, "owner.py", OWNER)
    owner = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "killed")],
        cwd=REPOSITORY,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )
    try:
        assert owner.stdout is not None
        assert select.select([owner.stdout], [], [], 30)[0], "the owner built no bed"
        left = set(owner.stdout.readline().decode().split())
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert left and left <= survey().names()
    assert left <= set(sweep_orphans())
    assert not left & survey().names()
