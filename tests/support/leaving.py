"""What a test of a leave checks: the noticed host's worker left at a step boundary, and
nothing was rolled back (`ROLLED_BACK`)."""

from __future__ import annotations

import re

from tests.support.running_job import RunningJob

# What a survivor or rank 0 says when the job goes back to its last commit: a survivor under
# `--rollback commit` (or a state that counts no steps), or every survivor when none of them
# holds a booked step (see docs/worker-api.md#no-rollback).
ROLLED_BACK = re.compile(r"restoring the last commit|rolling back to the last commit")


def assert_left_at_a_step_and_got_no_successor(job: RunningJob, notice: str, host: str) -> None:
    """After the driver's line about `notice` (a 3-worker job, one worker on `host`, commits
    only at the epoch's end, step 20): the worker left within a few steps, the others went on
    at size 2 from the next step (nothing rolled back or skipped), the job ended 0, and no
    worker was launched on `host` again."""
    job.wait_for(rf"host {re.escape(host)} leaves in \d+ s \({re.escape(notice)}\)", timeout=10)
    first_small = int(job.wait_for(r"step (\d+) epoch 0 size 2", timeout=30).group(1))
    steps_at_3 = [int(n) for n in re.findall(r"step (\d+) epoch \d+ size 3", job.output)]
    assert max(steps_at_3) < 12, "it left at a step boundary, not at the epoch's commit"
    assert first_small == max(steps_at_3) + 1, "nothing rolled back, nothing skipped"
    assert job.finish(90) == 0, job.output
    after = job.output.split(notice, 1)[1]
    assert not re.search(rf"launched \d+ worker\(s\) on {re.escape(host)}", after)
    assert not ROLLED_BACK.search(job.output), job.output
