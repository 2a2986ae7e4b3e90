"""`hvd.elastic.run`: the loop that keeps a training function going across membership changes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from elastic.state.state import State
from elastic.worker import context, runtime
from elastic.worker.driver_link.http_client import NotMemberError
from elastic.worker.errors import HostsUpdatedInterrupt, WorkerLostError
from elastic.worker.exit import exit_now

log = logging.getLogger("elastic")

Result = TypeVar("Result")


def run(func: Callable[..., Result]) -> Callable[..., Result]:
    """Decorate a training function `func(state, ...)` so it survives membership changes.

    The wrapper syncs `state` from the rank holding the newest commit, then calls `func`;
    when `func` returns, it lets the state finish its background work
    (`State.finish_background`) before returning `func`'s result.
    When a peer dies (`WorkerLostError` from a collective), it tells the state
    (`State.peer_lost`: keep the live state to agree on, or restore the last commit),
    re-joins the next round, calls the state's reset callbacks, syncs (only where the
    survivors' states differ, or a new worker joins), and calls `func` again.
    When the membership changes (`HostsUpdatedInterrupt`, raised by `state.commit()` on every
    rank at the same step, or by `DistributedOptimizer.step()` when a member leaves, a worker
    joins or a host goes: `func` must keep its progress in `state` as each step completes, as
    the sampler's `record_batch` does), it re-joins without restoring. A worker the driver
    excluded (it received SIGTERM, or its host left the discovery output) ends with
    `SystemExit(0)` at that point (at once, with `os._exit(0)`, when it abandoned a process
    group whose collective may still be blocked: its teardown would abort the process). Any
    other exception propagates: the worker exits non-zero and the job re-forms without it.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Result:
        runtime.leave_on_sigterm()
        skip_sync = False
        while True:
            try:
                state.sync_if_needed(not skip_sync)
                result = func(state, *args, **kwargs)
                state.finish_background()
                return result
            except WorkerLostError as err:
                state.peer_lost(err)
                skip_sync = True
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                if interrupt.at_step:  # raised by the optimizer, which knows no state
                    try:
                        state.prepare_to_reform()
                    except WorkerLostError as err:
                        state.peer_lost(err)
                        skip_sync = True
            try:
                runtime.rejoin()
            except NotMemberError:
                log.info("this worker leaves the job")
                if context.has_abandoned_groups():
                    exit_now(0)  # an abandoned group's blocked collective would abort the exit
                raise SystemExit(0) from None
            state.on_reset()

    return wrapper
