"""The driver's Prometheus metrics, made at scrape time from a snapshot of the job.

Gauges come from the job's status taken when a scrape asks (nothing is kept up to date
between scrapes, so an unscraped job pays nothing), and the text is made from that snapshot
off the event loop; the recovery histogram is fed as rounds form. Names and labels are
listed in docs/operating.md ("Metrics"). Nothing here is secret: no token, no command line, no
environment.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elastic.protocol.http import JobStatus, WorkerStatus

RECOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LIVE_STATES = ("launching", "member", "leaving")
ENDED_STATES = ("exited", "failed", "stopped")
HOST_STATES = ("active", "cooldown", "leaving", "drained")
_LABELS = ("rank", "host", "worker")


def _labels(worker: WorkerStatus) -> list[str]:
    rank = "" if worker.rank is None else str(worker.rank)
    return [rank, worker.hostname, worker.worker_id.rpartition("#")[2]]


class _Snapshot(Collector):
    """Gauges and counters of one snapshot of the job, then the registry's metrics."""

    def __init__(
        self,
        status: JobStatus,
        reforms: Mapping[str, int],
        loop_lag: float,
        registry: CollectorRegistry,
    ) -> None:
        self._status, self._reforms, self._loop_lag = status, reforms, loop_lag
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self._job()
        yield from self._registry.collect()

    def _job(self) -> Iterator[Metric]:
        status = self._status
        info = GaugeMetricFamily("elasticrun_job_info", "The job (value 1)", labels=["job_id"])
        info.add_metric([status.job_id], 1)
        yield info
        yield GaugeMetricFamily("elasticrun_round", "The current round's number", status.round)
        yield GaugeMetricFamily("elasticrun_size", "Members of the current round", status.size)
        workers = GaugeMetricFamily("elasticrun_workers", "Workers by state", labels=["state"])
        for state in LIVE_STATES:
            workers.add_metric([state], sum(1 for w in status.workers if w.state == state))
        for state in ENDED_STATES:  # every one since the job began, listed or not
            workers.add_metric([state], status.ended_by_state.get(state, 0))
        yield workers
        ended = CounterMetricFamily(
            "elasticrun_workers_ended", "Workers that ended, by cause", labels=["cause"]
        )
        for cause, count in sorted(status.ended_by_cause.items()):
            ended.add_metric([cause], count)
        yield ended
        hosts = GaugeMetricFamily("elasticrun_hosts", "Known hosts by state", labels=["state"])
        for state in HOST_STATES:
            hosts.add_metric([state], sum(1 for h in status.hosts if h.state == state))
        yield hosts
        reforms = CounterMetricFamily(
            "elasticrun_reforms", "Rounds formed after the first, by cause", labels=["cause"]
        )
        for cause, count in sorted(self._reforms.items()):
            reforms.add_metric([cause], count)
        yield reforms
        yield from self._per_worker(status)
        stall = status.stall
        yield GaugeMetricFamily(
            "elasticrun_stall_seconds",
            "How long ranks have waited for others in one collective (0: no stall)",
            stall.seconds if stall is not None else 0.0,
        )
        yield GaugeMetricFamily(
            "elasticrun_stalled_ranks",
            "Ranks missing from the collective the others wait in (0: no stall)",
            len(stall.missing) if stall is not None else 0,
        )
        yield GaugeMetricFamily(
            "elasticrun_event_loop_lag_seconds",
            "The driver's event loop's worst lag over the last 10 s",
            self._loop_lag,
        )

    @staticmethod
    def _per_worker(status: JobStatus) -> Iterator[Metric]:
        live = [w for w in status.workers if w.state in LIVE_STATES]
        steps = CounterMetricFamily(
            "elasticrun_steps", "Optimizer steps a live worker has taken", labels=_LABELS
        )
        families = {
            "step_rate": GaugeMetricFamily(
                "elasticrun_steps_per_second", "Steps per second lately", labels=_LABELS
            ),
            "sample_rate": GaugeMetricFamily(
                "elasticrun_samples_per_second", "Samples per second lately", labels=_LABELS
            ),
            "commit_age": GaugeMetricFamily(
                "elasticrun_commit_age_seconds", "Seconds since the last commit", labels=_LABELS
            ),
            "durable_age": GaugeMetricFamily(
                "elasticrun_durable_commit_age_seconds",
                "Seconds since the last durable commit was written",
                labels=_LABELS,
            ),
            "heartbeat_age": GaugeMetricFamily(
                "elasticrun_heartbeat_age_seconds",
                "Seconds since the last heartbeat reached the driver",
                labels=_LABELS,
            ),
        }
        for worker in live:
            labels = _labels(worker)
            steps.add_metric(labels, worker.steps)
            for field, family in families.items():
                value = getattr(worker, field)
                if value is not None:
                    family.add_metric(labels, value)
        yield steps
        yield from families.values()


class JobMetrics:
    """The job's metrics: `exposition(...)` is a scrape's answer body (`CONTENT_TYPE`)."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._recovery = Histogram(
            "elasticrun_recovery_seconds",
            "Recovery: noticed_to_formed (a failure noticed to the next round formed), "
            "noticed_to_first_step (to that round's first step), formed_to_first_step (any "
            "round formed to its first step)",
            ["leg"],
            buckets=RECOVERY_BUCKETS,
            registry=self.registry,
        )

    def recovered(self, leg: str, seconds: float) -> None:
        """One leg of a recovery took `seconds` (see `timeline`'s leg names)."""
        self._recovery.labels(leg).observe(seconds)

    def exposition(self, status: JobStatus, reforms: Mapping[str, int], loop_lag: float) -> bytes:
        """The text of a scrape: `status` (a snapshot, not changed meanwhile), re-forms by
        cause, the event loop's lag, and the recovery histogram. Safe to call off the event
        loop (the histogram locks its own values)."""
        return generate_latest(_Snapshot(status, reforms, loop_lag, self.registry))  # type: ignore[arg-type]
