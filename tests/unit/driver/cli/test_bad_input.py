"""Bad input to `elasticrun` gets one line and exit 2, before any worker starts: output
folders that cannot be written, absurd worker and slot counts, durations that are not a
finite number of seconds (issue 8, item 7)."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import pytest

from elastic.driver.cli.main import MAX_NP, parse_settings
from elastic.driver.discovery import DiscoveryError, ScriptDiscovery
from elastic.driver.discovery.hosts import (
    MAX_SLOTS_PER_HOST,
    HostSpec,
    parse_host_list,
    read_hostfile,
)
from elastic.driver.errors import MAX_SECONDS, UsageError, seconds
from elastic.driver.policy.planning import free_slots
from tests.support.scripts import write_script

HUGE = "1" + "0" * 29  # 30 digits: -np 1e29 once grew the driver to 2.5 GB in 12 s

DURATION_FLAGS = [
    "--start-timeout",
    "--collective-timeout",
    "--stop-grace",
    "--heartbeat-interval",
    "--elastic-timeout",
    "--discovery-interval",
    "--discovery-timeout",
    "--etcd-grace",
    "--driver-wait",
]


def one_line_error(job, timeout: float = 30) -> str:
    """The single line a refused command printed (after asserting exit 2, nothing else)."""
    code = job.finish(timeout)
    assert code == 2, job.transcript()
    assert len(job.lines) == 1, job.transcript()
    assert job.lines[0].startswith("elasticrun: error: ")
    return job.lines[0]


def marker_command(tmp_path: Path) -> list[str]:
    """A training command that leaves a file behind if it ever runs."""
    return ["touch", str(tmp_path / "worker-ran")]


# --- --output-filename -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["file/logs", "file", "/proc", "/proc/logs"])
def test_an_output_folder_that_cannot_be_written_is_one_line(
    elasticrun, tmp_path: Path, where: str
) -> None:
    (tmp_path / "file").write_text("not a folder\n")
    job = elasticrun(["-np", "1", "--output-filename", where, *marker_command(tmp_path)])
    line = one_line_error(job)
    assert f"--output-filename {where}: cannot write rank output there" in line
    assert not (tmp_path / "worker-ran").exists(), "no worker may start"


def test_the_output_folder_is_made_at_start_and_left_clean(tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "logs"
    parse_settings(["-np", "1", "--output-filename", str(folder), "true"])
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_no_folder_is_made_when_another_flag_is_bad(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    with pytest.raises(UsageError, match="--stop-grace"):
        parse_settings(["-np", "1", "--output-filename", str(folder), "--stop-grace", "-1", "x"])
    assert not folder.exists()


# --- worker and slot counts --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-np", HUGE], f"-np must be at most {MAX_NP}, got {HUGE}"),
        (["-np", str(MAX_NP + 1)], f"-np must be at most {MAX_NP}"),
        (["--min-np", HUGE], f"--min-np must be at most {MAX_NP}"),
        (["--min-np", "1", "--max-np", HUGE], f"--max-np must be at most {MAX_NP}"),
        (["--min-np", "1", "--slots-per-host", HUGE], "--slots-per-host must be at most 65536"),
        (["-np", "1", "-H", f"localhost:{HUGE}"], "-H: slot count in 'localhost:1000"),
        (["-np", "1", "-H", "a:1,b:65537"], "slot count in 'b:65537' must be at most 65536"),
        (["-np", "0"], "-np must be at least 1, got 0"),
    ],
)
def test_absurd_counts_are_refused_while_parsing(args: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_settings([*args, "true"])
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_largest_counts_are_accepted() -> None:
    settings = parse_settings(["-np", str(MAX_NP), "--min-np", "1", "--max-np", str(MAX_NP), "x"])
    assert settings.np == MAX_NP and settings.elastic is not None
    assert parse_host_list(f"a:{MAX_SLOTS_PER_HOST}") == [HostSpec("a", MAX_SLOTS_PER_HOST)]
    assert parse_host_list("a:007") == [HostSpec("a", 7)]


def test_a_thirty_digit_np_is_one_line_at_once(elasticrun, tmp_path: Path) -> None:
    job = elasticrun(["-np", HUGE, *marker_command(tmp_path)])
    assert f"-np must be at most {MAX_NP}" in one_line_error(job, timeout=20)


def test_a_hostfile_slot_count_of_a_million_digits_is_one_short_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=" + "9" * 1_000_000 + "\n")
    with pytest.raises(UsageError) as caught:
        read_hostfile(str(hostfile))
    message = str(caught.value)
    assert "line 2: slot count in 'b slots=999" in message and "at most 65536" in message
    assert len(message) < 300


def test_discovery_output_with_an_absurd_slot_count_is_a_discovery_error(tmp_path: Path) -> None:
    script = write_script(tmp_path, "hosts.sh", f"#!/bin/sh\necho a:2\necho b:{HUGE}\n")
    script.chmod(0o755)
    with pytest.raises(DiscoveryError, match=r"output line 2: slot count in 'b:1000.* at most"):
        asyncio.run(ScriptDiscovery(str(script), timeout=10).find())
    with pytest.raises(ValueError):
        ScriptDiscovery(str(script), timeout=10, default_slots=MAX_SLOTS_PER_HOST + 1)


def test_free_slots_never_lists_every_slot_of_big_hosts() -> None:
    hosts = [HostSpec(f"h{i}", MAX_SLOTS_PER_HOST) for i in range(40)]  # 2.6 million slots
    tracemalloc.start()
    try:
        places = free_slots(hosts, {"h0": {0, 1}}, 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert places == [("h0", 2), ("h0", 3), ("h0", 4)]
    assert peak < 1 << 20, f"{peak} bytes for 3 places"


# --- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize("flag", DURATION_FLAGS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "-1", "0", "1e400", str(MAX_SECONDS * 2)])
def test_every_duration_flag_refuses_what_is_not_a_positive_finite_time(
    flag: str, value: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_settings(["-np", "1", f"{flag}={value}", "true"])  # "=": argparse takes -inf
    message = str(caught.value)
    assert message.startswith(f"{flag} must be positive and at most 31536000 seconds (a year)")


@pytest.mark.parametrize("pair", [("0", "inf"), ("nan", "5"), ("-1", "5"), ("1", "1e99")])
def test_the_cooldown_range_refuses_what_is_not_a_finite_time(pair: tuple[str, str]) -> None:
    with pytest.raises(UsageError, match="--blacklist-cooldown-range must be 0 or more"):
        parse_settings(["-np", "1", "--blacklist-cooldown-range", *pair, "true"])


@pytest.mark.parametrize("args", [["--stop-grace", "inf"], ["--heartbeat-interval", "nan"]])
def test_a_bad_duration_is_one_line_and_no_worker_starts(
    elasticrun, tmp_path: Path, args: list[str]
) -> None:
    job = elasticrun(["-np", "1", *args, *marker_command(tmp_path)])
    assert f"{args[0]} must be positive" in one_line_error(job)
    assert not (tmp_path / "worker-ran").exists()


def test_seconds_accepts_what_a_user_means() -> None:
    assert seconds(0.5, "--x") == 0.5 and seconds(MAX_SECONDS, "--x") == MAX_SECONDS
    assert seconds(0.0, "--x", zero=True) == 0.0
    settings = parse_settings(
        ["-np", "1", "--stop-grace", "0.1", "--blacklist-cooldown-range", "0", "0", "x"]
    )
    assert settings.stop_grace == 0.1
