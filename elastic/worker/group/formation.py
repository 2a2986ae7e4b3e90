"""Entering a round: taking this worker's slot in it, forming its process group over the
round's store, and installing the context that collectives read.

A round's group forms once when its members enter it (`enter_next_round`), and again each time
its members call `init()` after `shutdown()` while the driver has formed no newer round
(`form_again`). Each formation of a round keys its store under its own prefix (`prefix_of`),
so a new group never reads the addresses that ranks published for an earlier one; every rank
of the round reaches the same formation by calling `init()` as many times as the others, as
Horovod requires too.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch.distributed as dist

from elastic.errors import ElasticError
from elastic.protocol.env import slot_variables
from elastic.protocol.http import SlotInfo
from elastic.worker import context
from elastic.worker.config import WorkerConfig
from elastic.worker.context import WorkerContext
from elastic.worker.driver_link.control_client import ControlClient
from elastic.worker.driver_link.http_client import DriverClient, RoundSuperseded
from elastic.worker.driver_link.kv_store import DriverStore
from elastic.worker.driver_link.membership_events import OFFER_WAIT, MembershipEvents
from elastic.worker.group.process_group import create_group, device_for
from elastic.worker.group.reachability import PeerWatch, probe_round

log = logging.getLogger(__name__)


class InitTimeoutError(ElasticError, TimeoutError):
    """`init()` after `shutdown()` waited `--start-timeout` seconds for the other ranks of its
    round to call `init()` too, and some did not: every rank must call `init()` (and
    `shutdown()`) as many times as the others. This worker is still a member of the job: the
    script may call `init()` again, or exit."""


def prefix_of(formation: int) -> str:
    """The key prefix of a round's `formation`-th group: none for the first (0), one of its
    own for each later one."""
    return f"elastic/formation/{formation}/" if formation else ""


def enter_next_round(
    config: WorkerConfig,
    client: DriverClient,
    control: ControlClient,
    events: MembershipEvents,
    peers: PeerWatch,
    after_round: int,
    join_timeout: float,
) -> None:
    """Join the first round after `after_round` (waiting up to `join_timeout` seconds for it),
    form its process group, and install its slot (the context, `os.environ`).

    A newer round forming while the group forms (a peer died meanwhile), or a peer that goes
    away while the ranks connect (see `create_group`), makes it join a later round; before
    it does, it probes the peers that it could not connect to and reports the silent ones.
    The slot the driver sent on the event stream (`MembershipEvents.offer_after`), if any,
    is taken without asking; after a broken round it is awaited for up to `OFFER_WAIT` s,
    and only then is the round joined over HTTP (at once where the driver asked this worker
    back: `MembershipEvents.slot_follows`). Raises `NotMemberError` when the driver excluded
    this worker, `DriverError` when no round with it forms within `join_timeout`.
    """
    timeout = timedelta(seconds=config.collective_timeout)
    while True:
        wait = OFFER_WAIT if events.slot_follows(after_round) else 0.0
        offer = events.offer_after(after_round, wait)
        if offer is not None:
            number, slot, job_commit = offer.round, offer.slot, offer.job_commit
        else:
            answer = client.join(config.worker_id, after_round, join_timeout, control.commit)
            number, slot, job_commit = answer.epoch, answer.slot, answer.job_commit  # epoch: round
        assert slot is not None
        store = DriverStore(client, number, timeout)
        try:
            _form(config, client, control, events, peers, number, slot, job_commit, store)
            return
        except RoundSuperseded:
            pass
        except RuntimeError as err:  # a peer went away while the ranks connected
            _probe_after_failure(control, peers, store, number, slot, err)
        after_round = number


def form_again(ctx: WorkerContext) -> None:
    """Form a new process group in `ctx`'s round, which this worker left with `shutdown()`
    and which the driver has not replaced: its next formation, under a store prefix of its
    own, with the same slot. Every rank of the round must call `init()` too; this waits up to
    `--start-timeout` seconds for them.

    Follows the driver into its next round when one forms meanwhile (a peer died or left, a
    host was added), and when a peer goes away while the ranks connect. Raises
    `InitTimeoutError` when some rank does not come within that time, `NotMemberError` when
    the driver excluded this worker meanwhile (the job ends because a peer finished, or its
    host left), `DriverError` when no next round with it forms within the rejoin timeout.
    """
    config, client, control, peers = ctx.config, ctx.client, ctx.control, ctx.peers
    assert config is not None and client is not None and control is not None, "set by init()"
    assert peers is not None, "set by init()"
    number, slot, formation = ctx.round, ctx.slot, ctx.formation + 1
    wait = timedelta(seconds=config.start_timeout)
    store = DriverStore(client, number, wait, prefix_of(formation))
    try:
        _form(
            config, client, control, ctx.events, peers, number, slot, ctx.job_commit, store,
            formation,
        )  # fmt: skip
        return
    except RoundSuperseded:
        log.info(
            "rank %d: round %d ended while it formed again; joining the next", slot.rank, number
        )
    except TimeoutError as err:
        raise InitTimeoutError(
            f"hvd.init() after hvd.shutdown(): not every rank of round {number} called "
            f"hvd.init() within {config.start_timeout:g} s (--start-timeout); every rank must "
            f"call init() and shutdown() as many times as the others ({err})"
        ) from None
    except RuntimeError as err:  # a peer went away while the ranks connected
        _probe_after_failure(control, peers, store, number, slot, err)
    enter_next_round(config, client, control, ctx.events, peers, number, config.rejoin_timeout)


def _probe_after_failure(
    control: ControlClient,
    peers: PeerWatch,
    store: dist.Store,
    number: int,
    slot: SlotInfo,
    err: BaseException,
) -> None:
    log.warning("rank %d: forming round %d failed (%s); re-joining", slot.rank, number, err)
    probe_round(store, number, slot.rank, slot.size, control.report_unreachable)


def _form(
    config: WorkerConfig,
    client: DriverClient,
    control: ControlClient,
    events: MembershipEvents,
    peers: PeerWatch,
    number: int,
    slot: SlotInfo,
    job_commit: int,
    store: DriverStore,
    formation: int = 0,
) -> None:
    """Form round `number`'s `formation`-th group over `store` (keyed with `prefix_of` it)
    and install the context.
    Raises what `create_group` raises: `RoundSuperseded` once a newer round forms, a
    RuntimeError when a peer goes away while the ranks connect, TimeoutError when a peer does
    not come within the store's timeout."""
    context.process_wide().progress.new_round()  # before a beat can say the new round
    control.set_round(number)
    device = device_for(slot.local_rank)
    timeout = timedelta(seconds=config.collective_timeout)
    peers.publish(store, slot.rank)
    group = create_group(store, slot.rank, slot.size, device, timeout)
    store.set_timeout(timeout)  # what later waits on it get (process sets, probes)
    context.activate(
        WorkerContext(
            slot=slot,
            round=number,
            group=group,
            device=device,
            events=events,
            timeout=config.collective_timeout,
            config=config,
            client=client,
            control=control,
            on_commit=lambda count: _committed(control, count),
            on_durable=lambda written, stale: _wrote_durably(control, written, stale),
            job_commit=job_commit,
            store=store,
            peers=peers,
            formation=formation,
        )
    )
    publish_slot(slot)


def _committed(control: ControlClient, count: int) -> None:
    control.set_commit(count)
    context.process_wide().progress.committed()


def _wrote_durably(control: ControlClient, written: int, stale: bool) -> None:
    control.set_durable(written, stale)
    if not stale:
        context.process_wide().progress.wrote_durably()


def publish_slot(slot: SlotInfo) -> None:
    """Set this process's rank variables (`ELASTIC_RANK` ... and Horovod's `HOROVOD_RANK`
    ..., `HOROVOD_HOSTNAME`: `slot_variables`) to `slot`, the round just installed, so a
    script that reads them after `init()` or a re-form finds the current round's values.
    Subprocesses started from then on inherit them."""
    os.environ.update(slot_variables(slot))
