"""One job's lifecycle: serve the rendezvous, launch workers, watch them, re-form, end the job.

A static job (no discovery, no `--min-np`) is the degenerate elastic job: its hosts are fixed
and the first failure ends it. An elastic job re-forms after every failure, join and leave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import signal
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from elastic.driver.control.channels import ControlChannels
from elastic.driver.control.events import ControlEvent, EpochBroken, HostsUpdated
from elastic.driver.control.server import ControlServer
from elastic.driver.discovery import (
    DiscoveryError,
    FixedHosts,
    HostChange,
    HostDiscovery,
    HostTracker,
    ScriptDiscovery,
)
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec, parse_host_list
from elastic.driver.errors import LaunchError, UsageError
from elastic.driver.journal.backend import StateBackend
from elastic.driver.journal.journal import JobJournal, backend_for
from elastic.driver.journal.memory import MemoryBackend, MemoryKeyValueStore
from elastic.driver.journal.record import (
    CooldownRecord,
    JobSecret,
    JobSpec,
    JobState,
)
from elastic.driver.journal.resume import (
    default_log_root,
    settings_document,
    settings_from,
    worker_from,
    worker_record,
)
from elastic.driver.launch.detached import (
    AdoptedProcess,
)
from elastic.driver.launch.fleet import Fleet
from elastic.driver.launch.host_access import HostAccess
from elastic.driver.policy.liveness import Limits, Verdict, judge
from elastic.driver.policy.planning import free_slots
from elastic.driver.policy.rounds import (
    AskToLeave,
    Decision,
    FillSlots,
    Finish,
    FormRound,
    JobView,
    Launch,
    Phase,
    RecordFleetLoss,
    ShowProgress,
    WaitForWorkers,
    Warn,
    fill_slots,
    fleet_lost,
    hosts_removed,
    job_end,
    joiner_waiting,
    next_round,
    summarize,
    survivors_not_waiting,
    tick,
)
from elastic.driver.rendezvous.rounds import Rendezvous
from elastic.driver.server.app import HttpServer, create_app
from elastic.driver.server.services import Services
from elastic.driver.server.tls import TlsIdentity
from elastic.driver.settings import Settings
from elastic.driver.workers import Worker, WorkerState
from elastic.protocol import env as worker_env
from elastic.protocol.etcd import DriverAddress, certificate_mac
from elastic.protocol.http import DecisionRecord, HostStatus, JobStatus, WorkerStatus
from elastic.protocol.leave import EXIT_REASONS, FINISHED

log = logging.getLogger("elasticrun")

PROGRESS_EVERY = 10.0  # seconds between "still waiting" lines
SERIAL_GAP = 1000  # worker numbers a restarted driver skips (see `_restore`)
ROUND_BATCH = 0.005  # seconds a round waits for more changes seen at the same time...
ROUND_AFTER_DEATH = 0.25  # ...and after a death, at most, for every survivor to rejoin
DECISIONS_KEPT = 50  # the newest decisions `/v1/status` shows
PAUSE_WORTH_SAYING = 1.0  # seconds: a shorter pause (a loaded machine) is excused silently


def describe_exit(worker: Worker) -> str:
    if worker.process.signal is not None:
        name = signal.Signals(worker.process.signal).name
        return f"was killed by signal {name} (exit code {worker.exit_code})"
    return f"exited with code {worker.exit_code}"


class Job:
    """Owns the driver's servers and workers from launch to the job's end.

    `run()` returns the launcher's exit code: 0 when every worker of the current epoch exits
    0; in a static job the first failing worker's code (the others are stopped: SIGTERM, then
    SIGKILL after the grace period); in an elastic job 1 when a limit ends it (elastic
    timeout, reset limit) or the last failure's code when every worker failed; 128+N when the
    launcher itself received signal N. It raises `LaunchError` when the job cannot start. No
    worker outlives `run()`, except when this driver lost its job to another one.

    With a durable backend, the job's state is saved as it changes, and a driver started
    again with the same job id after this one died takes the job up: it re-adopts the
    running workers instead of launching new ones.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backend: StateBackend | None = None,
        hosts: HostAccess | None = None,
        discovery: HostDiscovery | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Collaborators not passed in are built from the settings (again from the saved
        ones when the job is taken up after a driver restart)."""
        self.job_id = settings.backend.job_id or uuid.uuid4().hex[:12]
        self._driver_id = uuid.uuid4().hex
        self._journal = JobJournal(
            backend if backend is not None else MemoryBackend(),
            self.job_id,
            self._driver_id,
            settings.backend.grace,
            self._lost_job,
        )
        self._token = secrets.token_urlsafe(32)
        self._log_root = default_log_root(self.job_id)
        self._clock = clock
        self._kv = MemoryKeyValueStore()
        self._rendezvous = Rendezvous(on_wait=self._on_wait, on_join=self._on_join)
        self._channels = ControlChannels()
        self._tls: TlsIdentity | None = None
        self._phase = Phase.RUNNING
        self._resets = 0
        self._short_since: float | None = None  # when the SHORT phase began
        self._round_reasons: list[str] = []  # why a round is wanted, until it is formed
        self._round_timer: asyncio.TimerHandle | None = None
        self._rejoin_awaited: set[str] | None = None  # survivors a wanted round waits for
        self._broken: set[int] = set()  # rounds every live worker was told are broken
        self._failure_reported: set[int] = set()  # rounds a member said failed, unseen here
        self._decisions: deque[DecisionRecord] = deque(maxlen=DECISIONS_KEPT)
        self._last_progress = 0.0
        self._update_version = 0
        self._newest_commit = 0  # the newest commit count any worker reported
        self._commit_at_fleet_loss: int | None = None  # newest commit when all last died
        self._tasks: set[asyncio.Task[None]] = set()
        self._result: asyncio.Future[int] | None = None
        self._end_message = ""
        self._driver_url = ""
        self._control_address = ""
        self._given_hosts = hosts
        self._given_discovery = discovery
        self._configure(settings)

    @classmethod
    def from_settings(cls, settings: Settings) -> Job:
        """A job with the collaborators its settings name (the state backend among them)."""
        return cls(settings, backend=backend_for(settings.backend))

    def _configure(self, settings: Settings) -> None:
        self.settings = settings
        self.elastic = settings.elastic
        self._hosts = self._given_hosts or HostAccess(
            settings.ssh,
            settings.stop_grace,
            settings.start_timeout,
            detached=settings.backend.durable,
        )
        self._fleet = Fleet(
            self._hosts, self._log_root, settings.output_dir, settings.stop_grace, self._clock
        )
        self._workers = self._fleet.workers
        low, high = self.elastic.cooldown_range if self.elastic else (0.0, 0.0)
        self._tracker = HostTracker(Cooldown(low, high, random.Random()))
        self._discovery: HostDiscovery = self._given_discovery or (
            ScriptDiscovery(
                self.elastic.discovery_script,
                self.elastic.discovery_timeout,
                self.elastic.slots_per_host,
            )
            if self.elastic and self.elastic.discovery_script
            else FixedHosts(settings.hosts)
        )

    # --- the lifecycle ---------------------------------------------------------------------

    async def run(self) -> int:
        self._result = asyncio.get_running_loop().create_future()
        documents = await self._journal.claim()
        try:
            return await self._run(documents)
        finally:
            await self._record_result()
            await self._journal.close()

    async def _run(self, documents: dict[str, bytes]) -> int:
        assert self._result is not None
        resumed = "state" in documents
        if resumed:
            self._restore(documents)
            hosts = list(self._tracker.hosts if self.elastic else self.settings.hosts)
        else:
            hosts = await self._first_hosts()
        await self._hosts.learn(h.hostname for h in hosts)  # DNS, off the event loop
        address = self._hosts.bind_address(hosts, self.settings.network_interface)
        services = Services(
            self._token,
            self._kv,
            self._rendezvous,
            self.status,
            durable=self._journal.flush,
            newest_commit=lambda: self._newest_commit,
        )
        self._tls = self._tls or self._tls_identity(address)
        http = HttpServer(create_app(services), address, tls=self._tls)
        control = ControlServer(
            self,
            self._token,
            address,
            heartbeat_interval=self.settings.heartbeat_interval,
            tls=self._tls,
        )
        await http.start()
        await control.start()
        self._driver_url, self._control_address = http.url, control.address
        log.debug("job %s: HTTP API on %s, control on %s", self.job_id, http.url, control.address)
        try:
            await self._publish(new=not resumed)
            if resumed:
                self._adopt()
            else:
                await self._launch_first_epoch(hosts)
            self._spawn(self._watch_liveness())
            self._spawn(self._handle_exits())
            if self.elastic is not None:
                self._spawn(self._follow_discovery())
            return await self._result
        finally:
            for task in self._tasks:
                task.cancel()
            if self._round_timer is not None:
                self._round_timer.cancel()
            await self._fleet.close(abandon=self._phase is Phase.ABANDONED)
            await control.stop(grace=0.5)
            await http.stop()

    def _tls_identity(self, address: str) -> TlsIdentity | None:
        """The certificate to serve with: the user's, a new self-signed one, or none."""
        if not self.settings.tls:
            return None
        if self.settings.tls_cert is not None and self.settings.tls_key is not None:
            return TlsIdentity.load(self.settings.tls_cert, self.settings.tls_key)
        return TlsIdentity.make_self_signed(sorted({address, "127.0.0.1", "localhost"}))

    # --- the job's durable state -----------------------------------------------------------

    def _lost_job(self) -> None:
        self._phase = Phase.ABANDONED
        self._finish(
            1,
            f"another driver took job {self.job_id} over (this driver's claim expired): "
            "leaving the workers to it",
        )

    async def _publish(self, new: bool) -> None:
        """Publish this driver's address (and a new job's spec) in the journal.

        With TLS the address carries this driver's certificate and its MAC under the job
        token, so workers of an earlier driver pin it (a restarted driver's certificate is
        new). No private key is saved."""
        cert = self._tls.cert_pem if self._tls is not None else None
        address = DriverAddress(
            driver_id=self._driver_id,
            url=self._driver_url,
            control_address=self._control_address,
            host=os.uname().nodename,
            pid=os.getpid(),
            tls_cert=cert.decode() if cert is not None else None,
            tls_cert_mac=certificate_mac(self._token, cert) if cert is not None else None,
        )
        spec = None
        if new:
            spec = JobSpec(
                job_id=self.job_id,
                created=time.time(),
                settings=settings_document(self.settings),
                log_root=self._log_root,
            )
        await self._journal.publish(address, self._token, spec, self._snapshot, self._spawn)

    def _snapshot(self) -> bytes:
        ended = [w for w in self._workers.values() if not w.state.alive]
        kept = [w for w in self._workers.values() if w.state.alive] + ended[-100:]
        cooldown = self._tracker.cooldown
        wall = time.time() - self._clock()
        state = JobState(
            epoch=self._rendezvous.epoch,
            members=self._rendezvous.members,
            workers=[worker_record(w) for w in kept],
            discovered=[f"{h.hostname}:{h.slots}" for h in self._tracker.discovered_hosts],
            cooldowns=[
                CooldownRecord(hostname=host, failures=failures, until=until + wall)
                for host, (failures, until) in cooldown.records().items()
            ],
            serial=self._fleet.serial,
            resets=self._resets,
            update_version=self._update_version,
            finishing=not self._phase.forms_rounds,
            newest_commit=self._newest_commit,
        )
        return state.model_dump_json().encode()

    def _restore(self, documents: dict[str, bytes]) -> None:
        """Take the job up as the saved documents describe it (the saved settings win)."""
        spec = JobSpec.model_validate_json(documents["spec"])
        settings = settings_from(spec.settings, self.settings.backend)
        if self.settings.command and self.settings.command != settings.command:
            log.warning(
                "job %s runs %s (as first started); ignoring this command line's command",
                self.job_id,
                " ".join(settings.command),
            )
        self._configure(settings)
        self._log_root = self._fleet.log_root = spec.log_root
        secret = JobSecret.model_validate_json(documents["secret"])
        self._token = secret.token  # TLS: `_tls_identity` reads the key file or makes a new one
        state = JobState.model_validate_json(documents["state"])
        # The dead driver may have launched workers after its last save (etcd down): never
        # give their numbers, hence their ids, to new workers.
        self._fleet.serial, self._resets = state.serial + SERIAL_GAP, state.resets
        self._update_version = state.update_version
        self._newest_commit = state.newest_commit
        for record in state.workers:
            worker = worker_from(record)
            self._workers[worker.worker_id] = worker
        self._rendezvous.restore(
            state.epoch, [(w, self._workers[w].hostname) for w in state.members]
        )
        wall = time.time() - self._clock()
        for saved in state.cooldowns:
            self._tracker.cooldown.restore(saved.hostname, saved.failures, saved.until - wall)
        if state.discovered:
            self._tracker.discovered(parse_host_list(",".join(state.discovered)), self._clock())
        if state.finishing:
            self._begin_finishing()
        log.info(
            "resuming job %s at round %d: %d worker(s) to re-adopt",
            self.job_id,
            state.epoch,
            sum(1 for w in self._workers.values() if w.state.alive),
        )

    def _adopt(self) -> None:
        """Watch the workers an earlier driver launched, as if this one had; finish stopping
        those it was stopping when it died; kill those it launched after its last save."""
        for worker in self._workers.values():
            stopping = worker.state is WorkerState.STOPPED and worker.exit_code is None
            if worker.state.alive or stopping:
                self._fleet.adopt(worker, self._folder(worker), self._label(worker))
            if stopping:
                self._stop(worker)
        self._fleet.stop_strays()

    async def _record_result(self) -> None:
        """Save how the job ended (not when this driver merely lost it)."""
        if self._phase is Phase.ABANDONED or self._result is None or not self._result.done():
            return
        await self._journal.record_result(
            self._result.result(), self._end_message, self._snapshot()
        )

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            if isinstance(error, UsageError | LaunchError):
                self._finish(1, str(error))
            else:
                log.error("driver error: %r", error, exc_info=error)
                self._finish(1, f"driver error: {error!r}")

    def _finish(self, code: int, message: str | None = None) -> None:
        """End the job with `code` (the first call wins), logging `message`."""
        if self._phase is not Phase.ABANDONED:
            self._phase = Phase.ENDED  # no more rounds or launches while the job ends
        self._rendezvous.close()  # workers re-joining now are told to leave
        if self._result is not None and not self._result.done():
            if message:
                (log.error if code else log.info)("%s", message)
            self._end_message = message or ""
            self._result.set_result(code)

    def request_stop(self, signum: int) -> None:
        """Called on SIGINT/SIGTERM: stop every worker and end the job with 128+signum."""
        self._finish(128 + signum, f"received {signal.Signals(signum).name}: stopping all workers")

    async def _first_hosts(self) -> list[HostSpec]:
        """The hosts to start on. Elastic: wait (up to the start timeout) for discovery to
        offer at least --min-np slots, printing progress."""
        if self.elastic is None:
            return list(self.settings.hosts)
        start = self._clock()
        needed = self.elastic.min_np
        while True:
            await self._discover_once()
            usable = [h for h in self._tracker.hosts if self._hosts.usable(h.hostname)]
            slots = sum(h.slots for h in usable)
            if slots >= needed:
                return usable
            waited = self._clock() - start
            if waited >= self.settings.start_timeout:
                problem = f" (discovery: {self._tracker.error})" if self._tracker.error else ""
                raise LaunchError(
                    f"discovery found {slots} slot(s), fewer than --min-np {needed}, within "
                    f"{self.settings.start_timeout:g} s (--start-timeout){problem}"
                )
            self._progress(f"waiting for {needed} slot(s) from discovery, {slots} so far")
            await asyncio.sleep(self.elastic.discovery_interval)

    async def _launch_first_epoch(self, hosts: list[HostSpec]) -> None:
        """Launch the first workers on `hosts` and form epoch 1 with them at once: -np of
        them (elastic: default every slot), at most --max-np."""
        wanted = self.settings.np if self.settings.np is not None else sum(h.slots for h in hosts)
        if self.elastic is not None and self.elastic.max_np is not None:
            wanted = min(wanted, self.elastic.max_np)
        places = free_slots(hosts, {}, wanted)
        if self.elastic is None and len(places) < wanted:
            raise UsageError(f"-np {wanted} is larger than the {len(places)} slot(s) available")
        await self._hosts.check_reachable({hostname for hostname, _ in places}, fatal=True)
        workers = [self._new_worker(hostname, slot) for hostname, slot in places]
        self._rendezvous.form([(w.worker_id, w.hostname) for w in workers])
        for worker in workers:
            worker.state = WorkerState.MEMBER
        self._save_soon()
        for worker in workers:
            await self._start(worker)
        (log.info if self.elastic else log.debug)(
            "round 1: %d worker(s) on %s", len(workers), _host_summary(workers)
        )

    # --- launching -------------------------------------------------------------------------

    def _new_worker(self, hostname: str, host_slot: int) -> Worker:
        return self._fleet.new_worker(hostname, host_slot)

    def _worker_env(self, worker: Worker) -> dict[str, str]:
        environment = worker_env.WorkerEnvironment(
            driver_url=self._driver_url,
            control_address=self._control_address,
            token=self._token,
            worker_id=worker.worker_id,
            hostname=worker.hostname,
            job_id=self.job_id,
            elastic=self.elastic is not None,
            start_timeout=self.settings.start_timeout,
            collective_timeout=self.settings.collective_timeout,
            **({"elastic_timeout": self.elastic.elastic_timeout} if self.elastic else {}),
            tls_cert=self._tls.cert_pem if self._tls else None,
            etcd=self.settings.backend.etcd,  # workers find a restarted driver through etcd
            driver_wait=self.settings.backend.driver_wait,
            slot=self._rendezvous.slot_of(worker.worker_id),  # its first epoch formed already
        )
        return {
            **os.environ,
            **environment.to_env(),
            "PYTHONUNBUFFERED": "1",
            "GRPC_VERBOSITY": os.environ.get("GRPC_VERBOSITY", "ERROR"),
        }

    def _label(self, worker: Worker) -> Callable[[], str]:
        """The output tag of `worker`: its rank now, else the last rank it had, else its id."""
        last = worker.worker_id

        def label() -> str:
            nonlocal last
            slot = self._rendezvous.slot_of(worker.worker_id)
            if slot is not None:
                last = str(slot.rank)
            return last

        return label

    def _folder(self, worker: Worker) -> str:
        """The worker's folder under --output-filename: its first rank, else its serial."""
        slot = self._rendezvous.slot_of(worker.worker_id)
        return f"rank.{slot.rank}" if slot is not None else f"worker.{worker.serial}"

    async def _start(self, worker: Worker) -> None:
        """Start `worker`'s process; a failure to start fails the worker (static: the job)."""
        try:
            await self._fleet.start(
                worker,
                self.settings.command,
                self._worker_env(worker),
                self._folder(worker),
                self._label(worker),
            )
        except LaunchError as err:
            if self.elastic is None or self._hosts.is_local(worker.hostname):
                raise  # the command cannot run here: trying again would not help
            worker.state = WorkerState.FAILED
            log.error("cannot start a worker on host %s: %s", worker.hostname, err)
            self._host_failed(worker.hostname, str(err))

    async def _handle_exits(self) -> None:
        while True:
            self._on_exit(await self._fleet.exits.get())

    def _on_exit(self, worker: Worker) -> None:
        """`worker`'s process ended (its code is `worker.exit_code`)."""
        code = worker.exit_code
        assert code is not None
        self._channels.forget(worker.worker_id)
        if worker.state is WorkerState.STOPPED or not worker.state.alive:
            return
        if worker.state is WorkerState.LEAVING and not worker.handing_over:
            worker.state = WorkerState.EXITED
            if code != 0:
                log.warning("%s left with exit code %d", self._where(worker), code)
            self._scale()  # its slot is free again
        elif (
            code == 0
            and not worker.exiting
            and isinstance(worker.process, AdoptedProcess)
            and worker.process.ended_unwatched
        ):
            self._left_unseen(worker)
        elif code == 0:
            self._worker_exited(worker)
        elif code in (126, 127) and not worker.registered:
            self._finish(
                code,
                f"{self._where(worker)} could not run {self.settings.command[0]!r} (exit code "
                f"{code}: {'not found' if code == 127 else 'not executable'}); its output says "
                "more",
            )
        else:
            self._worker_failed(worker, describe_exit(worker))

    # --- decisions -------------------------------------------------------------------------

    def _members(self) -> list[Worker]:
        return [self._workers[w] for w in self._rendezvous.members]

    def _where(self, worker: Worker) -> str:
        slot = self._rendezvous.slot_of(worker.worker_id)
        rank = f"rank {slot.rank}" if slot is not None else f"worker {worker.worker_id}"
        return f"{rank} on host {worker.hostname}"

    def _worker_exited(self, worker: Worker) -> None:
        """A worker ended with 0. A member doing so means training is over: the others of
        its epoch are told to leave at their next join, and the job ends once they exit."""
        was_member = worker.worker_id in self._rendezvous.members
        worker.state = WorkerState.EXITED
        if was_member:
            self._begin_finishing()
        self._check_done()

    def _left_unseen(self, worker: Worker) -> None:
        """`worker` exited 0 while no driver watched, without a saved word that it finished:
        it left (its leave was not saved, etcd was down), which is no end of training. Re-form
        without it; the job ends only if every worker is gone that way."""
        was_member = worker.worker_id in self._rendezvous.members
        worker.state = WorkerState.EXITED
        log.warning(
            "%s exited with code 0 while no driver watched it, without having said that it "
            "finished: counted as having left the job",
            self._where(worker),
        )
        if was_member and self.elastic is not None:
            self._reform(f"{self._where(worker)} left")
        if not self._alive():
            self._check_done()
        else:
            self._scale()

    def _begin_finishing(self) -> None:
        """Training is over (a member finished): no new round, no new worker; joiners are
        stopped, members re-joining are told to leave, the others end their part and exit."""
        if not self._phase.forms_rounds:
            return
        self._phase = Phase.FINISHING
        self._rendezvous.close()
        self._save_soon()
        for other in self._workers.values():
            if other.state is WorkerState.LAUNCHING:
                self._stop(other)

    def _check_done(self) -> None:
        self._apply(job_end(self._view()))

    def _worker_failed(self, worker: Worker, reason: str) -> None:
        """`worker` died. Static: end the job with its code. Elastic: cool its host down,
        break its epoch, re-form from the survivors."""
        was_member = worker.worker_id in self._rendezvous.members
        was_leaving = worker.state is WorkerState.LEAVING
        worker.state = WorkerState.FAILED
        worker.handing_over = False  # dead: its state goes with it
        where = self._where(worker)
        if self.elastic is None:
            self._finish(worker.exit_code or 1, f"{where} {reason}; stopping the other workers")
            return
        log.error("%s %s", where, reason)
        self._host_failed(worker.hostname, reason)
        if not self._phase.forms_rounds:
            self._check_done()
            return
        epoch = self._rendezvous.epoch
        if was_member:
            self._break_round(epoch, f"{where} {reason}")
            self._reform(f"{where} {reason}", broken=True)
        elif was_leaving:  # peers may still be in a collective of its last epoch with it
            self._break_round(epoch - 1, f"{where} {reason}")
        if not self._alive():
            self._fleet_lost(worker)
        else:
            self._scale()  # refill the slot at once if its host is not in cooldown
            self._check_handovers()

    def _fleet_lost(self, last: Worker) -> None:
        """Every worker is dead: start again, saying the state is lost, or end (`fleet_lost`)."""
        self._apply(fleet_lost(self._view(), last.exit_code, self._clock()))

    def _host_failed(self, hostname: str, reason: str) -> None:
        update = self._tracker.host_failed(hostname, self._clock())
        until = self._tracker.cooldown.until(hostname)
        if until is not None and until > self._clock():
            log.warning(
                "host %s in cooldown for %.0f s (%s)", hostname, until - self._clock(), reason
            )
        if update.change is not None:
            self._hosts_changed(update.change)

    def _alive(self) -> list[Worker]:
        return self._fleet.alive()

    def _reform(self, why: str, broken: bool = False) -> None:
        """Ask for the next round; every request made until it forms is answered by it.

        It forms `ROUND_BATCH` after the first request; when the current round is `broken`
        (a member died), once every survivor waits at the rendezvous to rejoin, or after
        `ROUND_AFTER_DEATH`: it is of no use before, and k deaths seen meanwhile cost one
        round, not k."""
        self._round_reasons.append(why)
        if self._round_timer is None:
            loop = asyncio.get_running_loop()
            delay = ROUND_AFTER_DEATH if broken else ROUND_BATCH
            self._round_timer = loop.call_later(delay, self._form_wanted_round)
            self._rejoin_awaited = survivors_not_waiting(self._view()) if broken else None
        self._form_if_survivors_wait()

    def _form_if_survivors_wait(self, waiting: str | None = None) -> None:
        """Form the wanted round now if every survivor of the broken one waits (`waiting`
        has just come to the rendezvous); dead ones are no longer awaited."""
        awaited = self._rejoin_awaited
        if awaited is None or self._round_timer is None:
            return
        awaited.discard(waiting)  # type: ignore[arg-type]
        for worker_id in [w for w in awaited if not self._workers[w].state.alive]:
            awaited.discard(worker_id)
        if not awaited:
            self._round_timer.cancel()
            self._form_wanted_round()

    def _form_wanted_round(self) -> None:
        self._round_timer, self._rejoin_awaited = None, None
        reasons, self._round_reasons = self._round_reasons, []
        self._apply(next_round(self._view(), summarize(reasons), self._clock()))

    def _view(self) -> JobView:
        return JobView(
            phase=self._phase,
            elastic=self.elastic,
            workers=self._workers,
            members=self._rendezvous.members,
            waiting=self._rendezvous.waiting,
            resets=self._resets,
            short_since=self._short_since if self._phase is Phase.SHORT else None,
            newest_commit=self._newest_commit,
            commit_at_fleet_loss=self._commit_at_fleet_loss,
        )

    def _apply(self, decision: Decision) -> None:
        """Carry out `decision`'s actions in order; keep and (--verbose) log its reason."""
        if decision.reason:
            self._decisions.append(
                DecisionRecord(
                    time=time.time(), round=self._rendezvous.epoch, reason=decision.reason
                )
            )
            log.debug("decision: %s", decision.reason)
        for action in decision.actions:
            if isinstance(action, FormRound):
                self._form_round(list(action.members), decision.reason)
            elif isinstance(action, WaitForWorkers):
                self._phase, self._short_since = Phase.SHORT, action.since
            elif isinstance(action, FillSlots):
                self._scale()
            elif isinstance(action, Launch):
                self._spawn(self._grow(list(action.places)))
            elif isinstance(action, AskToLeave):
                self._request_leave(self._workers[action.worker_id], action.why)
            elif isinstance(action, Finish):
                self._finish(action.code, action.message or None)
            elif isinstance(action, Warn):
                log.warning("%s", action.line)
            elif isinstance(action, ShowProgress):
                self._progress(action.line)
            elif isinstance(action, RecordFleetLoss):
                self._commit_at_fleet_loss = action.commit

    def _form_round(self, members: list[str], why: str) -> None:
        """Form the next round with `members` and tell the previous members about it."""
        previous = self._rendezvous.members
        self._phase, self._short_since = Phase.RUNNING, None
        self._resets += 1
        epoch = self._rendezvous.form([(w, self._workers[w].hostname) for w in members])
        # Nobody can still use the keys of the epoch before the previous one: drop them.
        self._spawn(self._kv.delete_prefix(Rendezvous.epoch_prefix(epoch - 2)))
        for worker_id in members:
            if self._workers[worker_id].state is WorkerState.LAUNCHING:
                self._workers[worker_id].state = WorkerState.MEMBER  # a leaving one stays so
        self._save_soon()
        before, after = set(previous), set(members)  # sets: O(N), not O(N²), per round
        added = [w for w in members if w not in before]
        removed = [w for w in previous if w not in after]
        self._update_version += 1
        update = HostsUpdated(
            self._update_version,
            epoch,
            tuple(self._workers[w].hostname for w in added),
            tuple(self._workers[w].hostname for w in removed),
        )
        told = [self._workers[w] for w in previous if self._workers[w].state.alive]
        self._broadcast(update, told)
        log.info(
            "round %d: %d worker(s) on %s (%s)",
            epoch,
            len(members),
            _host_summary([self._workers[w] for w in members]),
            why,
        )

    def _save_soon(self) -> None:
        self._journal.save_soon()

    def _scale(self) -> int:
        """Launch workers on free slots of usable hosts (`fill_slots`); return how many."""
        hosts = [h for h in self._tracker.hosts if self._hosts.usable(h.hostname)]
        decision = fill_slots(self._view(), hosts)
        self._apply(decision)
        return sum(len(a.places) for a in decision.actions if isinstance(a, Launch))

    async def _grow(self, places: list[tuple[str, int]]) -> None:
        unreachable = await self._hosts.check_reachable({h for h, _ in places}, fatal=False)
        for hostname in unreachable:
            self._host_failed(hostname, "unreachable through ssh")
        started = []
        for hostname, slot in places:
            taken = any(
                w.hostname == hostname and w.host_slot == slot and w.state.alive
                for w in self._workers.values()
            )
            if hostname in unreachable or taken or not self._phase.forms_rounds:
                continue
            worker = self._new_worker(hostname, slot)
            await self._start(worker)
            started.append(worker)
        if started:
            log.info("launched %d worker(s) on %s", len(started), _host_summary(started))

    def _request_leave(self, worker: Worker, why: str) -> None:
        """`worker` leaves at its next commit: no rollback, no cooldown. If it holds the only
        copy of the newest commit, it first stays a member until another worker (a survivor,
        or a joiner launched for this) reports holding that commit."""
        if worker.state is WorkerState.LAUNCHING:
            log.info("%s is stopped: %s", self._where(worker), why)
            self._stop(worker)
            return
        if worker.state is not WorkerState.MEMBER:
            return
        worker.state = WorkerState.LEAVING
        if self.elastic is None or self._handed_over(worker):
            self._let_go(worker, why)
            return
        worker.handing_over = True
        worker.leave_reason = why
        self._save_soon()
        log.info(
            "%s leaves the job (%s) once another worker holds its state (commit %d)",
            self._where(worker),
            why,
            worker.commit,
        )
        self._check_handovers()

    def _let_go(self, worker: Worker, why: str) -> None:
        """Exclude the leaving `worker` from the job and re-form without it."""
        worker.handing_over = False
        self._rendezvous.exclude(worker.worker_id)
        log.info("%s leaves the job: %s", self._where(worker), why)
        if self.elastic is not None:
            self._reform(f"{self._where(worker)} leaves: {why}")
        else:
            self._save_soon()

    def _handed_over(self, worker: Worker) -> bool:
        """Whether another member that stays holds `worker`'s newest commit (or it has none)."""
        return worker.commit == 0 or any(
            other.state is WorkerState.MEMBER and other.commit >= worker.commit
            for other in self._members()
            if other is not worker
        )

    def _check_handovers(self) -> None:
        """Let every leaving worker go whose state another member now holds, or for which no
        worker is there, or can be started, to take it over (its state then goes with it)."""
        for worker in list(self._workers.values()):
            if not (worker.handing_over and worker.state.alive):
                continue
            if self._handed_over(worker):
                self._let_go(
                    worker,
                    f"{worker.leave_reason}; another worker holds its state now "
                    f"(commit {worker.commit})",
                )
            elif (
                not any(
                    w.state in (WorkerState.LAUNCHING, WorkerState.MEMBER) for w in self._alive()
                )
                and not self._scale()
            ):
                log.warning(
                    "%s takes the only copy of the job's state (commit %d) with it: no other "
                    "worker can be started to take it over",
                    self._where(worker),
                    worker.commit,
                )
                self._let_go(worker, f"{worker.leave_reason}; nobody can take its state over")

    def _note_commit(self, worker: Worker, commit: int) -> None:
        """`worker` reported that its state holds `commit` commits."""
        if commit == worker.commit:
            return
        worker.commit = commit
        self._newest_commit = max(self._newest_commit, commit)
        self._check_handovers()

    def _hosts_changed(self, change: HostChange) -> None:
        """Discovery or a cooldown changed the usable hosts."""
        discovered = {h.hostname for h in self._tracker.discovered_hosts}
        self._apply(hosts_removed(self._view(), change.removed, discovered))
        if change.added:
            log.info("hosts available: %s", ", ".join(change.added))
        self._scale()

    def _stop(self, worker: Worker) -> None:
        """Stop `worker` for good: exclude it, SIGTERM it, SIGKILL it after --stop-grace."""
        worker.state = WorkerState.STOPPED
        self._rendezvous.exclude(worker.worker_id)
        self._save_soon()
        self._fleet.stop(worker)

    def _break_round(self, epoch: int, why: str) -> None:
        """Tell every live worker that round `epoch` is broken, once per round: a worker
        blocked in one of its collectives gives up at the first word (k deaths seen at
        once cost N messages, not k times N)."""
        if epoch in self._broken:
            return
        self._broken.add(epoch)
        self._broadcast(EpochBroken(epoch, why), self._alive())

    def _broadcast(self, event: ControlEvent, workers: list[Worker]) -> None:
        self._channels.send(event, [w.worker_id for w in workers])

    # --- inputs from the rendezvous and the control service ------------------------------

    def _on_wait(self, worker_id: str, after_epoch: int, commit: int) -> None:
        """A worker whose state holds `commit` commits waits for an epoch after `after_epoch`."""
        worker = self._workers.get(worker_id)
        if worker is None or self.elastic is None or not self._phase.forms_rounds:
            return
        self._note_commit(worker, commit)
        self._catch_up(after_epoch)
        if worker.state is WorkerState.LAUNCHING:
            if worker.waiting_since is None:
                worker.waiting_since = self._clock()
            self._apply(joiner_waiting(self._view(), self._clock()))
        elif worker.state is WorkerState.MEMBER and after_epoch >= self._rendezvous.epoch:
            if self._round_timer is not None:
                self._form_if_survivors_wait(worker_id)
            elif after_epoch not in self._failure_reported:
                # It saw its round fail before the driver saw a death: re-form after one
                # heartbeat interval unless the death shows up first and re-forms itself.
                self._failure_reported.add(after_epoch)
                self._spawn(self._reform_if_still_waiting(after_epoch))

    def _catch_up(self, epoch: int) -> None:
        """A worker is in `epoch`, newer than any this driver knows: an earlier driver formed
        it and died before it could save it (etcd was down). Break that epoch and form a newer
        one from the workers this driver knows; those it does not know are refused (NOT_FOUND)
        when they call, and exit."""
        if epoch <= self._rendezvous.epoch or self.elastic is None:
            return
        if not self._phase.forms_rounds:
            return
        log.warning(
            "a worker is in round %d, which the previous driver formed but never saved (this "
            "driver resumed at round %d): re-forming",
            epoch,
            self._rendezvous.epoch,
        )
        self._rendezvous.advance_to(epoch)
        self._break_round(epoch, "the driver restarted")
        self._reform(f"round {epoch} was never saved", broken=True)

    async def _reform_if_still_waiting(self, epoch: int) -> None:
        await asyncio.sleep(self.settings.heartbeat_interval)
        if self._rendezvous.epoch == epoch and self._phase.forms_rounds:
            self._reform("a worker reported a failed collective", broken=True)

    def _on_join(self, worker_id: str, epoch: int) -> None:
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.joined = True

    def registered(self, worker_id: str, pid: int) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return False
        worker.registered = True
        worker.pid = pid
        worker.last_heartbeat = self._clock()
        return True

    def heartbeat(self, worker_id: str, epoch: int, commit: int) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return False
        worker.last_heartbeat = self._clock()
        self._note_commit(worker, commit)
        self._catch_up(epoch)
        return True

    def leave(self, worker_id: str, reason: str, commit: int) -> bool:
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return False
        # Before judging whether it holds the only copy of the state: a driver that has just
        # restarted may not have had a heartbeat from it yet.
        self._note_commit(worker, commit)
        if reason in EXIT_REASONS:
            worker.exiting = True  # judged by its exit code from now on, not by heartbeats
            self._save_soon()  # a restarted driver must know it said so (`_left_unseen`)
            # A member's script returned: training is over. That includes a leaver still
            # handing its state over (it is a member until then); one that already left is
            # none, and its exit says nothing about the others.
            if reason == FINISHED and worker_id in self._rendezvous.members:
                self._begin_finishing()
        else:
            self._request_leave(worker, reason)
        return True

    def stream_opened(self, worker_id: str) -> asyncio.Queue[ControlEvent] | None:
        worker = self._workers.get(worker_id)
        if worker is None or not worker.state.alive:
            return None
        worker.stream_closed_at = None
        return self._channels.open(worker_id)

    def stream_closed(self, worker_id: str, queue: asyncio.Queue[ControlEvent]) -> None:
        if not self._channels.close(worker_id, queue):
            return  # an older stream of a worker that has reconnected since
        worker = self._workers.get(worker_id)
        if worker is not None and worker.state.alive:
            worker.stream_closed_at = self._clock()

    # --- periodic checks -----------------------------------------------------------------

    async def _watch_liveness(self) -> None:
        """Declare dead (and kill) workers that miss heartbeats or whose control stream stays
        closed; fail workers that do not join in time; end the job past the elastic timeout."""
        limits = Limits(
            self.settings.heartbeat_interval, self.settings.stop_grace, self.settings.start_timeout
        )
        loop = asyncio.get_running_loop()
        every = min(limits.heartbeat_interval, 0.25)
        while True:
            due = loop.time() + every
            await asyncio.sleep(every)
            now = self._clock()
            self._excuse_pause(loop.time() - due, now)
            for worker, verdict in judge(self._workers.values(), now, limits):
                if verdict is Verdict.LINGERING:
                    worker.process.terminate()
                elif verdict is Verdict.NOT_JOINED:
                    self._not_joined(worker)
                else:
                    self._declare_dead(worker, verdict.value)
            self._apply(tick(self._view(), now))

    def _excuse_pause(self, late: float, now: float) -> None:
        """The liveness check woke `late` s late: this driver was paused (its loop blocked,
        its process stopped) and heard no heartbeat meanwhile. Missed heartbeats count from
        `now` again, so that the silence it caused does not make every worker hung."""
        if late < self.settings.heartbeat_interval:
            return
        if late >= PAUSE_WORTH_SAYING:
            log.warning(
                "this driver was paused for %.1f s (its event loop blocked, or its process "
                "stopped): workers' heartbeats are awaited from now",
                late,
            )
        for worker in self._workers.values():
            worker.last_heartbeat = max(worker.last_heartbeat, now)

    def _declare_dead(self, worker: Worker, reason: str) -> None:
        worker.process.kill()
        self._worker_failed(worker, reason)

    def _not_joined(self, worker: Worker) -> None:
        timeout = self.settings.start_timeout
        if self.elastic is None:
            missing = sorted(
                slot.rank
                for w in self._alive()
                if not w.joined and (slot := self._rendezvous.slot_of(w.worker_id)) is not None
            )
            self._finish(
                1,
                f"rank(s) {missing} did not join the rendezvous within {timeout:g} s "
                "(--start-timeout)",
            )
            return
        worker.process.kill()
        self._worker_failed(worker, f"did not join within {timeout:g} s (--start-timeout)")

    def _progress(self, line: str) -> None:
        now = self._clock()
        if now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            log.warning("%s", line)

    async def _discover_once(self) -> None:
        try:
            hosts = await self._discovery.find()
        except DiscoveryError as err:
            update = self._tracker.discovery_failed(str(err), self._clock())
            if update.error:
                log.error("host discovery failed, keeping the last good hosts: %s", update.error)
        else:
            await self._hosts.learn(h.hostname for h in hosts)  # DNS, off the event loop
            update = self._tracker.discovered(hosts, self._clock())
            if update.recovered:
                log.warning("host discovery works again")
        if update.change is not None and self._result is not None and self._rendezvous.epoch:
            self._hosts_changed(update.change)

    async def _follow_discovery(self) -> None:
        assert self.elastic is not None
        while True:
            await asyncio.sleep(self.elastic.discovery_interval)
            await self._discover_once()
            expiry = self._tracker.next_expiry(self._clock() - 1e-9)
            if expiry is not None and expiry <= self._clock():
                update = self._tracker.refresh(self._clock())
                if update.change is not None:
                    self._hosts_changed(update.change)

    # --- stopping ------------------------------------------------------------------------

    # --- status --------------------------------------------------------------------------

    def status(self) -> JobStatus:
        hosts = self._tracker.hosts if self.elastic is not None else self.settings.hosts
        workers = []
        for worker in self._workers.values():
            slot = self._rendezvous.slot_of(worker.worker_id)
            workers.append(
                WorkerStatus(
                    worker_id=worker.worker_id,
                    rank=slot.rank if slot is not None else None,
                    hostname=worker.hostname,
                    local_rank=slot.local_rank if slot is not None else None,
                    state=worker.state.value,
                    pid=worker.pid,
                    exit_code=worker.exit_code,
                )
            )
        return JobStatus(
            job_id=self.job_id,
            epoch=self._rendezvous.epoch,
            size=len(self._rendezvous.members),
            hosts=[HostStatus(hostname=h.hostname, slots=h.slots) for h in hosts],
            workers=workers,
            decisions=list(self._decisions),
        )


def _host_summary(workers: list[Worker]) -> str:
    counts: dict[str, int] = {}
    for worker in workers:
        counts[worker.hostname] = counts.get(worker.hostname, 0) + 1
    return ", ".join(f"{host}:{count}" for host, count in counts.items())
