"""Launcher flags from ELASTICRUN_* variables and --config-file: precedence and clear errors."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from elastic.driver.cli.main import parse_settings
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.errors import UsageError
from tests.support.running_job import ELASTICRUN

COMMAND = ["python", "train.py"]


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_a_variable_gives_a_flag_the_command_line_does_not() -> None:
    settings = parse_settings(COMMAND, {"ELASTICRUN_NUM_PROC": "3", "ELASTICRUN_STOP_GRACE": "2"})
    assert settings.np == 3
    assert settings.stop_grace == 2.0
    assert parse_settings(COMMAND, {"ELASTICRUN_NP": "4"}).np == 4  # -np's own name too


def test_the_command_line_wins_over_the_environment_which_wins_over_the_file(
    tmp_path: Path,
) -> None:
    path = config(tmp_path, "num-proc: 2\nstop_grace: 7\nstart-timeout: 8\n")
    environ = {"ELASTICRUN_STOP_GRACE": "3", "ELASTICRUN_NUM_PROC": "5"}
    settings = parse_settings(["--config-file", path, "-np", "1", *COMMAND], environ)
    assert settings.np == 1  # command line
    assert settings.stop_grace == 3.0  # environment over file
    assert settings.start_timeout == 8.0  # file over default
    assert settings.collective_timeout == 1800.0  # default


def test_the_config_file_itself_can_come_from_the_environment(tmp_path: Path) -> None:
    path = config(tmp_path, "np: 2\nmin-np: 1\nblacklist-cooldown-range: [0, 0]\n")
    settings = parse_settings(COMMAND, {"ELASTICRUN_CONFIG_FILE": path})
    assert settings.np == 2
    assert settings.elastic is not None and settings.elastic.cooldown_range == (0.0, 0.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("yes", True), ("TRUE", True), ("0", False), ("no", False), ("false", False)],
)
def test_a_switch_takes_the_usual_words_for_yes_and_no(text: str, expected: bool) -> None:
    assert parse_settings(["-np", "1", *COMMAND], {"ELASTICRUN_VERBOSE": text}).verbose is expected


def test_two_values_come_separated_by_spaces_or_commas() -> None:
    for text in ("1 9", "1,9", " 1, 9 "):
        environ = {"ELASTICRUN_BLACKLIST_COOLDOWN_RANGE": text, "ELASTICRUN_MIN_NP": "1"}
        settings = parse_settings(COMMAND, environ)
        assert settings.elastic is not None and settings.elastic.cooldown_range == (1.0, 9.0)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"ELASTICRUN_MIN_NP": "two"}, "environment variable ELASTICRUN_MIN_NP: --min-np takes a"),
        ({"ELASTICRUN_TLS": "maybe"}, "ELASTICRUN_TLS: --tls takes 1/0, true/false or yes/no"),
        ({"ELASTICRUN_BACKEND": "disk"}, "ELASTICRUN_BACKEND: --backend must be one of memory"),
        ({"ELASTICRUN_BLACKLIST_COOLDOWN_RANGE": "5"}, "takes 2 values, got '5'"),
        ({"ELASTICRUN_NP": "2", "ELASTICRUN_NUM_PROC": "2"}, "give the same flag: keep one"),
        (
            {"ELASTICRUN_HOSTS": "localhost:2", "ELASTICRUN_HOSTFILE": "hosts.txt"},
            "give flags that exclude each other",
        ),
        (  # a range the settings refuse names where the value came from
            {"ELASTICRUN_MIN_NP": "3", "ELASTICRUN_NP": "2"},
            r"-np 2 must lie between --min-np and --max-np \(--min-np from environment variable "
            r"ELASTICRUN_MIN_NP; --num-proc from environment variable ELASTICRUN_NP\)",
        ),
    ],
)
def test_a_bad_variable_is_one_error_naming_it(environ: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_settings(COMMAND, environ)


def test_an_unknown_variable_is_warned_about_once_with_the_likely_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {"ELASTICRUN_MIN_NPP": "2", "ELASTICRUN_FOO": "1", "ELASTICRUN_VERBOSE": ""}
    with caplog.at_level(logging.WARNING, logger="elasticrun"):
        assert parse_settings(["-np", "1", *COMMAND], environ).verbose is False  # "" is unset
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "ignoring environment variable(s) that name no elasticrun flag: ELASTICRUN_FOO, "
        "ELASTICRUN_MIN_NPP (did you mean ELASTICRUN_MIN_NP?)"
    ]


def test_a_host_flag_on_the_command_line_drops_the_other_one_from_below(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("localhost:3\n")
    argv = ["--hostfile", str(hostfile), "-np", "3", *COMMAND]
    settings = parse_settings(argv, {"ELASTICRUN_HOSTS": "localhost:1"})
    assert settings.hosts == [HostSpec("localhost", 3)]


def test_horovodrun_sections_set_the_flags_that_mean_the_same(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(
        tmp_path,
        "controller: gloo\n"
        "params:\n  fusion_threshold_mb: 32\n  cycle_time_ms: 1\n"
        "library_options:\n  gloo_timeout_seconds: 45\n"
        "logging:\n  level: DEBUG\n",
    )
    with caplog.at_level(logging.WARNING, logger="elasticrun"):
        settings = parse_settings(["--config-file", path, "-np", "1", *COMMAND], {})
    assert settings.collective_timeout == 45.0
    assert settings.verbose is True
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"config file {path}: ignoring horovodrun settings elasticrun has no use for: "
        "controller, params.fusion_threshold_mb, params.cycle_time_ms"
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("min_npp: 2\n", "key min_npp: no such elasticrun flag"),
        ("min-np: two\n", "key min-np: --min-np takes a whole number, got 'two'"),
        ("min-np: true\n", "key min-np: --min-np takes a whole number, got True"),
        ("verbose: perhaps\n", "key verbose: --verbose takes 1/0"),
        ("params:\n  fusion_threshold: 2\n", "key params.fusion_threshold: no such horovodrun"),
        ("logging:\n  level: LOUD\n", "key logging.level: use one of TRACE, DEBUG"),
        ("timeline: on\n", "key timeline: expected a section of keys"),
        ("config-file: other.yaml\n", "key config-file: a config file cannot name another"),
        ("- np\n", "expected 'flag: value' lines"),
        ("np: [1\n", r"not valid YAML \(line 2\)"),
        (
            "collective-timeout: 5\nlibrary_options:\n  gloo_timeout_seconds: 6\n",
            "give the same flag: keep one",
        ),
    ],
)
def test_a_bad_config_file_is_one_error_naming_the_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = config(tmp_path, text)
    with pytest.raises(UsageError, match=f"config file {path}.*{message}"):
        parse_settings(["--config-file", path, "-np", "1", *COMMAND], {})


def test_a_range_the_settings_refuse_names_the_config_key(tmp_path: Path) -> None:
    path = config(tmp_path, "stop-grace: -1\n")
    with pytest.raises(UsageError, match=f"--stop-grace from config file {path}, key stop-grace"):
        parse_settings(["--config-file", path, "-np", "1", *COMMAND], {})


def test_a_missing_config_file_is_one_error() -> None:
    with pytest.raises(UsageError, match="--config-file /no/such.yaml: No such file"):
        parse_settings(["--config-file", "/no/such.yaml", "-np", "1", *COMMAND], {})


@pytest.mark.e2e
def test_elasticrun_runs_a_job_from_environment_variables_alone(tmp_path: Path) -> None:
    env = {
        "ELASTICRUN_NUM_PROC": "2",
        "ELASTICRUN_OUTPUT_FILENAME": str(tmp_path / "logs"),
        "ELASTICRUN_STOP_GRACE": "2",
    }
    script = "import os; print('size', os.environ['ELASTIC_SIZE'])"
    done = subprocess.run(
        [*ELASTICRUN, "python3", "-c", script],
        env={**_clean_environment(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0]<stdout>:size 2", "[1]<stdout>:size 2"]
    for rank in (0, 1):
        assert (tmp_path / "logs" / f"rank.{rank}" / "stdout").read_text() == "size 2\n"


def _clean_environment() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("ELASTICRUN_")}
