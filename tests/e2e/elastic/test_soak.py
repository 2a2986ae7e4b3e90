"""The fault soak: one elastic job under a seeded random stream of overlapping faults.

The job (tests/support/workers/soak_job.py) trains on two local host names found by
discovery_scripts/hosts_file.sh, with its state in a real etcd (the `etcd` fixture), while
tests/support/soak.py SIGKILLs, SIGSTOPs and SIGTERMs workers, takes hosts out of discovery,
SIGKILLs and restarts the driver and etcd, and hits the last worker holding the training state. Then
it checks what a user would check:

- the launcher exits 0;
- every sample of every epoch was trained exactly once (the job's allreduced counts);
- the training epoch never went backwards unless a launcher or worker line said why;
- no worker, keeper or driver of the job is left running;
- every step line a worker wrote to its own side file reached the launcher's output;
- and it prints (and writes to `soak-recovery.json`) per fault kind the time from the fault to
  the next training step.

`test_fault_soak` is the bounded run (25 faults, a new seed each run, in every CI run) and
`test_fault_soak_full` the long one (120 faults, marked slow: ELASTIC_SLOW_TESTS=1);
`test_fault_soak_sharded` and `test_fault_soak_sharded_full` are the same for an FSDP2 job
in a `ShardedState` with durable checkpoints (`sharded_soak`), the bounded one with 12 faults
(the 25 of the other bounded run cover the overlaps; these, the same on the sharded path).
ELASTIC_SOAK_SEED fixes the seed (printed at the start and in every failure),
ELASTIC_SOAK_FAULTS the number of faults.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.etcd_server import EtcdServer
from tests.support.soak import (
    EXPLAINED_RESET,
    SHARDED_SOAK_JOB,
    SOAK_JOB,
    Soak,
    SoakConfig,
    StepLine,
    epoch_regressions,
    job_processes,
    recovery_table,
    worker_lines_in,
)


def soak_config(default_faults: int, **fields: Any) -> SoakConfig:
    """The soak's settings: ELASTIC_SOAK_SEED and ELASTIC_SOAK_FAULTS win over a new seed and
    `default_faults`; `fields` set the others."""
    seed = os.environ.get("ELASTIC_SOAK_SEED")
    faults = int(os.environ.get("ELASTIC_SOAK_FAULTS", default_faults))
    return SoakConfig(seed=int(seed) if seed else random.SystemRandom().randrange(10**6),
                      faults=faults, **fields)  # fmt: skip


def run_soak(soak: Soak, capsys: pytest.CaptureFixture) -> None:
    """Run `soak` to its end, write its records into its folder (and ELASTIC_SOAK_REPORT_DIR),
    print its recovery table, and fail with every failed check."""
    config, tmp_path = soak.config, soak.folder
    with capsys.disabled():
        print(f"\nsoak: seed {config.seed}, {config.faults} faults, in {tmp_path}", flush=True)
    try:
        soak.start()
        soak.inject()
        soak.finish(timeout=30 if soak.anomalies else 120)  # stalled: do not wait long
        left = soak.leftovers()
    finally:
        soak.stop_all()
        for pid in job_processes(str(tmp_path)):  # workers, keepers: what the job left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    failures = check(soak, left)
    table = recovery_table(soak.faults, soak.side.steps)
    (tmp_path / "soak-recovery.json").write_text(json.dumps(table, indent=1))
    soak.write(tmp_path / "soak-record.json")
    (tmp_path / "soak-failures.json").write_text(json.dumps(failures, indent=1))
    if report := os.environ.get("ELASTIC_SOAK_REPORT_DIR"):  # keep the evidence elsewhere too
        Path(report).mkdir(parents=True, exist_ok=True)
        for name in ("soak-recovery.json", "soak-record.json", "soak-failures.json", "stacks.txt"):
            if (tmp_path / name).exists():
                shutil.copy(tmp_path / name, Path(report, f"{config.seed}-{name}"))
        with open(Path(report, f"{config.seed}-launcher.log"), "w") as log:
            start = soak.faults[0].at if soak.faults else 0.0
            for t, stream, line in soak.launcher_lines():
                log.write(f"{t - start:+9.3f} {stream} {line}\n")
    with capsys.disabled():
        print(f"soak: {len(soak.faults)} faults, seed {config.seed}; time from a fault to the "
              f"next training step (s):\n{json.dumps(table, indent=1)}", flush=True)  # fmt: skip
    assert len(soak.faults) >= config.faults or failures, "every planned fault was thrown"
    assert not failures, (
        f"soak seed {config.seed} (ELASTIC_SOAK_SEED={config.seed} "
        f"ELASTIC_SOAK_FAULTS={config.faults}): {len(failures)} failure(s):\n"
        + json.dumps(failures, indent=1)
    )


def check(soak: Soak, left: dict) -> list[dict]:
    """Every check a user would make; each failure with the evidence around it."""
    failures: list[dict] = []
    for anomaly in soak.anomalies:
        failures.append({
            "check": "the soak ran to its end",
            "what": anomaly["what"],
            **soak.around(anomaly["since"], anomaly["until"]),
        })  # fmt: skip
    if soak.final_code not in (0, None):  # None: it did not exit, an anomaly says so
        failures.append({
            "check": "the launcher exits 0",
            "what": f"exit code {soak.final_code}",
            "launcher_tail": [line for _, _, line in soak.launcher_lines()[-40:]],
        })  # fmt: skip

    result_file = soak.folder / "result.json"
    if not result_file.exists():
        failures.append({"check": "every sample trained once per epoch", "what": "no result"})
    else:
        result = json.loads(result_file.read_text())
        wrong = {i: c for i, c in enumerate(result["counts"]) if c != result["epochs"]}
        if wrong or result["epochs"] < 2:
            failures.append({
                "check": "every sample trained once per epoch",
                "what": f"{result['epochs']} epochs; samples with another count: {wrong}",
            })  # fmt: skip

    launcher = soak.launcher_lines()
    explanations = [(t, line) for t, _, line in launcher if EXPLAINED_RESET.search(line)]
    for high, low in epoch_regressions(soak.side.steps + relayed_steps(soak)):
        if any(low.t - 30 <= t <= low.t + 5 for t, _ in explanations):
            continue
        failures.append({
            "check": "the epoch never goes backwards without a reason",
            "what": f"epoch {high.epoch} -> {low.epoch}: {high.text!r} then {low.text!r}",
            **soak.around(high.t, low.t),
        })  # fmt: skip

    if left:
        failures.append({
            "check": "no process of the job is left",
            "what": [f"pid {pid} {role} state {state}: {' '.join(argv)[:200]}"
                     for pid, (role, state, argv) in left.items()],
        })  # fmt: skip

    relayed = worker_lines_in([line for _, _, line in launcher])
    for pid, lines in sorted(soak.side.lines.items()):
        missing = [line for line in lines if line not in relayed and not soak.may_lose(pid, line)]
        if missing:
            last = StepLine.parse(missing[-1])
            failures.append({
                "check": "every worker line reaches the launcher",
                "what": f"worker {pid}: {len(missing)} of {len(lines)} step lines never shown, "
                f"first {missing[0]!r}, last {missing[-1]!r}",
                **(soak.around(last.t) if last else {}),
            })  # fmt: skip
    return failures


def relayed_steps(soak: Soak) -> list[StepLine]:
    """Step lines shown by the launcher (one printed but killed before its side-file write)."""
    return [s for _, _, line in soak.launcher_lines() if (s := StepLine.parse(line))]


@pytest.mark.timeout(330)
def test_fault_soak(etcd: EtcdServer, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_soak(Soak(soak_config(25), tmp_path, etcd), capsys)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fault_soak_full(etcd: EtcdServer, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_soak(Soak(soak_config(120), tmp_path, etcd), capsys)


def sharded_soak(default_faults: int, tmp_path: Path, etcd: EtcdServer) -> Soak:
    """The soak of an FSDP2 job (`sharded_soak_job.py`: `ShardedState(replicas=1)`) on three
    host names of this machine, one worker each, so that every shard's replica is on another
    host, with a durable checkpoint at every commit in `tmp_path/checkpoints`.

    The fault mix is the TorchState soak's, all of it: with `--min-np 1` its faults often
    take more than one host at once (the `survivor` fault kills every worker but one and
    then that one; overlapping kills; a host removed while a worker of another is killed),
    which no `replicas=1` commit survives. Those resume from the newest durable checkpoint,
    saying so in one line (which explains an epoch that goes back), and train again what
    was trained since: the counts are plain values of the state, checkpointed with the
    model, so exactly once still means once per epoch of the progress the job kept."""
    hosts = ("localhost", "127.0.0.1", socket.gethostname())
    assert len(set(hosts)) == 3, "this machine's name is a third name for it"
    checkpoints = tmp_path / "checkpoints"
    config = soak_config(
        default_faults,
        hosts=hosts,
        slots=1,
        job_id="soak-sharded",
        job=SHARDED_SOAK_JOB,
        launcher_args=("--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1"),
    )
    return Soak(config, tmp_path, etcd)


@pytest.mark.timeout(330)
def test_fault_soak_sharded(
    etcd: EtcdServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_soak(sharded_soak(12, tmp_path, etcd), capsys)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_fault_soak_sharded_full(
    etcd: EtcdServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_soak(sharded_soak(120, tmp_path, etcd), capsys)


@pytest.mark.timeout(120)
def test_the_soak_job_stops_only_between_epochs(elasticrun, tmp_path: Path) -> None:
    """The soak writes its stop file right after its last fault, so the job often sees it
    when `hvd.elastic.run` calls the training function again in the middle of an epoch
    (after a leave here; a restore does the same). Stopping there would report N epochs with
    part of epoch N trained too (seed 823410: 26 epochs, 24 of 48 samples counted 27 times):
    the job finishes the epoch it is in and stops at the start of the next one."""
    stop = tmp_path / "stop"
    side = tmp_path / "side"
    side.mkdir()
    job = elasticrun(
        ["-np", "2", "--min-np", "1", "-H", "localhost:2",
         sys.executable, str(SOAK_JOB), "--out", str(tmp_path), "--side-dir", str(side),
         "--stop-file", str(stop), "--min-epochs", "2", "--samples", "960"],
    )  # fmt: skip
    # epoch 2 at size 2 is 120 steps (4 s); rank 1 leaves at the next commit, 2 steps on
    leaver = int(job.wait_for(r"step \d+ epoch 2 size 2 rank 1 pid (\d+)", 90).group(1))
    stop.touch()
    os.kill(leaver, signal.SIGTERM)
    assert job.finish(90) == 0, job.output
    assert "rank 1 on host localhost leaves the job" in job.output, job.output
    result = json.loads((tmp_path / "result.json").read_text())
    counts = {c: result["counts"].count(c) for c in set(result["counts"])}
    assert (result["epochs"], counts) == (3, {3.0: 960}), "every sample once in each epoch"
    assert re.search(r"step \d+ epoch 2 size 1 rank 0", job.output), "epoch 2 ends at size 1"
