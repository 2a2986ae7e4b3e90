"""`WorkerEnvironment`: what the driver writes into a worker's environment is what the worker
reads back, with one set of defaults, and a worker told something unusable says which
variable."""

from __future__ import annotations

import pytest

from elastic.errors import ElasticError
from elastic.protocol import env
from elastic.protocol.env import (
    CheckpointSettings,
    NotLaunchedError,
    WorkerEnvironment,
    WorkerEnvironmentError,
)
from elastic.protocol.etcd import EtcdOptions
from elastic.protocol.http import SlotInfo
from elastic.worker.config import WorkerConfig

REQUIRED = {
    env.DRIVER_URL: "http://127.0.0.1:41234",
    env.CONTROL_ADDRESS: "127.0.0.1:41235",
    env.TOKEN: "secret-token",
    env.WORKER_ID: "localhost[0]#1",
    env.HOSTNAME: "localhost",
}


def everything() -> WorkerEnvironment:
    """A worker environment with every field away from its default."""
    return WorkerEnvironment(
        driver_url="https://10.0.0.1:41234",
        control_address="10.0.0.1:41235",
        token="secret-token",
        worker_id="h1[1]#7",
        hostname="h1",
        job_id="run7",
        elastic=True,
        start_timeout=12.5,
        collective_timeout=0.25,
        elastic_timeout=90.0,
        tls_cert=b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        etcd=EtcdOptions(
            endpoints=(("10.0.0.5", 2379), ("::1", 2380)),
            prefix="/jobs",
            ca_cert="/etc/ca.pem",
            cert="/etc/cert.pem",
            key="/etc/key.pem",
            user="trainer",
            password="pw",
        ),
        driver_wait=45.0,
        slot=SlotInfo(
            hostname="h1", rank=3, local_rank=1, cross_rank=1, size=4, local_size=2, cross_size=2
        ),
        checkpoint=CheckpointSettings("s3://bucket/run7", every=5, interval=30.0, keep=3),
        preemption_check="discovery_scripts/aws_spot_check.py",
        preemption_check_interval=2.0,
        rollback="commit",
    )


def test_what_the_driver_writes_the_worker_reads_back() -> None:
    sent = everything()
    variables = sent.to_env()
    assert all(isinstance(value, str) for value in variables.values())
    assert WorkerEnvironment.from_env(variables) == sent
    assert WorkerConfig.from_env(variables).etcd == sent.etcd


def test_the_variables_keep_their_documented_names_and_forms() -> None:
    variables = everything().to_env()
    assert variables[env.ELASTIC] == "1"
    assert variables[env.RANK] == "3" and variables[env.CROSS_SIZE] == "2"
    assert variables[env.ETCD_ENDPOINTS] == "10.0.0.5:2379,::1:2380"
    assert variables[env.TLS_CERT].startswith("-----BEGIN CERTIFICATE-----")
    assert float(variables[env.START_TIMEOUT]) == 12.5
    assert variables[env.CHECKPOINT_DIR] == "s3://bucket/run7"
    assert variables[env.CHECKPOINT_EVERY] == "5" and variables[env.CHECKPOINT_KEEP] == "3"
    horovod = {name: value for name, value in variables.items() if name.startswith("HOROVOD_")}
    assert horovod == {  # what horovodrun's Gloo launcher sets, with the same values
        "HOROVOD_HOSTNAME": "h1",
        "HOROVOD_RANK": "3",
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": "1",
        "HOROVOD_CROSS_SIZE": "2",
    }
    assert all(name.startswith("ELASTIC_") for name in variables.keys() - horovod.keys())


def test_a_worker_without_a_slot_gets_its_host_but_no_rank() -> None:
    variables = WorkerEnvironment.from_env(REQUIRED).to_env()
    assert variables["HOROVOD_HOSTNAME"] == "localhost"
    assert not {name for name in variables if "RANK" in name or "SIZE" in name}


def test_unset_variables_take_the_models_defaults() -> None:
    read = WorkerEnvironment.from_env(REQUIRED)
    assert read == WorkerEnvironment(
        driver_url=REQUIRED[env.DRIVER_URL],
        control_address=REQUIRED[env.CONTROL_ADDRESS],
        token=REQUIRED[env.TOKEN],
        worker_id=REQUIRED[env.WORKER_ID],
        hostname=REQUIRED[env.HOSTNAME],
    )
    assert read.job_id == "" and not read.elastic
    assert read.tls_cert is None and read.etcd is None and read.slot is None
    assert (read.start_timeout, read.collective_timeout) == (30.0, 1800.0)
    assert (read.elastic_timeout, read.driver_wait) == (600.0, 300.0)
    assert WorkerEnvironment.from_env({**REQUIRED, env.START_TIMEOUT: ""}).start_timeout == 30.0


def test_a_minimal_environment_sets_no_optional_variable() -> None:
    variables = WorkerEnvironment.from_env(REQUIRED).to_env()
    for name in (env.TLS_CERT, env.ETCD_ENDPOINTS, env.ETCD_PASSWORD, env.RANK, env.SIZE):
        assert name not in variables
    assert WorkerEnvironment.from_env(variables) == WorkerEnvironment.from_env(REQUIRED)


def test_etcd_options_left_out_take_their_defaults() -> None:
    read = WorkerEnvironment.from_env({**REQUIRED, env.ETCD_ENDPOINTS: "10.0.0.5:2379"})
    assert read.etcd == EtcdOptions(endpoints=(("10.0.0.5", 2379),))


@pytest.mark.parametrize("name", list(REQUIRED))
def test_a_process_elasticrun_did_not_start_is_told_how_to_run(name: str) -> None:
    environ = {key: value for key, value in REQUIRED.items() if key != name}
    with pytest.raises(NotLaunchedError) as caught:
        WorkerEnvironment.from_env(environ)
    message = str(caught.value)
    assert message == (
        "elastic.torch.init(): this process was not started by elasticrun "
        f"({name} not set); run it as `elasticrun -np N python script.py`"
    )
    assert isinstance(caught.value, ElasticError) and isinstance(caught.value, RuntimeError)


def test_an_empty_environment_names_every_missing_variable() -> None:
    with pytest.raises(NotLaunchedError, match=", ".join(REQUIRED)):
        WorkerEnvironment.from_env({})


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (env.START_TIMEOUT, "30s", "ELASTIC_START_TIMEOUT='30s' is not a number"),
        (env.COLLECTIVE_TIMEOUT, "x", "ELASTIC_COLLECTIVE_TIMEOUT='x' is not a number"),
        (env.DRIVER_WAIT, "5 min", "ELASTIC_DRIVER_WAIT='5 min' is not a number"),
        (env.ROLLBACK, "never", "ELASTIC_ROLLBACK='never' is not 'step' or 'commit'"),
        (env.ETCD_ENDPOINTS, "nohost", "ELASTIC_ETCD_ENDPOINTS: etcd endpoint 'nohost'"),
    ],
)
def test_a_value_that_does_not_parse_names_its_variable(
    name: str, value: str, message: str
) -> None:
    with pytest.raises(WorkerEnvironmentError) as caught:
        WorkerEnvironment.from_env({**REQUIRED, name: value})
    assert message in str(caught.value)
    assert isinstance(caught.value, ElasticError) and isinstance(caught.value, ValueError)


def test_a_slot_must_be_whole_numbers_given_together() -> None:
    slot = everything().to_env()
    slot = {name: slot[name] for name in (env.RANK, env.SIZE, env.LOCAL_RANK, env.LOCAL_SIZE)}
    with pytest.raises(WorkerEnvironmentError, match="without ELASTIC_CROSS_RANK, ELASTIC_CROSS"):
        WorkerEnvironment.from_env({**REQUIRED, **slot})
    whole = {**everything().to_env(), env.RANK: "1.5"}
    with pytest.raises(WorkerEnvironmentError, match="ELASTIC_RANK='1.5' is not a whole number"):
        WorkerEnvironment.from_env(whole)


def test_the_token_stays_out_of_the_repr() -> None:
    assert "secret-token" not in repr(everything())


def test_worker_config_derives_its_waits_from_the_environment() -> None:
    elastic = WorkerConfig.from_env(everything().to_env())
    assert elastic.rejoin_timeout == 12.5 + 90.0
    assert elastic.driver_retry_for == 45.0  # etcd: a restarted driver may take a while
    static = WorkerConfig.from_env(REQUIRED)
    assert static.rejoin_timeout == 30.0
    assert static.driver_retry_for == 30.0  # no etcd: the driver is gone for good
