"""`hvd.shutdown()` followed by `hvd.init()` in the same process, as Horovod's own unit tests,
notebooks and sweeps do: real workers under the real `elasticrun` launcher.

`shutdown()` releases the group and clears the process sets but keeps the worker a member of
the job; the next `init()` forms a new group in the same round (or enters the round the
driver moved on to). A rank waiting in that `init()` follows the driver's next round when a
peer dies, and ends with a clear error when a peer never calls `init()` again.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.support.paths import WORKERS
from tests.support.scripts import write_script

pytestmark = pytest.mark.timeout(240)

# Ranks 0 and 1 on localhost, rank 2 on 127.0.0.1: the victim's host (in cooldown for the
# rest of the job) takes no survivor with it.
TWO_HOSTS = ["-H", "localhost:2,127.0.0.1:1", "--blacklist-cooldown-range", "300", "300"]
CYCLES = 20


def _flags(elastic: bool, size: int) -> list[str]:
    hosts = ["-H", f"localhost:{size}"]
    return ["-np", str(size), *hosts, *(["--min-np", "2"] if elastic else [])]


@pytest.mark.parametrize(
    ("elastic", "size"),
    [
        pytest.param(False, 2, marks=pytest.mark.slow),
        pytest.param(False, 3, marks=pytest.mark.slow),
        (True, 2),
        pytest.param(True, 3, marks=pytest.mark.slow),
    ],
    ids=["static-2", "static-3", "elastic-2", "elastic-3"],
)
def test_twenty_shutdown_init_cycles_in_one_job_keep_every_collective_right(
    elasticrun, tmp_path: Path, elastic: bool, size: int
) -> None:
    job = elasticrun(
        [*_flags(elastic, size), "--collective-timeout", "60",
         sys.executable, str(WORKERS / "reinit_job.py"), str(CYCLES), str(size)]
    )  # fmt: skip
    assert job.finish(200) == 0, job.output
    for cycle in range(CYCLES):  # every rank, once each, every cycle: the checks all passed
        ranks = re.findall(rf"<stdout>:cycle {cycle} rank (\d+) size {size} ok", job.output)
        assert sorted(map(int, ranks)) == list(range(size)), (cycle, job.output)
    assert len(re.findall(r"cycles done rank \d", job.output)) == size, job.output
    assert "elasticrun: round 2" not in job.output, job.output  # one round all along


def test_a_horovod_style_suite_runs_every_check_between_init_and_shutdown(
    elasticrun, tmp_path: Path
) -> None:
    checks = 24  # every kind of check three times
    job = elasticrun(
        ["-np", "2", "-H", "localhost:2", "--collective-timeout", "60",
         sys.executable, str(WORKERS / "horovod_style_checks.py"), str(checks)]
    )  # fmt: skip
    assert job.finish(200) == 0, job.output
    for rank in range(2):
        assert f"rank {rank}: checks passed {checks} of {checks}" in job.output, job.output


ELASTIC_AFTER_CYCLES = """
import os
import torch
import elastic.torch as hvd

for cycle in range(3):
    hvd.init()
    hvd.allreduce(torch.ones(1), op=hvd.Sum)
    hvd.barrier()
    hvd.shutdown()
hvd.init()
print(f"worker pid={os.getpid()} rank={hvd.rank()}", flush=True)
state = hvd.elastic.ObjectState(step=0)


@hvd.elastic.run
def train(state):
    while state.step < 60:
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
        state.step += 1
        print(f"step {state.step} size {hvd.size()} rank {hvd.rank()} sum {total:g}", flush=True)
        state.commit()


train(state)
hvd.shutdown()
"""


def test_the_elastic_run_loop_after_shutdown_init_cycles_survives_a_killed_peer(
    elasticrun, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "elastic_after_cycles.py", ELASTIC_AFTER_CYCLES)
    job = elasticrun(
        ["-np", "3", "--min-np", "2", *TWO_HOSTS, sys.executable, str(script)]
    )  # fmt: skip
    victim = int(job.wait_for(r"worker pid=(\d+) rank=2", 120).group(1))
    job.wait_for(r"step 5 size 3 rank 0 sum 3", 60)
    os.kill(victim, signal.SIGKILL)
    job.wait_for(r"elasticrun: round 2: 2 worker\(s\)", 60)
    job.wait_for(r"step \d+ size 2 rank 0 sum 2", 60)
    job.wait_for(r"step \d+ size 2 rank 1 sum 2", 60)
    assert job.finish(120) == 0, job.output
    assert "step 60 size 2 rank 0 sum 2" in job.output, job.output


PEER_GONE_IN_INIT = """
import os
import sys
import time
import torch
import elastic.torch as hvd

hvd.init()
rank = hvd.rank()
print(f"worker pid={os.getpid()} rank={rank}", flush=True)
hvd.barrier()
hvd.shutdown()
if rank == 2:
    time.sleep(600)  # never calls init() again: the test kills it
    sys.exit(1)
print(f"rank {rank} calls init again", flush=True)
hvd.init()
total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
print(f"after init: size {hvd.size()} rank {hvd.rank()} sum {total:g}", flush=True)
hvd.barrier()
hvd.shutdown()
"""


def test_ranks_waiting_in_init_follow_the_next_round_when_a_peer_dies(
    elasticrun, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "peer_gone.py", PEER_GONE_IN_INIT)
    job = elasticrun(
        ["-np", "3", "--min-np", "2", *TWO_HOSTS, sys.executable, str(script)]
    )  # fmt: skip
    victim = int(job.wait_for(r"worker pid=(\d+) rank=2", 120).group(1))
    job.wait_for(r"rank 0 calls init again", 60)
    job.wait_for(r"rank 1 calls init again", 60)
    os.kill(victim, signal.SIGKILL)
    job.wait_for(r"after init: size 2 rank 0 sum 2", 90)
    job.wait_for(r"after init: size 2 rank 1 sum 2", 60)
    assert job.finish(120) == 0, job.output


PEER_NEVER_INITS = """
import time
import elastic.torch as hvd

hvd.init()
rank = hvd.rank()
hvd.barrier()
hvd.shutdown()
if rank == 1:
    print("rank 1 rests", flush=True)
    time.sleep(600)  # alive, a member, and never calls init() again
hvd.init()
"""


def test_init_ends_with_a_clear_error_when_a_peer_never_calls_init_again(
    elasticrun, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "never_inits.py", PEER_NEVER_INITS)
    job = elasticrun(
        ["-np", "2", "-H", "localhost:2", "--start-timeout", "15", sys.executable, str(script)]
    )
    assert job.finish(120) != 0, job.output
    assert "InitTimeoutError" in job.output, job.output
    assert "not every rank of round 1 called hvd.init() within 15 s" in job.output, job.output


PEER_FINISHES = """
import elastic.torch as hvd

hvd.init()
rank = hvd.rank()
hvd.barrier()
hvd.shutdown()
if rank == 0:
    hvd.init()  # rank 1 exits instead: the job ends, and this worker with it
    print("rank 0 formed a group alone", flush=True)
"""


def test_a_rank_in_init_leaves_with_the_job_when_its_peer_finished_instead(
    elasticrun, tmp_path: Path
) -> None:
    script = write_script(tmp_path, "peer_finishes.py", PEER_FINISHES)
    job = elasticrun(["-np", "2", "-H", "localhost:2", sys.executable, str(script)])
    assert job.finish(120) == 0, job.output
    assert "the driver let this worker go while it was shut down" in job.output, job.output
    assert "formed a group alone" not in job.output
