"""Worker output on a shared machine: another local user must not be able to make the driver
(maybe root) write through a planted link or into their folder, nor read the output.

The real-process tests run `elasticrun --backend etcd` (detached local workers, output under
`$TMPDIR/elasticrun-<job id>`) with the job's folder planted beforehand; the others call the
functions that guard each write directly. The tests run as root: "another user" is uid 65534.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from elastic.driver.errors import LaunchError
from elastic.driver.launch.detached import prepare_log_dir
from elastic.driver.launch.output import OutputSink, folder_mode
from elastic.driver.launch.private_files import open_private, private_dir
from tests.support.etcd_server import EtcdServer
from tests.support.prerequisites import CI_IS_ROOT

pytestmark = pytest.mark.timeout(120)

NOBODY = 65534
PRECIOUS = b"root's file: must stay as it is\n"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason=f"needs root to chown to another user; {CI_IS_ROOT}"
)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def durable_args(etcd: EtcdServer, job_id: str, *rest: str) -> list[str]:
    return ["--backend", "etcd", "--etcd-endpoints", etcd.endpoint, "--job-id", job_id, *rest]


HELLO = [
    sys.executable,
    "-c",
    "import sys; print('hello out'); print('hello err', file=sys.stderr)",
]


# --- real processes ----------------------------------------------------------------------


def plant_foreign_root(root: Path, target: Path) -> None:
    """The job's folder exists, world-writable and owned by another user."""
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    os.chown(root, NOBODY, NOBODY)


def plant_root_link(root: Path, target: Path) -> None:
    """The job's folder is a link to a folder the attacker chose."""
    elsewhere = target.parent / "elsewhere"
    elsewhere.mkdir()
    root.symlink_to(elsewhere)


def plant_worker_link(root: Path, target: Path) -> None:
    """worker.1 is a link to a folder the attacker chose."""
    elsewhere = target.parent / "elsewhere"
    elsewhere.mkdir()
    root.mkdir()
    (root / "worker.1").symlink_to(elsewhere)


def plant_stdout_link(root: Path, target: Path) -> None:
    """worker.1/stdout is a link to root's file (made while the folder was still open)."""
    (root / "worker.1").mkdir(parents=True)
    (root / "worker.1" / "stdout").symlink_to(target)
    os.lchown(root / "worker.1" / "stdout", NOBODY, NOBODY)


@pytest.mark.root
@needs_root
@pytest.mark.parametrize(
    ("plant", "refusal"),
    [
        (plant_foreign_root, r"elasticrun-planted belongs to uid 65534"),
        (plant_root_link, r"elasticrun-planted is a symbolic link"),
        (plant_worker_link, r"worker\.1 is a symbolic link"),
        (plant_stdout_link, r"worker\.1/stdout is a symbolic link"),
    ],
    ids=["foreign-owner", "root-link", "worker-link", "stdout-link"],
)
def test_a_planted_job_folder_is_refused_with_one_line(
    elasticrun,
    etcd: EtcdServer,
    tmp_path: Path,
    plant: Callable[[Path, Path], None],
    refusal: str,
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    target = tmp_path / "victim" / "precious"
    target.parent.mkdir()
    target.write_bytes(PRECIOUS)
    root = temp / "elasticrun-planted"
    plant(root, target)
    job = elasticrun(durable_args(etcd, "planted", "-np", "1", *HELLO), {"TMPDIR": str(temp)})
    assert job.finish(60) == 1, job.transcript()
    refused = [line for line in job.stderr if "refusing" in line]
    assert len(refused) == 1, job.transcript()
    assert refused[0].startswith("elasticrun: ") and re.search(refusal, refused[0])
    assert "Traceback" not in job.output
    assert "hello" not in job.output, "no worker ran"
    assert target.read_bytes() == PRECIOUS
    elsewhere = tmp_path / "victim" / "elsewhere"
    assert not elsewhere.exists() or list(elsewhere.iterdir()) == [], "nothing written there"


def test_worker_output_is_private(elasticrun, etcd: EtcdServer, tmp_path: Path) -> None:
    """Folders 0700 and files 0600, whatever the umask: the job's folder (an existing one of
    this user is tightened), each worker's, and --output-filename's rank folders."""
    temp, out = tmp_path / "tmp", tmp_path / "out"
    temp.mkdir()
    root = temp / "elasticrun-private1"
    root.mkdir(mode=0o755)  # left by an older version: the driver's own, re-used
    root.chmod(0o755)
    job = elasticrun(
        durable_args(etcd, "private1", "-np", "2", "--output-filename", str(out), *HELLO),
        {"TMPDIR": str(temp)},
    )
    assert job.finish(60) == 0, job.transcript()
    assert mode_of(root) == 0o700
    workers = sorted(root.iterdir())
    assert [w.name for w in workers] == ["worker.1", "worker.2"]
    for folder in workers:
        assert mode_of(folder) == 0o700
        assert {f.name: mode_of(f) for f in folder.iterdir()} == {
            "stdout": 0o600,
            "stderr": 0o600,
            "exit": 0o600,
        }
        assert (folder / "stdout").read_text() == "hello out\n"
    for rank in ("rank.0", "rank.1"):
        assert mode_of(out / rank) == 0o700
        assert mode_of(out / rank / "stdout") == 0o600
        assert mode_of(out / rank / "stderr") == 0o600
        assert (out / rank / "stderr").read_text() == "hello err\n"


def test_the_keeper_does_not_write_through_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "worker.1"
    folder.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_bytes(PRECIOUS)
    (folder / "stderr").symlink_to(target)
    done = subprocess.run(
        [sys.executable, "-m", "elastic.driver.launch.keeper", str(folder), "--", *HELLO],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 126
    assert "stderr is a symbolic link" in done.stderr
    assert target.read_bytes() == PRECIOUS
    assert not (folder / "exit").exists()


# --- the guards --------------------------------------------------------------------------


def test_private_dir_creates_and_tightens(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        private_dir(str(tmp_path / "new"))
        (tmp_path / "mine").mkdir(mode=0o777)
        (tmp_path / "mine").chmod(0o777)
        private_dir(str(tmp_path / "mine"))
        private_dir(str(tmp_path / "shared"), 0o750)
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "new") == 0o700
    assert mode_of(tmp_path / "mine") == 0o700
    assert mode_of(tmp_path / "shared") == 0o750


def test_private_dir_refuses_links_and_files(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    with pytest.raises(LaunchError, match="link is a symbolic link or not a folder"):
        private_dir(str(tmp_path / "link"))
    with pytest.raises(LaunchError, match="file is a symbolic link or not a folder"):
        private_dir(str(tmp_path / "file"))
    with pytest.raises(LaunchError, match="cannot create .*: No such file"):
        private_dir(str(tmp_path / "missing" / "child"))


@pytest.mark.root
@needs_root
def test_another_users_folder_or_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(LaunchError, match="theirs belongs to uid 65534, not to this user"):
        private_dir(str(tmp_path / "theirs"))
    (tmp_path / "their-file").write_bytes(PRECIOUS)
    os.chown(tmp_path / "their-file", NOBODY, NOBODY)
    with pytest.raises(LaunchError, match="their-file belongs to uid 65534"):
        open_private(str(tmp_path / "their-file"))
    assert (tmp_path / "their-file").read_bytes() == PRECIOUS


def test_open_private_refuses_links_and_special_files(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_bytes(PRECIOUS)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(LaunchError, match="link is a symbolic link: refusing"):
        open_private(str(tmp_path / "link"))
    with pytest.raises(LaunchError, match="dangling is a symbolic link"):
        open_private(str(tmp_path / "dangling"))
    with pytest.raises(LaunchError, match="fifo is not a regular file"):
        open_private(str(tmp_path / "fifo"), os.O_RDWR)
    assert target.read_bytes() == PRECIOUS
    assert not (tmp_path / "nowhere").exists()


def test_open_private_appends_and_tightens(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"one\n")
    path.chmod(0o644)
    fd = open_private(str(path))
    os.write(fd, b"two\n")
    os.close(fd)
    assert path.read_bytes() == b"one\ntwo\n" and mode_of(path) == 0o600


def test_prepare_log_dir_re_adopts_its_own_folder(tmp_path: Path) -> None:
    """A restarted driver (same user) uses the folders an earlier driver made; a stale exit
    status in a worker folder that is used again is dropped."""
    root = str(tmp_path / "elasticrun-job")
    first = prepare_log_dir(root, 1)
    Path(first, "stdout").write_text("earlier output\n")
    Path(first, "exit").write_text("0")
    again = prepare_log_dir(root, 1)
    assert again == first and mode_of(Path(root)) == 0o700
    assert Path(first, "stdout").read_text() == "earlier output\n"
    assert not Path(first, "exit").exists()


def test_output_sink_refuses_a_planted_rank_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "rank.0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LaunchError, match=r"rank\.0 is a symbolic link"):
        OutputSink(lambda line: line, "stdout", str(out), "rank.0")
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize(
    ("file_mode", "expected"), [(0o600, 0o700), (0o640, 0o750), (0o644, 0o755), (0o660, 0o770)]
)
def test_folder_mode_has_the_x_bits_of_its_r_bits(file_mode: int, expected: int) -> None:
    assert folder_mode(file_mode) == expected


def test_output_sink_with_a_shared_mode(tmp_path: Path) -> None:
    sink = OutputSink(lambda line: line, "stdout", str(tmp_path / "out"), "rank.0", mode=0o640)
    sink.close()
    assert mode_of(tmp_path / "out" / "rank.0") == 0o750
    assert mode_of(tmp_path / "out" / "rank.0" / "stdout") == 0o640
