"""OutputFollower on real files: what a detached worker writes reaches its sink, in order,
with one follower for every file (no task, no descriptor per file). Each test runs twice:
woken by inotify, and by the polling fallback."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from elastic.driver.launch.follower import OutputFollower
from elastic.driver.launch.output import CHUNK


class Lines:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.closed = False

    def write_line(self, line: bytes) -> None:
        assert not self.closed, "a line after close()"
        self.lines.append(line)

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True


class Followed:
    """One file under follow: its sink, the offsets reported, and the end switch."""

    def __init__(self, follower: OutputFollower, path: Path, offset: int = 0) -> None:
        self.path = path
        self.sink = Lines()
        self.offsets: list[int] = []
        self.over = False
        self.done = follower.add(
            str(path), self.sink, offset, ended=lambda: self.over, at=self.offsets.append
        )

    def append(self, data: bytes) -> None:
        with open(self.path, "ab") as file:
            file.write(data)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture(params=["inotify", "polling"])
def mode(request: pytest.FixtureRequest) -> str:
    return request.param


def run(
    mode: str, test: Callable[[OutputFollower], Awaitable[None]], ended_every: float = 0.5
) -> None:
    async def main() -> None:
        follower = OutputFollower(inotify=mode == "inotify", ended_every=ended_every)
        try:
            await test(follower)
            assert follower.mode == mode
        finally:
            await follower.close()

    asyncio.run(main())


def test_appended_lines_show_in_order(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"")
        out = Followed(follower, tmp_path / "out")
        expected = []
        for n in range(20):
            line = f"line {n}\n".encode()
            expected.append(line)
            out.append(line)
            if n % 5 == 0:
                await until(lambda: len(out.sink.lines) == len(expected))
        await until(lambda: len(out.sink.lines) == 20)
        assert out.sink.lines == expected
        assert not out.done.done()

    run(mode, test)


def test_a_partial_line_waits_for_its_newline(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"")
        out = Followed(follower, tmp_path / "out")
        out.append(b"first\nhalf a")
        await until(lambda: out.sink.lines == [b"first\n"])
        await until(lambda: out.offsets[-1:] == [len(b"first\n")])  # read: held, not lost
        await asyncio.sleep(0.2)
        assert out.sink.lines == [b"first\n"]
        out.append(b" line\n")
        await until(lambda: out.sink.lines == [b"first\n", b"half a line\n"])
        assert out.offsets[-1] == len(b"first\nhalf a line\n")

    run(mode, test)


def test_a_line_longer_than_a_chunk_is_shown_in_pieces(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"")
        out = Followed(follower, tmp_path / "out")
        out.append(b"x" * (3 * CHUNK))
        await until(lambda: sum(map(len, out.sink.lines)) >= 2 * CHUNK)
        assert all(len(line) > CHUNK for line in out.sink.lines)

    run(mode, test)


def test_a_file_created_late_is_waited_for(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        out = Followed(follower, tmp_path / "out")
        later = Followed(follower, tmp_path / "folder" / "out")  # nor its folder yet
        await asyncio.sleep(0.3)
        assert not out.done.done() and not later.done.done()
        out.append(b"hello\n")
        (tmp_path / "folder").mkdir()
        later.append(b"later\n")
        await until(lambda: out.sink.lines == [b"hello\n"])
        await until(lambda: later.sink.lines == [b"later\n"])
        later.append(b"more\n")
        await until(lambda: later.sink.lines == [b"later\n", b"more\n"])

    run(mode, test)


def test_an_ended_writer_is_drained_and_its_sink_closed(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"")
        out = Followed(follower, tmp_path / "out")
        never = Followed(follower, tmp_path / "never")
        await asyncio.sleep(0.1)
        out.append(b"last words\nno newline")  # written, then the writer ends at once
        out.over = never.over = True
        await asyncio.wait_for(asyncio.gather(out.done, never.done), timeout=5)
        assert out.sink.lines == [b"last words\n", b"no newline"]
        assert out.sink.closed and never.sink.closed
        assert never.sink.lines == []

    run(mode, test)


def test_poke_drains_without_waiting_for_the_timer(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"bye\n")
        out = Followed(follower, tmp_path / "out")
        await until(lambda: out.sink.lines == [b"bye\n"])
        out.over = True
        follower.poke()
        await asyncio.wait_for(out.done, timeout=5)
        assert out.sink.closed

    run(mode, test, ended_every=60.0)  # a check that would not come during the test


def test_offsets_start_where_asked_and_report_what_was_shown(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"seen before\nnew\n")
        out = Followed(follower, tmp_path / "out", offset=len(b"seen before\n"))
        await until(lambda: out.sink.lines == [b"new\n"])
        assert out.offsets[-1] == len(b"seen before\nnew\n")
        out.append(b"and more\n")
        await until(lambda: out.offsets[-1] == len(b"seen before\nnew\nand more\n"))
        assert out.sink.lines == [b"new\n", b"and more\n"]

    run(mode, test)


def test_cancelling_stops_following_and_closes_the_sink(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        (tmp_path / "out").write_bytes(b"")
        out = Followed(follower, tmp_path / "out")
        other = Followed(follower, tmp_path / "other")
        out.done.cancel()
        await asyncio.sleep(0)
        assert out.sink.closed
        out.append(b"unseen\n")
        other.append(b"seen\n")
        await until(lambda: other.sink.lines == [b"seen\n"])
        assert out.sink.lines == []

    run(mode, test)


def test_a_failing_sink_ends_only_its_own_file(mode: str, tmp_path: Path) -> None:
    class Broken(Lines):
        def write_line(self, line: bytes) -> None:
            raise BrokenPipeError("console gone")

    async def test(follower: OutputFollower) -> None:
        broken = Broken()
        done = follower.add(str(tmp_path / "a"), broken, 0, ended=lambda: False, at=print)
        out = Followed(follower, tmp_path / "b")
        (tmp_path / "a").write_bytes(b"x\n")
        out.append(b"fine\n")
        with pytest.raises(BrokenPipeError):
            await asyncio.wait_for(done, timeout=5)
        assert broken.closed
        await until(lambda: out.sink.lines == [b"fine\n"])

    run(mode, test)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_500_files_take_no_task_and_no_descriptor_each(mode: str, tmp_path: Path) -> None:
    async def test(follower: OutputFollower) -> None:
        folders = [tmp_path / f"worker.{n}" for n in range(250)]
        for folder in folders:
            folder.mkdir()
            (folder / "stdout").write_bytes(b"")  # stderr comes late
        tasks, fds = len(asyncio.all_tasks()), open_fds()
        files = [
            Followed(follower, folder / name) for folder in folders for name in ("stdout", "stderr")
        ]
        await asyncio.sleep(0.1)
        assert len(asyncio.all_tasks()) == tasks
        assert open_fds() - fds <= (1 if mode == "inotify" else 0)
        for n, out in enumerate(files):
            out.append(f"{n}\n".encode())
        await until(
            lambda: all(out.sink.lines == [f"{n}\n".encode()] for n, out in enumerate(files))
        )
        for out in files:
            out.over = True
        await asyncio.wait_for(asyncio.gather(*(out.done for out in files)), timeout=5)
        assert len(asyncio.all_tasks()) == tasks
        assert open_fds() - fds <= (1 if mode == "inotify" else 0)

    run(mode, test)


def test_quiet_files_cost_little_cpu(mode: str, tmp_path: Path) -> None:
    """Prints the CPU time 1,000 quiet files cost over 2 s (no bound asserted here)."""

    async def test(follower: OutputFollower) -> None:
        for n in range(1000):
            (tmp_path / f"out.{n}").write_bytes(b"")
            Followed(follower, tmp_path / f"out.{n}")
        await asyncio.sleep(1.0)  # past the first reads and the polling's first fast ticks
        start = time.process_time()
        await asyncio.sleep(2.0)
        used = time.process_time() - start
        print(f"\n{mode}: 1,000 quiet files cost {used * 1000:.1f} ms CPU over 2 s")

    run(mode, test)
