"""`Settings` checks its own values wherever it is built (the CLI, a restarted driver reading
the saved job, a benchmark), with the messages `elasticrun` prints for the flags."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from elastic.driver.cli.main import parse_settings
from elastic.driver.discovery.hosts import HostSpec
from elastic.driver.errors import SettingsError, UsageError
from elastic.driver.journal.resume import settings_document, settings_from
from elastic.driver.launch.ssh import SshOptions
from elastic.driver.settings import MAX_NP, BackendSettings, ElasticSettings, Settings
from elastic.errors import ElasticError
from elastic.protocol.etcd import EtcdOptions

ETCD = EtcdOptions(endpoints=(("127.0.0.1", 2379),))


def settings(**changes: Any) -> Settings:
    values: dict[str, Any] = {"np": 2, "hosts": [HostSpec("localhost", 2)], "command": ["x"]}
    return Settings(**{**values, **changes})


def elastic(**changes: Any) -> ElasticSettings:
    values: dict[str, Any] = {"min_np": 1, "max_np": 4, "discovery_script": None}
    return ElasticSettings(**{**values, **changes})


def test_a_settings_error_is_a_usage_error_and_a_value_error() -> None:
    assert issubclass(SettingsError, UsageError)  # elasticrun prints it, exit 2
    assert issubclass(SettingsError, ElasticError) and issubclass(SettingsError, ValueError)


def test_good_settings_build() -> None:
    built = settings(elastic=elastic(), backend=BackendSettings(etcd=ETCD, job_id="run-7.a_b"))
    assert built.np == 2 and built.elastic is not None and built.backend.durable
    assert settings(np=None, elastic=elastic(cooldown_range=(0.0, 0.0))).np is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"command": []}, "no command given: elasticrun -np N [options] COMMAND [ARGS...]"),
        ({"np": None}, "-np is required (or give --min-np / --host-discovery-script)"),
        ({"np": 0}, "-np must be at least 1, got 0"),
        ({"np": MAX_NP + 1}, f"-np must be at most {MAX_NP}, got {MAX_NP + 1}"),
        ({"start_timeout": 0.0}, "--start-timeout must be positive and at most 31536000"),
        ({"collective_timeout": math.inf}, "--collective-timeout must be positive"),
        ({"stop_grace": -1.0}, "--stop-grace must be positive"),
        ({"heartbeat_interval": math.nan}, "--heartbeat-interval must be positive"),
        ({"ssh": SshOptions(port=70000)}, "--ssh-port must be 1-65535, got 70000"),
        ({"np": 5, "elastic": elastic()}, "-np 5 must lie between --min-np and --max-np"),
        ({"tls": True, "tls_cert": "c.pem"}, "--tls-cert and --tls-key go together"),
    ],
)
def test_bad_settings_are_refused_with_the_flags_message(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(**changes)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"min_np": 0}, "--min-np must be at least 1, got 0"),
        ({"max_np": MAX_NP + 1}, f"--max-np must be at most {MAX_NP}"),
        ({"slots_per_host": 0}, "--slots-per-host must be at least 1"),
        ({"min_np": 3, "max_np": 2}, "--max-np 2 is less than --min-np 3"),
        ({"reset_limit": -1}, "--reset-limit must be 0 or more, got -1"),
        ({"elastic_timeout": -5.0}, "--elastic-timeout must be positive"),
        ({"discovery_interval": 0.0}, "--discovery-interval must be positive"),
        ({"discovery_timeout": 1e400}, "--discovery-timeout must be positive"),
        ({"cooldown_range": (-1.0, 5.0)}, "--blacklist-cooldown-range must be 0 or more"),
        ({"cooldown_range": (10.0, 5.0)}, "--blacklist-cooldown-range: MAX (5) must not be less"),
        ({"standby": -1}, "--standby must be 0 to 64, got -1"),
        ({"standby": 65}, "--standby must be 0 to 64, got 65"),
        ({"preload": ("torch", "a-b")}, "--preload: 'a-b' is not a module name"),
    ],
)
def test_bad_elastic_settings_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        elastic(**changes)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"job_id": "a/b"}, "--job-id 'a/b': use 1-64 letters, digits, '.', '_' or '-'"),
        ({"job_id": "x" * 65}, "--job-id 'xxx"),
        ({"grace": 0.0}, "--etcd-grace must be positive"),
        ({"driver_wait": math.inf}, "--driver-wait must be positive"),
        ({"etcd": replace(ETCD, cert="c.pem")}, "--etcd-cert and --etcd-key go together"),
        ({"etcd": replace(ETCD, user="u")}, "--etcd-user needs its password: --etcd-password"),
        ({"etcd": replace(ETCD, prefix="jobs")}, "--etcd-prefix must start with '/', got 'jobs'"),
    ],
)
def test_bad_backend_settings_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        BackendSettings(**changes)
    assert str(caught.value).startswith(message)


def test_a_restarted_driver_checks_the_settings_it_reads_back() -> None:
    saved = settings_document(settings(elastic=elastic()))
    assert settings_from(saved, BackendSettings()) == settings(elastic=elastic())
    with pytest.raises(ValidationError, match="--max-np 4 is less than --min-np 9"):
        settings_from({**saved, "elastic": {**saved["elastic"], "min_np": 9}}, BackendSettings())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-np", "1"], "no command given"),
        (["x"], "-np is required"),
        (["--min-np", "3", "--max-np", "2", "x"], "--max-np 2 is less than --min-np 3"),
        (["-np", "5", "--min-np", "1", "--max-np", "4", "x"], "-np 5 must lie between"),
        (["--min-np", "1", "--reset-limit", "-1", "x"], "--reset-limit must be 0 or more"),
        (["-np", "1", "--elastic-timeout", "0", "x"], "--elastic-timeout must be positive"),
        (["-np", "1", "--ssh-port", "0", "x"], "--ssh-port must be 1-65535, got 0"),
        (["-np", "1", "--tls-key", "k.pem", "x"], "--tls-cert and --tls-key go together"),
        (["-np", "1", "--job-id", "a b", "x"], "--job-id 'a b': use 1-64 letters"),
        (["-np", "1", "--driver-wait", "-1", "x"], "--driver-wait must be positive"),
        (["-np", "1", "--checkpoint-every", "0", "x"], "--checkpoint-every (0) and"),
        (["-np", "1", "--preemption-check", "c", "x"], "--preemption-check needs elastic mode"),
        (
            ["--min-np", "1", "--preemption-check-interval", "0", "x"],
            "--preemption-check-interval must be positive",
        ),
        (["-np", "1", "--checkpoint-keep", "0", "x"], "--checkpoint-every (1) and"),
        (["-np", "1", "--standby", "1", "python", "t.py"], "--standby needs elastic mode"),
        (["--min-np", "1", "--standby", "1", "bash", "t.sh"], "--standby 1: standbys run only"),
        (
            ["--min-np", "1", "--standby", "0", "--preload", "m", "python", "t.py"],
            "--preload needs standbys",
        ),
        (["--min-np", "1", "--preload", "1m", "python", "t.py"], "--preload: '1m' is not"),
        (["-np", "1", "--checkpoint-interval", "-1", "x"], "--checkpoint-interval must be 0"),
        (
            ["--backend", "etcd", "--etcd-endpoints", "h:1", "--etcd-prefix", "p", "-np", "1", "x"],
            "--etcd-prefix must start with '/', got 'p'",
        ),
    ],
)
def test_the_cli_reports_what_the_settings_refuse(args: list[str], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_settings(args)
    assert str(caught.value).startswith(message)


def test_the_etcd_password_is_in_no_repr_of_the_settings() -> None:
    from elastic.driver.settings import BackendSettings
    from elastic.protocol.etcd import EtcdOptions

    backend = BackendSettings(etcd=EtcdOptions(endpoints=(("127.0.0.1", 2379),), password="s3cret"))
    assert "s3cret" not in repr(backend)


def test_a_checkpoint_directory_reaches_the_workers_absolute(tmp_path, monkeypatch) -> None:
    """A relative --checkpoint-dir is the driver's: the workers (started elsewhere) get it
    absolute; a URL goes as it is; without the flag no worker variable is set."""
    monkeypatch.chdir(tmp_path)
    settings = parse_settings(
        ["-np", "1", "--checkpoint-dir", "ckpt", "--checkpoint-keep", "4", "x"]
    )
    assert settings.checkpoint.directory == str(tmp_path / "ckpt")
    assert settings.checkpoint.keep == 4 and settings.checkpoint.every == 1
    url = parse_settings(["-np", "1", "--checkpoint-dir", "s3://b/run", "x"]).checkpoint
    assert url.directory == "s3://b/run"
    assert parse_settings(["-np", "1", "x"]).checkpoint.to_env() == {}


@pytest.mark.parametrize(
    ("args", "standby", "preload"),
    [
        (["--min-np", "1", "python", "t.py"], 0, ()),  # off by default
        (["--min-np", "1", "--standby", "1", "python3", "-u", "-m", "pkg.train"], 1, ()),
        (["--min-np", "1", "bash", "t.sh"], 0, ()),  # off by default for another one
        (["--min-np", "1", "python", "-i", "t.py"], 0, ()),  # -i: no standby can honour it
        (["--min-np", "1", "--standby", "0", "python", "t.py"], 0, ()),
        (
            ["--min-np", "1", "--standby", "3", "--preload", "a.b, c", "python", "t.py"],
            3,
            ("a.b", "c"),
        ),
        (["-np", "1", "python", "t.py"], None, None),  # not elastic: nothing to refill
    ],
)
def test_standbys_are_on_where_a_standby_can_run_the_command(
    args: list[str], standby: int | None, preload: tuple[str, ...] | None
) -> None:
    elastic = parse_settings(args).elastic
    if standby is None:
        assert elastic is None
    else:
        assert elastic is not None and (elastic.standby, elastic.preload) == (standby, preload)
