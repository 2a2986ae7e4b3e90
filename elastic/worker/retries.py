"""The one retry policy of every worker-to-driver call: bounded in time, exponential backoff."""

from __future__ import annotations

from collections.abc import Callable

import tenacity


def bounded_retries(
    retry_for: float,
    retryable: Callable[[BaseException], bool],
    moved: Callable[[], bool] | None = None,
) -> tenacity.Retrying:
    """Retry while `retryable(error)` holds, for at most `retry_for` seconds in all (backoff
    from 50 ms doubling to 2 s); the last error is re-raised. `moved()` runs before each
    wait: when it says the driver now serves elsewhere, the next attempt goes at once."""
    backoff = tenacity.wait_exponential(multiplier=0.05, max=2.0)

    def wait(state: tenacity.RetryCallState) -> float:
        if moved is not None and moved():
            return 0.0
        return backoff(state)

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(retryable),
        stop=tenacity.stop_after_delay(retry_for),
        wait=wait,
        reraise=True,
    )
