"""Logs a machine can read (issue 14, part 5): every launcher line has a timestamp, and with
`--log-format json` every line, the launcher's and the workers', is one JSON object with the
job's round, the rank and host it is about, and what happened; the exit code stays."""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elastic.driver.logs import (
    HeldLines,
    JsonFormatter,
    LogTail,
    TextFormatter,
    WorkerLines,
    launcher_line,
    tags,
    utc_time,
)
from tests.support.paths import WORKERS
from tests.support.running_job import RunningJob
from tests.support.scripts import write_script

KEYS = {"time", "level", "round", "rank", "host", "event", "message"}
ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TEXT_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.\d{3}Z elasticrun: ")
WORKER_TAG = re.compile(r"\[\d+\]<(stdout|stderr)>:")

HELLO = """\
import sys
import elastic.torch as hvd

hvd.init()
print(f"hello from rank {hvd.rank()}", flush=True)
if hvd.rank() == 1:
    print("a note on stderr", file=sys.stderr, flush=True)
hvd.shutdown()
"""

ONE_FAILS = """\
import sys
import time
import elastic.torch as hvd

hvd.init()
print(f"up rank={hvd.rank()}", flush=True)
if hvd.rank() == 1:
    sys.exit(3)
time.sleep(60)
"""


def records(lines: list[str]) -> list[dict[str, Any]]:
    """Every line as the JSON object it must be: the keys every line has (and `stream` for a
    worker's output), the time in UTC with milliseconds, a level."""
    parsed = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert set(record) == KEYS | ({"stream"} if record["event"] == "output" else set()), line
        assert ISO_TIME.fullmatch(record["time"]), line
        assert record["level"] in {"debug", "info", "warning", "error"}, line
        parsed.append(record)
    return parsed


def only(found: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The one record of `found` with these `fields`."""
    matching = [r for r in found if all(r.get(k) == v for k, v in fields.items())]
    assert len(matching) == 1, (fields, found)
    return matching[0]


# --- real jobs -------------------------------------------------------------------------------


def test_json_every_line_is_an_object_with_round_rank_host_and_event(
    elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "hello.py", HELLO)
    job = elasticrun(["--log-format", "json", "-np", "2", "--min-np", "2", sys.executable,
                      str(worker)])  # fmt: skip
    assert job.finish(120) == 0, job.transcript()
    out, err = records(job.stdout), records(job.stderr)
    for rank in (0, 1):
        said = only(out, message=f"hello from rank {rank}")
        assert said == {**said, "event": "output", "stream": "stdout", "rank": rank,
                        "host": "localhost", "round": 1, "level": "info"}  # fmt: skip
    note = only(err, message="a note on stderr")
    assert (note["stream"], note["rank"], note["round"]) == ("stderr", 1, 1)
    formed = only(err, event="round")
    assert formed["round"] == 1 and formed["message"] == "round 1: 2 worker(s) on localhost:2"
    assert (formed["rank"], formed["host"]) == (None, None)  # about no single worker
    assert err[-1]["event"] == "end"
    assert re.fullmatch(r"job \S+ ended with exit code 0 after .*", err[-1]["message"])


def test_text_launcher_lines_start_with_a_utc_timestamp_and_worker_lines_stay_as_horovod(
    elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "hello.py", HELLO)
    started = time.time()
    job = elasticrun(["-np", "2", "--min-np", "2", sys.executable, str(worker)])
    assert job.finish(120) == 0, job.transcript()
    assert "[0]<stdout>:hello from rank 0" in job.stdout
    assert "[1]<stderr>:a note on stderr" in job.stderr
    launcher = [line for line in job.lines if not WORKER_TAG.match(line)]
    assert any(re.search(r"elasticrun: round 1: 2 worker\(s\) on localhost:2$", line)
               for line in launcher), job.transcript()  # fmt: skip
    for line in launcher:
        stamp = TEXT_LINE.match(line)
        assert stamp is not None, line
        written = calendar.timegm(time.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S"))
        assert started - 2 <= written <= time.time() + 1, line  # UTC, not local time


def test_json_a_failure_names_its_rank_and_host_and_the_next_round_follows(
    elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    hold, status = tmp_path / "go-on", tmp_path / "status.json"
    job = elasticrun(
        ["--log-format", "json", "-np", "2", "--min-np", "1", "--failure-scope", "worker",
         "--blacklist-cooldown-range", "600", "600",  # no new worker: the job stays at 1
         sys.executable, str(WORKERS / "elastic_job.py"), "--out", str(tmp_path),
         "--epochs", "1", "--hold-at-step", "4", "--hold-file", str(hold),
         "--status-file", str(status)]
    )  # fmt: skip
    victim = int(job.wait_for(r'"rank": 1, .*"message": "joined rank=1 size=2 pid=(\d+)"').group(1))
    job.wait_for(r'"rank": 1, .*"message": "holding for ', 120)
    os.kill(victim, signal.SIGKILL)
    job.wait_for(r'"event": "failure"', 60)
    hold.touch()
    assert job.finish(120) == 0, job.transcript()
    out, err = records(job.stdout), records(job.stderr)
    failure = only(err, event="failure")
    assert failure["message"].startswith("rank 1 on host localhost was killed by signal SIGKILL")
    assert (failure["level"], failure["rank"], failure["host"]) == ("error", 1, "localhost")
    assert failure["round"] == 1
    second = only(err, event="round", round=2)
    assert second["message"].startswith("round 2: 1 worker(s) on localhost:1"), second
    assert only(out, message="done size 1 rank 0")["round"] == 2
    assert err[-1]["event"] == "end" and "1 re-form(s) (1 failure)" in err[-1]["message"]
    # the same lines, for people, in the job's status
    tail = json.loads(status.read_text())["log_tail"]
    assert any(TEXT_LINE.match(line) and "elasticrun: round 2: 1 worker(s)" in line
               for line in tail), tail  # fmt: skip
    assert all(TEXT_LINE.match(line) for line in tail), tail


def test_json_a_failed_static_job_keeps_its_exit_code_and_says_so_in_json(
    elasticrun: Callable[..., RunningJob], tmp_path: Path
) -> None:
    worker = write_script(tmp_path, "fails.py", ONE_FAILS)
    job = elasticrun(["--log-format", "json", "-np", "2", sys.executable, str(worker)])
    assert job.finish(120) == 3, job.transcript()
    err = records(job.stderr)
    records(job.stdout)
    said = only(err, level="error")
    assert said["event"] == "end"
    assert said["message"] == "rank 1 on host localhost exited with code 3; stopping the other " \
        "workers"  # fmt: skip
    assert "ended with exit code 3" in err[-1]["message"]


def test_json_includes_the_warnings_about_the_flags_themselves(
    elasticrun: Callable[..., RunningJob],
) -> None:
    job = elasticrun(["-np", "1", "true"], {"ELASTICRUN_LOG_FORMAT": "json",
                                            "ELASTICRUN_NO_SUCH_FLAG": "1"})  # fmt: skip
    assert job.finish(60) == 0, job.transcript()
    err = records(job.stderr)
    warned = only(err, level="warning")
    assert "ELASTICRUN_NO_SUCH_FLAG" in warned["message"] and warned["round"] is None
    assert err[-1]["event"] == "end"


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--log-format", "xml"], {}, "argument --log-format: invalid choice: 'xml'"),
        ([], {"ELASTICRUN_LOG_FORMAT": "xml"}, "ELASTICRUN_LOG_FORMAT: --log-format must be one"),
    ],
    ids=["flag", "environment"],
)
def test_a_bad_log_format_is_one_line_and_exit_2(
    elasticrun: Callable[..., RunningJob], args: list[str], env: dict[str, str], said: str
) -> None:
    job = elasticrun([*args, "-np", "1", "true"], env)
    assert job.finish(60) == 2
    assert len(job.lines) == 1 and job.lines[0].startswith("elasticrun: error: "), job.lines
    assert said in job.lines[0]


# --- the pieces ------------------------------------------------------------------------------


def a_record(message: str, level: int = logging.INFO, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("elasticrun", level, __file__, 1, message, None, None)
    record.__dict__.update(extra)
    record.created = 1_790_000_000.25
    return record


def test_utc_time_has_milliseconds_and_a_z() -> None:
    assert utc_time(0) == "1970-01-01T00:00:00.000Z"
    assert utc_time(1_790_000_000.9996, " ") == "2026-09-21 14:13:20.999Z"


def test_the_json_formatter_reads_the_round_as_it_writes_and_the_worker_from_the_tags() -> None:
    now: list[int | None] = [None]
    formatter = JsonFormatter(lambda: now[0])
    assert json.loads(formatter.format(a_record("waiting"))) == {
        "time": "2026-09-21T14:13:20.250Z", "level": "info", "round": None, "rank": None,
        "host": None, "event": "log", "message": "waiting",
    }  # fmt: skip
    now[0] = 3
    line = formatter.format(a_record("died", logging.ERROR, **tags("failure", rank=2, host="h")))
    assert json.loads(line) | {"time": ""} == {
        "time": "", "level": "error", "round": 3, "rank": 2, "host": "h", "event": "failure",
        "message": "died",
    }  # fmt: skip


def test_a_traceback_stays_inside_the_one_json_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = a_record("driver error", logging.ERROR, exc_info=sys.exc_info())
    line = JsonFormatter(lambda: 1).format(record)
    assert "\n" not in line
    message = json.loads(line)["message"]
    assert message.startswith("driver error\nTraceback") and "RuntimeError: boom" in message


def test_the_text_formatter_puts_the_utc_time_first() -> None:
    line = TextFormatter().format(a_record("round 2: 3 worker(s)"))
    assert line == "2026-09-21 14:13:20.250Z elasticrun: round 2: 3 worker(s)"


def test_worker_lines_as_text_are_horovods_tag_and_the_bytes_untouched() -> None:
    rank: list[int | None] = [None]
    shape = WorkerLines("text").shaper("stderr", lambda: rank[0], "h", "h[0]#1")
    assert shape(b"\xffraw\n") == b"[h[0]#1]<stderr>:\xffraw\n"  # no rank yet: its name
    rank[0] = 4
    assert shape(b"x\n") == b"[4]<stderr>:x\n"


def test_worker_lines_as_json_are_one_object_each() -> None:
    shape = WorkerLines("json", lambda: 5).shaper("stdout", lambda: 1, "h", "h[0]#1")
    line = shape(b"caf\xc3\xa9 \xff\n")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = json.loads(line)
    assert record | {"time": ""} == {
        "time": "", "level": "info", "round": 5, "rank": 1, "host": "h", "event": "output",
        "stream": "stdout", "message": "café \ufffd",
    }  # fmt: skip


def test_the_log_tail_keeps_the_newest_200_lines_in_the_text_form() -> None:
    logger = logging.Logger("tail")  # no parent: the lines go nowhere else
    tail = LogTail()
    logger.addHandler(tail)
    try:
        for n in range(250):
            logger.warning("line %d", n)
    finally:
        logger.removeHandler(tail)
    lines = list(tail.lines)
    assert len(lines) == 200
    assert lines[0].endswith("elasticrun: line 50") and lines[-1].endswith("elasticrun: line 249")
    assert all(TEXT_LINE.match(line) for line in lines)


def test_held_lines_wait_and_come_out_once_in_the_format_chosen_meanwhile() -> None:
    root, logger = logging.Logger("root"), logging.Logger("elasticrun")  # nowhere else
    logger.parent = root
    shown = LogTail()
    root.addHandler(shown)
    held = HeldLines(logger)
    try:
        logger.warning("early")
        assert list(shown.lines) == []
        shown.setFormatter(JsonFormatter(lambda: None))
        held.show()
        held.show()
        logger.warning("later")
    finally:
        held.show()
    assert [json.loads(line)["message"] for line in shown.lines] == ["early", "later"]


def test_the_launchers_own_lines_are_told_from_workers_lines_in_either_format() -> None:
    stamped = "2026-09-21 14:13:20.250Z elasticrun: round 2: 3 worker(s)"
    assert launcher_line(stamped) == "elasticrun: round 2: 3 worker(s)"
    assert launcher_line("elasticrun: error: bad flag") == "elasticrun: error: bad flag"
    own = JsonFormatter(lambda: 2).format(a_record("round 2: 3 worker(s)"))
    assert launcher_line(own) == "elasticrun: round 2: 3 worker(s)"
    worker = WorkerLines("json").shaper("stdout", lambda: 0, "h", "w")(b"elasticrun: no\n")
    for line in ("[0]<stdout>:elasticrun: no", worker.decode().rstrip("\n"), "{not json", "x"):
        assert launcher_line(line) is None, line
