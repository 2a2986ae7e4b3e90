"""Parsing `-H` and hostfiles."""

import pytest

from elastic.driver.discovery.hosts import (
    HostSpec,
    parse_host_lines,
    parse_host_list,
    read_hostfile,
)
from elastic.driver.errors import UsageError


def test_host_list_keeps_order_and_defaults_to_one_slot() -> None:
    assert parse_host_list("b:2,a,127.0.0.1:3") == [
        HostSpec("b", 2),
        HostSpec("a", 1),
        HostSpec("127.0.0.1", 3),
    ]


def test_ipv6_hosts_are_written_in_brackets() -> None:
    assert parse_host_list("[::1]:2") == [HostSpec("::1", 2)]


def test_hostfile_accepts_both_forms_comments_and_blank_lines(tmp_path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# cluster\nnode1 slots=4\n\nnode2:2  # spare\nnode3\n")
    assert read_hostfile(str(path)) == [
        HostSpec("node1", 4),
        HostSpec("node2", 2),
        HostSpec("node3", 1),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a:x", "not a number"),
        ("a:0", "at least 1"),
        (":2", "malformed host entry"),
        ("a,,b", "malformed host list"),
        ("", "malformed host list"),
        ("a b", "malformed host entry"),
        ("a:2,a:1", "more than once"),
        ("host;rm -rf /", "malformed host entry"),
    ],
)
def test_malformed_host_lists_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_host_list(text)


def test_malformed_hostfile_line_is_named() -> None:
    with pytest.raises(UsageError, match="hosts line 2"):
        parse_host_lines("good:1\nbad:-1\n", "hosts")


def test_missing_or_empty_hostfile(tmp_path) -> None:
    with pytest.raises(UsageError, match="cannot read"):
        read_hostfile(str(tmp_path / "absent"))
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(UsageError, match="lists no hosts"):
        read_hostfile(str(empty))


@pytest.mark.parametrize("name", ["-Jjump.example", "-Esome.log", "-oProxyCommand=sh", "-"])
def test_a_host_name_that_starts_with_a_dash_is_refused_from_every_source(
    name: str, tmp_path
) -> None:
    """ssh (and other tools) would read such a name as an option: `-Jjump.example` would
    become a jump host, `-Esome.log` would make ssh write that file."""
    with pytest.raises(UsageError, match=f"-H: host name '{name}:2' starts with '-'"):
        parse_host_list(f"good:1,{name}:2")
    path = tmp_path / "hosts"
    path.write_text(f"good:1\n{name} slots=2\n")
    with pytest.raises(UsageError, match=f"hostfile {path} line 2: host name .* starts with"):
        read_hostfile(str(path))
