"""A multi-host test bed on one machine: N hosts, each a network namespace with its own sshd.

    with Bed(3) as bed:
        hosts = ",".join(f"{host.address}:1" for host in bed.hosts)
        elasticrun -np 3 -H {hosts} {bed.ssh_args()} python train.py   # from the root namespace
        bed.vanish("h2")   # h2 loses power: silence, no RST, no FIN
        bed.back("h2")     # h2 reboots: same address, sshd again, no old process

Each host is a network namespace plugged by a veth pair into a bridge in the root namespace;
the bridge holds the driver's address (`.1` of a free private /24, tests/multihost/subnet.py)
and the hosts `.11`, `.12`, ... . Every host runs Debian's `/usr/sbin/sshd` on its address,
port 22, letting root in with the bed's key; logins run this interpreter with this checkout's
`elastic` importable. The driver (`elasticrun`, the test) runs in the root namespace and
reaches the hosts through ssh like remote machines. The UTS namespace is shared: every host
has the machine's host name, as hosts whose names resolve to loopback do. The wires carry
IPv4 only (IPv6 is off on them).

Faults are silent to both ends, as on a real network; all but `slow` act on the wire, the
root end of a host's veth:
- `vanish`/`back`: power loss and reboot (tests/multihost/namespaces.py, `unplug`/`plug`);
- `partition`/`heal`: drops between a host and the driver or its peers (nftables netdev
  ingress and egress hooks: tests/multihost/wire.py);
- `slow`/`fast`: delay and loss of a host's outgoing packets. Not `tc netem`: this kernel has
  no `sch_netem` (and loads no modules), and nft's `queue` statement is not compiled in. An
  iptables NFQUEUE rule in the host's OUTPUT hook hands each packet to a pure-Python
  consumer in the namespace (tests/multihost/delay_queue.py) that accepts it after the delay
  or drops it: `netem delay D loss L` on the host's egress;
- `flap`: the wire's link down, then up.

Cleanup: `close()` (leaving the `with` block, the `bed` fixture) kills every process in the
hosts' namespaces and deletes the namespaces, links, nft table, iptables rules (they live in
the namespaces) and files it made, also when a test failed; what an owner killed outright
leaves, the next bed sweeps (tests/multihost/leftovers.py). Needs root, `ip`, `nft`,
`iptables`, `sshd`, `ssh`: `missing_prerequisite()` says which is missing, in one line.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.multihost import wire
from tests.multihost.leftovers import sweep_orphans
from tests.multihost.namespaces import (
    HOST_INTERFACE,
    Plug,
    exec_in,
    ip,
    namespace_pids,
    plug,
    unplug,
)
from tests.multihost.subnet import OWNER_ALIAS, SUBNETS, claim_lock, free_subnet, make_bridge
from tests.support.prerequisites import Machine, missing_bed
from tests.support.sshd_server import (
    SshKeys,
    check_login,
    make_keys,
    ssh_command,
    sshd_config,
    start_sshd,
    wait_listening,
)

SSH_PORT = 22
FIRST_HOST = 11  # host i (from 1) has address .(10 + i); the driver .1
MAX_HOSTS = 200
DELAY_QUEUE = Path(__file__).with_name("delay_queue.py")
QUEUE_NUMBER = 47  # netfilter queues are per namespace: every host may use the same
READY_TIMEOUT = 10.0


class BedUnavailable(Exception):
    """This machine cannot hold a bed; the message says why in one line (tests skip on it)."""


@dataclass(frozen=True)
class BedHost:
    """One host of the bed: its name ("h1", ...) and its address on the bed's /24."""

    name: str
    address: str


def missing_prerequisite() -> str | None:
    """Why no bed can be built here (one line), or None when root and every tool it uses are
    there (tests/support/prerequisites.py). Where the kernel refuses namespaces or nftables,
    building raises BedUnavailable."""
    return missing_bed(Machine.here())


class _Machine:
    """What the bed holds for one host: how it is plugged, its sshd, the processes started in
    it, and its faults (a cut of the wire, a delay queue)."""

    def __init__(self, host: BedHost, plug: Plug) -> None:
        self.host = host
        self.plug = plug
        self.sshd: subprocess.Popen[bytes] | None = None
        self.started: list[subprocess.Popen[bytes]] = []
        self.cut = False
        self.delay: subprocess.Popen[bytes] | None = None
        self.present = False  # plugged in, not vanished


class Bed:
    """N hosts in network namespaces, each with an sshd; faults on the wires between them.

    Use it as a context manager (`with Bed(3) as bed:`) or through the `bed` pytest fixture
    (tests/multihost/conftest.py); both close it. Methods that take `host` accept its name
    ("h1") or its address. Nothing here is thread-safe.
    """

    def __init__(self, count: int = 3, directory: Path | None = None) -> None:
        """Build `count` hosts, keeping keys, configs and logs in `directory` (default: a
        temporary directory, removed by `close`). Raises BedUnavailable when the machine
        cannot hold a bed (no free /24, namespaces or nftables refused); anything made
        before a failure is removed. Raises ValueError for a `count` outside 1..MAX_HOSTS."""
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"a bed has 1 to {MAX_HOSTS} hosts, not {count}")
        self._own_directory = directory is None
        if directory is None:
            directory = Path(tempfile.mkdtemp(prefix="elasticrun-bed-"))
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        tag = secrets.token_hex(3)
        self._bridge = f"eb{tag}br"
        self._table = f"ebed_{os.getpid()}_{tag}"
        self._machines: dict[str, _Machine] = {}
        self._bridge_made = self._table_made = False
        try:
            self._build(count, tag)
        except BaseException:
            self.close()
            raise

    def _build(self, count: int, tag: str) -> None:
        with claim_lock():
            sweep_orphans()
            subnet = free_subnet()
            if subnet is None:
                raise BedUnavailable(
                    f"every /24 from {SUBNETS[0]} to {SUBNETS[-1]} overlaps an address or "
                    "route of this machine"
                )
            self.subnet = subnet
            self.driver_address = str(subnet[1])
            try:
                driver = ipaddress.IPv4Interface(f"{self.driver_address}/{subnet.prefixlen}")
                make_bridge(self._bridge, driver)
            except subprocess.CalledProcessError as err:
                raise BedUnavailable(f"cannot create a bridge: {err.stderr.strip()}") from None
            self._bridge_made = True
        try:
            wire.create_table(self._table)
        except subprocess.CalledProcessError as err:
            raise BedUnavailable(f"nftables refuses a netdev table: {err.stderr.strip()}") from None
        self._table_made = True
        self._keys: SshKeys = make_keys(self.directory)
        for index in range(1, count + 1):
            host = BedHost(f"h{index}", str(self.subnet[FIRST_HOST - 1 + index]))
            octets = ":".join(f"{int(part):02x}" for part in host.address.split("."))
            machine = _Machine(
                host,
                Plug(
                    namespace=f"ebed-{os.getpid()}-{tag}-{host.name}",
                    address=host.address,
                    prefix_length=self.subnet.prefixlen,
                    link=f"eb{tag}{host.name}",
                    bridge=self._bridge,
                    host_mac=f"02:{octets}:00",
                    link_mac=f"02:{octets}:01",
                    alias=f"{OWNER_ALIAS}{os.getpid()}",
                ),
            )
            self._machines[host.name] = machine
            try:
                self._plug(machine)
            except subprocess.CalledProcessError as err:
                if index > 1:  # the first worked: not the machine's refusal but a bug
                    raise
                raise BedUnavailable(
                    f"cannot make a host of a network namespace: {err.stderr.strip()}"
                ) from None
            self._start_sshd(machine)
        first = self.hosts[0]
        check_login(SSH_PORT, self._keys.identity_file, first.address, self._log(first.name))

    # --- what the bed is

    @property
    def hosts(self) -> list[BedHost]:
        """The hosts, in order (h1, h2, ...)."""
        return [machine.host for machine in self._machines.values()]

    def names(self) -> set[str]:
        """Every namespace, link and nft table name this bed makes (they exist while it is
        open, but for those of vanished hosts)."""
        made = {self._bridge, self._table}
        for machine in self._machines.values():
            made |= {machine.plug.namespace, machine.plug.link}
        return made

    def address(self, host: str) -> str:
        """`host`'s address (`host` is its name or its address)."""
        return self._host(host).address

    def ssh_args(self) -> list[str]:
        """The `elasticrun` flags that reach the hosts: `-p 22 -i KEY`."""
        return ["-p", str(SSH_PORT), "-i", str(self._keys.identity_file)]

    def ssh_command(self, host: str, *remote: str) -> list[str]:
        """An ssh client command (from the root namespace) that runs `remote` on `host`."""
        return ssh_command(SSH_PORT, self._keys.identity_file, self._host(host).address, *remote)

    # --- processes in a host

    def run(
        self, host: str, argv: Sequence[str], timeout: float = 60.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` in `host`'s namespace and wait for it; its output is captured as text.
        Raises subprocess.TimeoutExpired after `timeout` seconds (the process is killed)."""
        return subprocess.run(
            exec_in(self._machine(host).plug.namespace, argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def start(self, host: str, argv: Sequence[str], **popen: object) -> subprocess.Popen[bytes]:
        """Start `argv` in `host`'s namespace (in a new session; `popen` goes to Popen). The
        process dies when the host vanishes or the bed closes."""
        machine = self._machine(host)
        process = subprocess.Popen(
            exec_in(machine.plug.namespace, argv),
            start_new_session=True,
            **popen,  # type: ignore[call-overload]
        )
        machine.started.append(process)
        return process

    def pids(self, host: str) -> list[int]:
        """Every process in `host`'s namespace (`ip netns pids`); none while it is vanished."""
        return namespace_pids(self._machine(host).plug.namespace)

    # --- faults

    def vanish(self, host: str) -> None:
        """`host` loses power: its wire goes down first (nothing it sends afterwards leaves
        it), then every process in it is SIGKILLed and its namespace and veth deleted, so no
        RST or FIN ever reaches anyone; a connect to it times out. Its partition and slowness
        end with it (`back` brings a healed, fast host). Until `back`, commands run in it
        fail (`ip netns exec` finds no namespace)."""
        machine = self._machine(host)
        unplug(machine.plug)
        machine.present = False
        self._reap(machine)
        if machine.cut:
            wire.mend(self._table, machine.host.name)
            machine.cut = False

    def vanish_together(self, hosts: Sequence[str]) -> None:
        """`hosts` lose power at the same moment (one zone's outage, a fleet reclaimed at
        once): each `vanish`es on a thread of its own, so every wire goes down within a few
        milliseconds of the others."""
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            list(pool.map(self.vanish, hosts))

    def back(self, host: str) -> None:
        """`host` returns like a rebooted machine: a fresh namespace with the same address
        and MAC, link up, sshd answering; no process of its past life. Vanishes it first if
        it is not vanished. Raises RuntimeError if its sshd does not start."""
        machine = self._machine(host)
        if machine.present:
            self.vanish(host)
        self._plug(machine)
        self._start_sshd(machine)

    def partition(self, host: str, from_: wire.Side = "driver") -> None:
        """Drop, silently, every IP packet between `host` and the driver (the root
        namespace's address), or between `host` and the other hosts; replaces an earlier
        partition of `host`. ARP still passes. Until `heal` (or `vanish`)."""
        machine = self._machine(host)
        link, subnet = machine.plug.link, str(self.subnet)
        wire.cut(self._table, machine.host.name, link, from_, self.driver_address, subnet)
        machine.cut = True

    def heal(self, host: str) -> None:
        """End `host`'s partition, if any; packets dropped meanwhile stay lost."""
        machine = self._machine(host)
        if machine.cut:
            wire.mend(self._table, machine.host.name)
            machine.cut = False

    def slow(self, host: str, delay_ms: float = 50.0, loss_pct: float = 1.0) -> None:
        """Hold each packet `host` sends for `delay_ms` ms and lose `loss_pct` percent of
        them, silently (`tc netem delay D loss L` on its egress); replaces an earlier
        slowness. A round trip with a fast host grows by `delay_ms`. Until `fast` (or
        `vanish`). Raises RuntimeError if the delay queue does not start."""
        self.fast(host)
        machine = self._machine(host)
        log = self._log(machine.host.name, "delay_queue")
        argv = [DELAY_QUEUE, QUEUE_NUMBER, delay_ms, loss_pct]
        with open(log, "ab") as log_file:
            consumer = self.start(
                host, [sys.executable, *map(str, argv)], stdout=subprocess.PIPE, stderr=log_file
            )
        assert consumer.stdout is not None
        ready = select.select([consumer.stdout], [], [], READY_TIMEOUT)[0]
        if not ready or consumer.stdout.readline() != b"ready\n":
            consumer.kill()
            consumer.wait()
            raise RuntimeError(f"the delay queue of {host} did not start:\n{log.read_text()}")
        machine.delay = consumer
        self._iptables(machine, "-A")

    def fast(self, host: str) -> None:
        """End `host`'s slowness, if any: new packets go at once; those held are accepted."""
        machine = self._machine(host)
        if machine.delay is None:
            return
        self._iptables(machine, "-D")
        machine.delay.terminate()  # it accepts what it holds, then exits
        _end(machine.delay, READY_TIMEOUT)
        machine.started.remove(machine.delay)
        machine.delay = None

    def flap(self, host: str, seconds: float) -> None:
        """Take `host`'s wire down for `seconds` (blocking), then up: packets either way are
        lost meanwhile, silently; connections survive if their retries outlast it."""
        link = self._machine(host).plug.link
        ip("link", "set", link, "down")
        try:
            time.sleep(seconds)
        finally:
            ip("link", "set", link, "up")

    # --- the end

    def close(self) -> None:
        """Remove everything the bed made: processes, namespaces, links, nft table, files.
        Tries every step; raises the first error afterwards."""
        errors: list[BaseException] = []
        for machine in self._machines.values():
            with _collect(errors):
                if machine.present:
                    unplug(machine.plug)
                    machine.present = False
                self._reap(machine)
        if self._table_made:
            with _collect(errors):
                wire.delete_table(self._table)
            self._table_made = False
        if self._bridge_made:
            with _collect(errors):
                ip("link", "del", self._bridge)
            self._bridge_made = False
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        if errors:
            raise errors[0]

    def __enter__(self) -> Bed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- inside

    def _machine(self, host: str) -> _Machine:
        for machine in self._machines.values():
            if host in (machine.host.name, machine.host.address):
                return machine
        raise KeyError(f"no bed host {host!r} (hosts: {', '.join(self._machines)})")

    def _host(self, host: str) -> BedHost:
        return self._machine(host).host

    def _log(self, name: str, what: str = "sshd") -> Path:
        return self.directory / f"{name}.{what}.log"

    def _plug(self, machine: _Machine) -> None:
        machine.present = True  # before: a half-made host is unplugged too
        plug(machine.plug)

    def _start_sshd(self, machine: _Machine) -> None:
        name, address = machine.host.name, machine.host.address
        config = self.directory / f"{name}.sshd_config"
        tmpdir = self.directory / f"{name}.tmp"  # the host's own: remote workers' output
        tmpdir.mkdir(mode=0o700, exist_ok=True)
        config.write_text(
            sshd_config(
                self._keys, [address], SSH_PORT, self.directory / f"{name}.sshd.pid", tmpdir
            )
        )
        machine.sshd = start_sshd(config, self._log(name), exec_in(machine.plug.namespace, []))
        wait_listening(machine.sshd, [address], SSH_PORT, self._log(name))

    def _iptables(self, machine: _Machine, action: str) -> None:
        queue = ["-j", "NFQUEUE", "--queue-num", str(QUEUE_NUMBER), "--queue-bypass"]
        rule = ["-t", "mangle", action, "OUTPUT", "-o", HOST_INTERFACE, *queue]
        done = self.run(machine.host.name, ["iptables", "-w", *rule], timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"iptables {' '.join(rule)} in {machine.host.name}: {done.stderr}")

    def _reap(self, machine: _Machine) -> None:
        """Wait for the bed's own children in a host whose processes were all killed."""
        for process in [*machine.started, *([machine.sshd] if machine.sshd else [])]:
            _end(process, 0.0)
        machine.started.clear()
        machine.sshd = machine.delay = None


def _end(process: subprocess.Popen[bytes], grace: float) -> None:
    """Wait up to `grace` seconds for `process` to exit, then SIGKILL it; reap it and close
    its pipes."""
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


@contextlib.contextmanager
def _collect(errors: list[BaseException]) -> Iterator[None]:
    """Record an error of the block in `errors` and go on (cleanup tries every step)."""
    try:
        yield
    except Exception as err:
        errors.append(err)
