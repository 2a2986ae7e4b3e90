"""How the driver reaches each host: a local subprocess or ssh, checked once, and the address
its servers bind to."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.launch.detached import DetachedLauncher
from elastic.driver.launch.launcher import Launcher
from elastic.driver.launch.local import LocalLauncher
from elastic.driver.launch.network import (
    interface_address,
    local_addresses,
    look_up,
    own_names,
    route_source,
)
from elastic.driver.launch.ssh import SshLauncher, SshOptions

log = logging.getLogger("elasticrun")

LOOKUPS_AT_ONCE = 4  # host names looked up in parallel (threads of the default pool)


class HostAccess:
    """Remembers, per host name, whether it is this machine and whether ssh to it works.

    A name that resolves to an address of this machine's interfaces is launched locally; any
    other through ssh, once `check_reachable` has seen ssh answer.

    Name lookups (DNS) block for as long as DNS takes, so they are made by `learn`, in
    threads; the other methods answer from what it learned. A name it did not learn is
    looked up where it is asked about, blocking the caller (in the driver: the event loop).
    A name that does not resolve stays unknown for the life of this object.
    """

    def __init__(
        self,
        ssh: SshOptions,
        stop_grace: float,
        ssh_timeout: float,
        detached: bool = False,
        *,
        local_launcher: Launcher | None = None,
        ssh_launcher: Launcher | None = None,
    ) -> None:
        """`local_launcher` and `ssh_launcher` replace the default ones (tests, benchmarks)."""
        self._addresses = local_addresses()
        self._own_names: set[str] | None = None
        self._local: dict[str, bool] = {}
        self._resolved: dict[str, set[str]] = {}  # remote name -> its addresses
        self._unresolvable: dict[str, str] = {}  # name -> why
        self._reported: set[str] = set()  # unresolvable names logged already
        self._lookups = asyncio.Semaphore(LOOKUPS_AT_ONCE)
        self._reachable: set[str] = set()
        self._ssh_timeout = ssh_timeout
        self._detached = detached
        # Detached: workers outlive the driver, under a keeper, output in files.
        self._local_launcher: Launcher = local_launcher or (
            DetachedLauncher() if detached else LocalLauncher()
        )
        self._ssh_launcher: Launcher = ssh_launcher or SshLauncher(ssh, stop_grace)

    async def learn(self, hostnames: Iterable[str]) -> None:
        """Look the names not known yet up, in threads (never on the event loop): whether
        each is this machine, and its addresses. Never raises: a name that does not resolve
        is remembered as such (`is_local` raises for it, `usable` is False)."""
        new = [name for name in dict.fromkeys(hostnames) if not self._known(name)]
        if not new:
            return
        if self._own_names is None:
            self._own_names = await asyncio.to_thread(own_names)
        names = self._own_names

        async def learn_one(name: str) -> None:
            async with self._lookups:
                answer = await asyncio.to_thread(_answer, name, self._addresses, names)
            self._remember(name, answer)

        await asyncio.gather(*(learn_one(name) for name in new))

    def _known(self, hostname: str) -> bool:
        return hostname in self._local or hostname in self._unresolvable

    def _remember(self, hostname: str, answer: tuple[bool, set[str]] | UsageError) -> None:
        if isinstance(answer, UsageError):
            self._unresolvable[hostname] = str(answer)
        else:
            self._local[hostname], self._resolved[hostname] = answer

    def is_local(self, hostname: str) -> bool:
        """Raises `UsageError` for a name that does not resolve. Blocks on DNS for a name
        `learn` was not given."""
        if not self._known(hostname):
            log.debug("looking host %s up on the caller's thread: not learned", hostname)
            if self._own_names is None:
                self._own_names = own_names()
            self._remember(hostname, _answer(hostname, self._addresses, self._own_names))
        if hostname in self._unresolvable:
            raise UsageError(self._unresolvable[hostname])
        return self._local[hostname]

    def detached(self, hostname: str) -> bool:
        """Whether workers on `hostname` outlive the driver, their output in files there
        (the job's state outlives it too). The same for every host: a remote one's agent
        relays the files (see `ssh_relay.py`)."""
        return self._detached

    def usable(self, hostname: str) -> bool:
        """False for a (discovered) host name that does not resolve; logged once."""
        try:
            self.is_local(hostname)
        except UsageError as err:
            if hostname not in self._reported:
                self._reported.add(hostname)
                log.error("ignoring discovered host: %s", err)
            return False
        return True

    def bind_address(self, hosts: list[HostSpec], interface: str | None) -> str:
        """The interface's address if given; loopback when every host is local; else the
        address that routes to the first remote host."""
        if interface:
            return interface_address(interface)
        remote = [h.hostname for h in hosts if not self.is_local(h.hostname)]
        return route_source(remote[0], self._resolved.get(remote[0])) if remote else "127.0.0.1"

    def launcher(self, hostname: str) -> Launcher:
        return self._local_launcher if self.is_local(hostname) else self._ssh_launcher

    async def check_reachable(self, hostnames: set[str], fatal: bool) -> set[str]:
        """Check ssh to the remote hosts not checked yet; return the unreachable ones (each
        logged). With `fatal`, the first unreachable host raises `LaunchError` instead."""
        remote = sorted(h for h in hostnames if not self.is_local(h) and h not in self._reachable)
        checks = [self._ssh_launcher.check_reachable(h, self._ssh_timeout) for h in remote]
        failed = set()
        results = await asyncio.gather(*checks, return_exceptions=True)
        for hostname, result in zip(remote, results, strict=True):
            if isinstance(result, BaseException):
                if fatal or not isinstance(result, LaunchError):
                    raise result
                log.error("%s", result)
                failed.add(hostname)
            else:
                self._reachable.add(hostname)
        return failed


def _answer(hostname: str, local: set[str], names: set[str]) -> tuple[bool, set[str]] | UsageError:
    """`look_up`'s answer, or the error it raised (to be remembered)."""
    try:
        return look_up(hostname, local, names)
    except UsageError as err:
        return err
