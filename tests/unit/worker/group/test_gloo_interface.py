"""Which interface Gloo binds when the user names none (elastic/worker/group/gloo_interface.py).

Real interfaces of this machine, no mocks: loopback always, another IPv4 interface where the
machine has one. The multi-host bed (tests/multihost/test_smoke_job.py) shows the effect: ranks
in different network namespaces connect.
"""

from __future__ import annotations

import socket

import pytest

from elastic.worker.group.gloo_interface import (
    GLOO_SOCKET_IFNAME,
    choose_gloo_interface,
    interface_with,
    primary_ipv4_address,
    source_address,
)


def _other_ipv4_interface() -> tuple[str, str]:
    """A non-loopback interface of this machine with an IPv4 address, and that address."""
    for _, name in socket.if_nameindex():
        if name != "lo" and (address := primary_ipv4_address(name)):
            return name, address
    pytest.skip("this machine has no IPv4 interface besides loopback")


def test_a_driver_on_loopback_makes_gloo_bind_lo() -> None:
    environ: dict[str, str] = {}
    assert choose_gloo_interface("127.0.0.1", environ) == "lo"
    assert environ == {GLOO_SOCKET_IFNAME: "lo"}


def test_an_address_routed_through_loopback_is_reached_from_lo() -> None:
    # 127.0.0.2 is no interface's address; the route's source is 127.0.0.1, on lo
    assert source_address("127.0.0.2") == "127.0.0.1"
    assert choose_gloo_interface("127.0.0.2", {}) == "lo"


def test_a_driver_on_another_interface_makes_gloo_bind_it() -> None:
    name, address = _other_ipv4_interface()
    environ: dict[str, str] = {}
    assert choose_gloo_interface(address, environ) == name
    assert environ[GLOO_SOCKET_IFNAME] == name


def test_the_users_choice_wins() -> None:
    environ = {GLOO_SOCKET_IFNAME: "eth7"}
    assert choose_gloo_interface("127.0.0.1", environ) == "eth7"
    assert environ == {GLOO_SOCKET_IFNAME: "eth7"}


def test_an_empty_choice_is_no_choice() -> None:
    environ = {GLOO_SOCKET_IFNAME: ""}
    assert choose_gloo_interface("127.0.0.1", environ) == "lo"


def test_a_driver_that_does_not_resolve_sets_nothing() -> None:
    environ: dict[str, str] = {}
    assert choose_gloo_interface("no-such-host.invalid", environ) is None
    assert environ == {}


def test_interface_with_finds_loopback_and_nothing_for_a_foreign_address() -> None:
    assert interface_with("127.0.0.1") == "lo"
    assert interface_with("198.51.100.77") is None  # TEST-NET-2: no interface holds it


def test_interface_with_finds_ipv6_loopback_where_there_is_one() -> None:
    if not socket.has_ipv6 or source_address("::1") != "::1":
        pytest.skip("no IPv6 loopback on this machine")
    assert interface_with("::1") == "lo"
