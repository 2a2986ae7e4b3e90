"""Host discovery: real scripts run from tmp_path, the bundled scripts, and `HostTracker`.

`hosts_file.sh` runs for real. `slurm.sh` and `kubernetes.sh` need `scontrol` and `kubectl`,
which cannot run here: their tests put fake `scontrol`/`kubectl` executables first on PATH
(in a tmp dir) that print what the real tools would and record the arguments they got.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import shlex
import time
from pathlib import Path

import pytest

from elastic.driver.discovery import (
    DiscoveryError,
    FixedHosts,
    HostDiscovery,
    HostTracker,
    ScriptDiscovery,
)
from elastic.driver.discovery.cooldown import Cooldown
from elastic.driver.discovery.hosts import HostSpec
from tests.support.paths import DISCOVERY_SCRIPTS
from tests.support.processes import pids_alive, processes_naming

SCRIPTS = DISCOVERY_SCRIPTS


def H(text: str) -> list[HostSpec]:  # noqa: N802
    """`"a:2,b:1"` -> HostSpecs (a short way to write expected host lists)."""
    return [HostSpec(n, int(s)) for n, s in (e.split(":") for e in text.split(","))]


def find(discovery: HostDiscovery) -> list[HostSpec]:
    return asyncio.run(discovery.find())


def script(tmp_path: Path, body: str, name: str = "discover.sh") -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def error_of(discovery: HostDiscovery) -> str:
    with pytest.raises(DiscoveryError) as caught:
        find(discovery)
    message = str(caught.value)
    assert "\n" not in message
    return message


def wait_gone(pids: list[int], timeout: float = 3.0) -> list[int]:
    """The PIDs still alive after waiting up to `timeout` s for them to end."""
    deadline = time.monotonic() + timeout
    while pids_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids_alive(pids)


# --- ScriptDiscovery ------------------------------------------------------------------------


def test_script_hosts_in_printed_order(tmp_path: Path) -> None:
    path = script(tmp_path, "printf 'zeta:2\\n\\n# a comment\\nalpha:1  # spare\\nmid:4\\n'\n")
    assert find(ScriptDiscovery(path, timeout=5)) == H("zeta:2,alpha:1,mid:4")


def test_bare_hosts_get_default_slots_or_one(tmp_path: Path) -> None:
    path = script(tmp_path, "printf 'a:2\\nb\\n[fd00::1]\\n[fd00::2]:3\\nc slots=5\\n'\n")
    expected = [("a", 2), ("b", 1), ("fd00::1", 1), ("fd00::2", 3), ("c", 5)]
    assert find(ScriptDiscovery(path, timeout=5)) == [HostSpec(*e) for e in expected]
    expected = [("a", 2), ("b", 4), ("fd00::1", 4), ("fd00::2", 3), ("c", 5)]
    assert find(ScriptDiscovery(path, timeout=5, default_slots=4)) == [
        HostSpec(*e) for e in expected
    ]


def test_a_line_may_carry_a_preemption_notice(tmp_path: Path) -> None:
    """Horovod's `host:slots` lines stay valid; ` leaving` or ` leaving=T` (Unix seconds or
    ISO 8601 with a zone) after one says the host is about to be taken away."""
    path = script(
        tmp_path,
        "printf 'a:2\\nb:1 leaving=1795500000\\nc leaving\\n"
        "[fd00::1]:3 leaving=2026-11-24T08:00:00Z  # reclaimed\\n'\n",
    )
    found = find(ScriptDiscovery(path, timeout=5, default_slots=4))
    assert found == [
        HostSpec("a", 2),
        HostSpec("b", 1, leaving_at=1795500000.0),
        HostSpec("c", 4, leaving_at=math.inf),  # a bare name keeps the default slots
        HostSpec("fd00::1", 3, leaving_at=1795507200.0),
    ]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("a:1 leaving=soon", "notice time 'soon' is neither Unix seconds nor ISO 8601"),
        ("a:1 leaving=2026-11-24T08:00:00", "with a zone"),
        ("a:1 leaving=", "notice time '' is neither"),
        ("a:1 leaving=inf", "notice time 'inf' is not a time"),
        ("a:1 going", "malformed host entry 'a:1 going'"),
    ],
)
def test_a_notice_that_cannot_be_read_names_its_line(
    tmp_path: Path, line: str, expected: str
) -> None:
    message = error_of(ScriptDiscovery(script(tmp_path, f"printf 'b:1\\n{line}\\n'\n"), 5))
    assert "output line 2" in message and expected in message


def test_no_hosts_is_a_valid_answer(tmp_path: Path) -> None:
    assert find(ScriptDiscovery(script(tmp_path, "echo '# none now'\n"), timeout=5)) == []


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("a:2\\nbad host name\\n", "output line 2: malformed host entry 'bad host name'"),
        ("a:x\\n", "output line 1: slot count in 'a:x' is not a number"),
        ("\\n\\na:0\\n", "output line 3: slot count in 'a:0' must be at least 1"),
        ("a:1\\nb:1\\na:2\\n", "host 'a' is listed more than once"),
        ("a:1\\n-Jjump.example:2\\n", "output line 2: host name '-Jjump.example:2' starts"),
    ],
)
def test_malformed_output_names_the_line(tmp_path: Path, output: str, expected: str) -> None:
    path = script(tmp_path, f"printf '{output}'\n")
    message = error_of(ScriptDiscovery(path, timeout=5))
    assert message.startswith(f"discovery script {path} output")
    assert expected in message


def test_nonzero_exit_reports_last_stderr_line(tmp_path: Path) -> None:
    path = script(
        tmp_path,
        "echo 'a:1'\necho 'querying api' >&2\necho 'api: 503 busy' >&2\necho >&2\nexit 3\n",
    )
    assert error_of(ScriptDiscovery(path, timeout=5)) == (
        f"discovery script {path} exited with code 3: api: 503 busy"
    )


def test_nonzero_exit_without_stderr(tmp_path: Path) -> None:
    path = script(tmp_path, "exit 1\n")
    assert error_of(ScriptDiscovery(path, timeout=5)).endswith(
        "exited with code 1 (nothing on stderr)"
    )


def test_script_killed_by_signal(tmp_path: Path) -> None:
    path = script(tmp_path, "echo dying >&2\nkill -KILL $$\n")
    assert error_of(ScriptDiscovery(path, timeout=5)) == (
        f"discovery script {path} was killed by SIGKILL: dying"
    )


def test_hanging_script_and_its_child_are_killed_at_the_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    path = script(tmp_path, f"echo $$ > {pidfile}\nsleep 60 &\necho $! >> {pidfile}\nsleep 60\n")
    started = time.monotonic()
    message = error_of(ScriptDiscovery(path, timeout=0.5))
    elapsed = time.monotonic() - started
    assert message == (f"discovery script {path} did not finish within 0.5 s (--discovery-timeout)")
    assert 0.5 <= elapsed < 3
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    assert wait_gone(pids) == []


def test_script_that_leaves_a_child_holding_its_output_is_cleaned_up(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    path = script(tmp_path, f"sleep 60 &\necho $! > {pidfile}\necho a:1\n")
    assert "did not finish within 0.3 s" in error_of(ScriptDiscovery(path, timeout=0.3))
    assert wait_gone([int(pidfile.read_text())]) == []


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 4, 6, None])
def test_cancelling_find_kills_the_script(tmp_path: Path, yields: int | None) -> None:
    """Cancel at several points of the start (asyncio's own clean-up there would wait for the
    script while its child holds the pipes) and, for None, once the child is running."""
    started = tmp_path / "started"
    # The child names tmp_path on its command line (its $0), so it can be found by scanning.
    path = script(tmp_path, f"sh -c 'sleep 60; :' \"$0-child\" &\ntouch {started}\nsleep 60\n")

    async def cancel_midway() -> float:
        task = asyncio.create_task(ScriptDiscovery(path, timeout=30).find())
        if yields is None:
            while not started.exists():
                await asyncio.sleep(0.01)
        for _ in range(yields or 0):
            await asyncio.sleep(0)
        task.cancel()
        began = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - began

    assert asyncio.run(cancel_midway()) < 2
    deadline = time.monotonic() + 3
    while processes_naming(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes_naming(str(tmp_path)) == {}


def test_missing_script(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.sh")
    assert error_of(ScriptDiscovery(path, timeout=5)) == f"discovery script {path} does not exist"


def test_non_executable_script(tmp_path: Path) -> None:
    path = script(tmp_path, "echo a\n")
    os.chmod(path, 0o644)
    assert error_of(ScriptDiscovery(path, timeout=5)) == (
        f"discovery script {path} is not executable (chmod +x {path})"
    )


def test_directory_is_not_a_script(tmp_path: Path) -> None:
    message = error_of(ScriptDiscovery(str(tmp_path), timeout=5))
    assert message == f"discovery script {tmp_path} is not a file"


def test_script_without_shebang(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_text("echo a\n")
    path.chmod(0o755)
    message = error_of(ScriptDiscovery(str(path), timeout=5))
    assert message.startswith(f"discovery script {path} cannot be run: ")
    assert "#!" in message


def test_path_is_not_interpreted_by_a_shell(tmp_path: Path) -> None:
    folder = tmp_path / "my $HOME; dir"
    folder.mkdir()
    path = script(folder, "echo 'a:3'\n", name="hosts `x`.sh")
    assert find(ScriptDiscovery(path, timeout=5)) == H("a:3")


def test_bare_name_found_in_working_directory_then_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script(tmp_path, "echo here:1\n", name="hosts.sh")
    elsewhere = tmp_path / "bin"
    elsewhere.mkdir()
    script(elsewhere, "echo onpath:1\n", name="onpath.sh")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{elsewhere}{os.pathsep}{os.environ['PATH']}")
    assert find(ScriptDiscovery("hosts.sh", timeout=5)) == H("here:1")
    assert find(ScriptDiscovery("onpath.sh", timeout=5)) == H("onpath:1")
    assert "does not exist" in error_of(ScriptDiscovery("absent.sh", timeout=5))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ScriptDiscovery("x", timeout=0)
    with pytest.raises(ValueError):
        ScriptDiscovery("x", timeout=1, default_slots=0)


def test_fixed_hosts() -> None:
    hosts = H("a:2,b:1")
    discovery = FixedHosts(hosts)
    found = find(discovery)
    assert found == hosts
    found.clear()
    assert find(discovery) == hosts


# --- bundled scripts --------------------------------------------------------------------------


def test_hosts_file_script_follows_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# cluster\nnode1:4\nnode2\n")
    monkeypatch.setenv("ELASTIC_HOSTS_FILE", str(hosts))
    discovery = ScriptDiscovery(str(SCRIPTS / "hosts_file.sh"), timeout=5, default_slots=2)
    assert find(discovery) == H("node1:4,node2:2")
    hosts.write_text("node2\nnode3:1\n")
    assert find(discovery) == H("node2:2,node3:1")
    hosts.unlink()
    assert "cannot read hosts file" in error_of(discovery)
    monkeypatch.delenv("ELASTIC_HOSTS_FILE")
    assert "ELASTIC_HOSTS_FILE" in error_of(discovery)


def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> Path:
    """Put an executable `name` first on PATH; it logs its arguments to `<name>.args`."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / f"{name}.args"
    script(bin_dir, f'printf "%s\\n" "$@" > {shlex.quote(str(log))}\n{body}', name=name)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("SLURM_NTASKS_PER_NODE", "ELASTIC_SLOTS_PER_HOST", "ELASTIC_EXCLUDE_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-03]")
    return fake_tool(tmp_path, monkeypatch, "scontrol", "printf 'gpu01\\ngpu02\\ngpu03\\n'\n")


def test_slurm_script_lists_nodes(slurm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    discovery = ScriptDiscovery(str(SCRIPTS / "slurm.sh"), timeout=5, default_slots=2)
    assert find(discovery) == H("gpu01:2,gpu02:2,gpu03:2")
    assert slurm.read_text().split() == ["show", "hostnames", "gpu[01-03]"]
    monkeypatch.setenv("ELASTIC_SLOTS_PER_HOST", "3")
    assert find(discovery) == H("gpu01:3,gpu02:3,gpu03:3")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "8")
    assert find(discovery) == H("gpu01:8,gpu02:8,gpu03:8")


def test_slurm_script_excludes_listed_nodes(
    slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exclude = tmp_path / "drain.txt"
    monkeypatch.setenv("ELASTIC_EXCLUDE_FILE", str(exclude))
    discovery = ScriptDiscovery(str(SCRIPTS / "slurm.sh"), timeout=5)
    assert find(discovery) == H("gpu01:1,gpu02:1,gpu03:1")  # no file yet: nothing excluded
    exclude.write_text("gpu02\ngpu0\n")
    assert find(discovery) == H("gpu01:1,gpu03:1")


def test_slurm_script_errors(slurm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    discovery = ScriptDiscovery(str(SCRIPTS / "slurm.sh"), timeout=5)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2(x3)")
    assert "slots per node must be a positive number, got '2(x3)'" in error_of(discovery)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE")
    fake_tool(tmp_path, monkeypatch, "scontrol", "echo 'scontrol: error: bad list' >&2; exit 1\n")
    assert error_of(discovery).endswith("exited with code 1: scontrol: error: bad list")
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    assert "SLURM_JOB_NODELIST is not set" in error_of(discovery)


PODS = """\
w-0|10.0.0.5|Running|True|
w-1|10.0.0.6|Pending||
w-2|10.0.0.7|Running|False|
w-3|10.0.0.8|Running|True|2024-05-01T00:00:00Z
w-4||Running|True|
w-5|fd00::9|Running|True|
w-6|10.0.0.2|Running|True|
"""


@pytest.fixture
def kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("ELASTIC_K8S_NAMESPACE", "ELASTIC_K8S_ADDRESS", "ELASTIC_SLOTS_PER_HOST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ELASTIC_K8S_SELECTOR", "app=trainer,job=j1")
    (tmp_path / "pods.txt").write_text(PODS)
    return fake_tool(tmp_path, monkeypatch, "kubectl", f"cat {tmp_path / 'pods.txt'}\n")


def test_kubernetes_script_lists_running_ready_pods(
    kubectl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    discovery = ScriptDiscovery(str(SCRIPTS / "kubernetes.sh"), timeout=5)
    expected = [HostSpec("10.0.0.5", 1), HostSpec("fd00::9", 1), HostSpec("10.0.0.2", 1)]
    assert find(discovery) == expected
    args = kubectl.read_text().splitlines()
    assert args[:3] == ["get", "pods", "-l"] and args[3] == "app=trainer,job=j1"
    assert args[4] == "-o" and args[5].startswith("jsonpath=")
    for field in ("metadata.name", "status.podIP", "status.phase", "Ready", "deletionTimestamp"):
        assert field in args[5]
    monkeypatch.setenv("ELASTIC_K8S_ADDRESS", "name")
    monkeypatch.setenv("ELASTIC_SLOTS_PER_HOST", "2")
    monkeypatch.setenv("ELASTIC_K8S_NAMESPACE", "team-a")
    assert find(discovery) == H("w-0:2,w-5:2,w-6:2")
    assert kubectl.read_text().splitlines()[2:4] == ["--namespace", "team-a"]


def test_kubernetes_script_errors(
    kubectl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    discovery = ScriptDiscovery(str(SCRIPTS / "kubernetes.sh"), timeout=5)
    monkeypatch.setenv("ELASTIC_K8S_ADDRESS", "dns")
    assert "ELASTIC_K8S_ADDRESS must be 'ip' or 'name', got 'dns'" in error_of(discovery)
    monkeypatch.delenv("ELASTIC_K8S_ADDRESS")
    fake_tool(tmp_path, monkeypatch, "kubectl", "echo 'error: You must be logged in' >&2; exit 1\n")
    assert error_of(discovery).endswith("exited with code 1: error: You must be logged in")
    monkeypatch.delenv("ELASTIC_K8S_SELECTOR")
    assert "set ELASTIC_K8S_SELECTOR" in error_of(discovery)


# --- HostTracker ----------------------------------------------------------------------------


def tracker(low: float = 10, high: float = 100, seed: int = 0) -> HostTracker:
    return HostTracker(Cooldown(low, high, random.Random(seed)))


def names(t: HostTracker) -> list[str]:
    return [spec.hostname for spec in t.hosts]


def test_a_host_under_notice_is_not_usable_until_its_time_passes() -> None:
    t = tracker()
    t.discovered(H("a:2,b:1"), now=0)
    noticed = [HostSpec("a", 2), HostSpec("b", 1, leaving_at=50.0)]
    update = t.discovered(noticed, now=10)
    assert update.change is not None and update.change.removed == ("b",)
    assert names(t) == ["a"] and t.leaving(10) == {"b": 50.0}
    assert t.next_expiry(10) == 50.0  # then `refresh`
    assert t.refresh(49).change is None
    assert t.refresh(50).change is not None and names(t) == ["a", "b"] and t.leaving(50) == {}
    t.discovered([HostSpec("a", 2), HostSpec("b", 1, leaving_at=math.inf)], now=60)
    assert names(t) == ["a"] and t.next_expiry(60) is None  # until discovery says otherwise
    t.discovered(H("a:2,b:1"), now=70)
    assert names(t) == ["a", "b"]


def test_first_result_adds_hosts_in_source_order() -> None:
    t = tracker()
    assert t.version == 0 and t.hosts == () and not t.has_result
    update = t.discovered(H("b:2,a:1,c:4"), now=0)
    assert update.change is not None and update.error is None and not update.recovered
    assert update.change.version == 1 == t.version
    assert update.change.added == ("b", "a", "c")
    assert update.change.removed == () and update.change.resized == ()
    assert update.change.hosts == t.hosts == tuple(H("b:2,a:1,c:4"))
    assert t.slots == 7 and t.has_result


def test_same_or_reordered_result_is_no_change() -> None:
    t = tracker()
    t.discovered(H("a:1,b:1,c:1"), now=0)
    assert t.discovered(H("a:1,b:1,c:1"), now=1).change is None
    assert t.discovered(H("c:1,b:1,a:1"), now=2).change is None
    assert names(t) == ["a", "b", "c"] and t.version == 1
    assert t.discovered_hosts == tuple(H("c:1,b:1,a:1"))


def test_empty_first_result_is_no_change() -> None:
    t = tracker()
    update = t.discovered([], now=0)
    assert update.change is None and t.has_result and t.version == 0


def test_added_removed_and_returning_hosts() -> None:
    t = tracker()
    t.discovered(H("a:1,b:1,c:1"), now=0)
    change = t.discovered(H("d:1,b:1,a:1,c:1,e:1"), now=1).change
    assert change is not None and change.added == ("d", "e") and change.version == 2
    assert names(t) == ["a", "b", "c", "d", "e"]
    change = t.discovered(H("a:1,c:1,d:1,e:1"), now=2).change
    assert change is not None and change.removed == ("b",) and change.added == ()
    change = t.discovered(H("b:1,a:1,c:1,d:1,e:1"), now=3).change
    assert change is not None and change.added == ("b",) and change.version == 4
    assert names(t) == ["a", "c", "d", "e", "b"]  # back at the end


def test_slot_count_change_is_reported_as_resized() -> None:
    t = tracker()
    t.discovered(H("a:1,b:1"), now=0)
    change = t.discovered(H("a:1,b:4"), now=1).change
    assert change is not None and change.resized == ("b",) and change.version == 2
    assert change.added == change.removed == ()
    assert t.hosts == tuple(H("a:1,b:4"))


def test_duplicate_host_counts_once() -> None:
    t = tracker()
    t.discovered([HostSpec("a", 2), HostSpec("b", 1), HostSpec("a", 5)], now=0)
    assert t.hosts == tuple(H("a:2,b:1"))


def test_failed_discovery_keeps_last_good_hosts_and_logs_each_error_once() -> None:
    t = tracker()
    t.discovered(H("a:1,b:1"), now=0)
    first = t.discovery_failed("script exited with code 1: boom", now=1)
    assert first.error == "script exited with code 1: boom" and first.change is None
    logged = [
        t.discovery_failed("script exited with code 1: boom", now=s).error for s in range(2, 50)
    ]
    assert logged == [None] * 48
    assert t.hosts == tuple(H("a:1,b:1")) and t.version == 1
    assert t.error == "script exited with code 1: boom"
    assert t.discovery_failed("script timed out", now=50).error == "script timed out"
    assert t.discovery_failed("script timed out", now=51).error is None
    back = t.discovered(H("a:1,b:1"), now=52)
    assert back.recovered and back.change is None and t.error is None
    assert not t.discovered(H("a:1,b:1"), now=53).recovered
    assert t.discovery_failed("script timed out", now=54).error == "script timed out"


def test_failure_before_any_result() -> None:
    t = tracker()
    update = t.discovery_failed("no such script", now=0)
    assert update.error == "no such script" and update.change is None
    assert t.hosts == () and not t.has_result


def test_failed_host_is_cooled_down_and_comes_back_as_added() -> None:
    t = tracker(low=10, high=100)
    t.discovered(H("a:1,b:2,c:1"), now=0)
    change = t.host_failed("b", now=5).change
    assert change is not None and change.removed == ("b",) and change.version == 2
    assert names(t) == ["a", "c"] and t.slots == 2
    until = t.cooldown.until("b")
    assert until is not None and 15 <= until <= 17
    assert t.next_expiry(now=5) == until
    assert t.host_failed("b", now=6).change is None  # its other worker: same failure
    assert t.cooldown.failures("b") == 1
    assert t.discovered(H("a:1,b:2,c:1"), now=7).change is None  # still listed, still cooling
    assert t.refresh(now=until - 0.01).change is None
    change = t.refresh(now=until).change
    assert change is not None and change.added == ("b",) and change.version == 3
    assert names(t) == ["a", "c", "b"]
    assert t.next_expiry(now=until) is None


def test_cooldown_expiry_is_noticed_while_discovery_fails() -> None:
    t = tracker(low=10, high=10)
    t.discovered(H("a:1,b:1"), now=0)
    t.host_failed("a", now=0)
    update = t.discovery_failed("boom", now=10)
    assert update.error == "boom"
    assert update.change is not None and update.change.added == ("a",)


def test_host_in_cooldown_that_reappears_stays_out_until_it_ends() -> None:
    t = tracker(low=10, high=10)
    t.discovered(H("a:1"), now=0)
    t.host_failed("x", now=0)  # not discovered yet: remembered anyway
    assert t.next_expiry(now=0) is None
    assert t.discovered(H("a:1,x:1"), now=1).change is None
    assert t.next_expiry(now=1) == 10
    change = t.refresh(now=10).change
    assert change is not None and change.added == ("x",)


def test_repeated_failures_grow_the_cooldown() -> None:
    t = tracker(low=10, high=1000)
    t.discovered(H("a:1,b:1"), now=0)
    now, delays = 0.0, []
    for _ in range(4):
        t.host_failed("a", now)
        until = t.next_expiry(now)
        assert until is not None
        delays.append(until - now)
        now = until
        assert t.refresh(now).change is not None
    assert all(later > earlier * 1.3 for earlier, later in zip(delays, delays[1:], strict=False))


def test_tracker_is_deterministic() -> None:
    def run() -> list[object]:
        t = tracker(seed=11)
        log: list[object] = [t.discovered(H("a:1,b:2,c:1"), now=0)]
        log.append(t.host_failed("b", now=1))
        log.append(t.discovered(H("c:1,d:3,a:1,b:2"), now=2))
        log.append(t.refresh(now=t.next_expiry(2) or 0))
        log.append(t.discovery_failed("x", now=40))
        return log

    assert run() == run()
    assert [spec.hostname for spec in run()[3].change.hosts] == ["a", "c", "d", "b"]  # type: ignore[attr-defined]
