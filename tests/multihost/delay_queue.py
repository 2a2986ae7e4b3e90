"""Delay and lose a host's outgoing packets: a pure-Python NFQUEUE consumer.

`python delay_queue.py QUEUE DELAY_MS LOSS_PCT` binds netfilter queue QUEUE of the network
namespace it runs in, prints "ready", and from then on holds every packet the kernel queues
there for DELAY_MS milliseconds before it accepts it, dropping LOSS_PCT percent of them at
random instead: what `tc qdisc add dev IF root netem delay D loss L` does to a host's egress.
The bed (tests/multihost/bed.py) queues a host's outgoing packets to it with an iptables rule
(`-t mangle -A OUTPUT -o IF -j NFQUEUE --queue-bypass`), because this kernel has no
`sch_netem` and nft has no `queue` statement. Packets leave in the order they came.

A verdict arrives after the sender's send() returned, so a dropped packet is lost silently, as
on a wire: no EPERM for the sender. SIGTERM accepts every packet still held, then exits
(packets held by a consumer that dies without a verdict are dropped by the kernel). Only the
standard library: the message layouts are those of linux/netfilter/nfnetlink_queue.h.
"""

from __future__ import annotations

import collections
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = NFNL_SUBSYS_QUEUE << 8 | 0
NFQNL_MSG_VERDICT = NFNL_SUBSYS_QUEUE << 8 | 1
NFQNL_MSG_CONFIG = NFNL_SUBSYS_QUEUE << 8 | 2
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1  # the packet's id and metadata, not its bytes
NF_DROP = 0
NF_ACCEPT = 1
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
QUEUE_LENGTH = 10000  # packets held at once; more are dropped by the kernel (netem: 1000)
RECEIVE_BUFFER = 8 << 20

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_NLATTR = struct.Struct("=HH")  # length, type


def _attribute(kind: int, payload: bytes) -> bytes:
    padding = b"\0" * (-len(payload) % 4)
    return _NLATTR.pack(_NLATTR.size + len(payload), kind) + payload + padding


def _message(kind: int, flags: int, queue: int, attributes: bytes, sequence: int = 0) -> bytes:
    # nfgenmsg: family AF_UNSPEC, version 0, the queue number big-endian
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack(">H", queue) + attributes
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, sequence, 0) + body


def _request(sock: socket.socket, queue: int, attributes: bytes, sequence: int) -> None:
    """Send a config message and raise OSError if the kernel's acknowledgement is an error."""
    sock.send(_message(NFQNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, queue, attributes, sequence))
    while True:
        reply = sock.recv(65536)
        for kind, body in _messages(reply):
            if kind == NLMSG_ERROR:
                (error,) = struct.unpack_from("=i", body)
                if error:
                    raise OSError(-error, f"nfnetlink_queue config: {error}")
                return


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """The (type, body) of each netlink message in one datagram."""
    found, offset = [], 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        found.append((kind, data[offset + _NLMSGHDR.size : offset + length]))
        offset += (length + 3) & ~3
    return found


def _packet_id(body: bytes) -> int | None:
    """The packet id in an NFQNL_MSG_PACKET body (nfgenmsg, then attributes)."""
    offset = 4
    while offset + _NLATTR.size <= len(body):
        length, kind = _NLATTR.unpack_from(body, offset)
        if length < _NLATTR.size:
            return None
        if kind & 0x3FFF == NFQA_PACKET_HDR:
            return struct.unpack_from(">I", body, offset + _NLATTR.size)[0]
        offset += (length + 3) & ~3
    return None


def bind(queue: int) -> socket.socket:
    """A netlink socket bound to netfilter queue `queue`, copying metadata only."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, RECEIVE_BUFFER)  # SO_RCVBUFFORCE (root)
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
    sock.bind((0, 0))
    config = (
        (NFQA_CFG_CMD, struct.pack(">BBH", NFQNL_CFG_CMD_BIND, 0, 0)),  # command, pad, family
        (NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)),  # copy range, copy mode
        (NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", QUEUE_LENGTH)),
    )
    for sequence, (kind, payload) in enumerate(config, start=1):
        _request(sock, queue, _attribute(kind, payload), sequence)
    return sock


def _verdict(sock: socket.socket, queue: int, packet_id: int, verdict: int) -> None:
    header = _attribute(NFQA_VERDICT_HDR, struct.pack(">II", verdict, packet_id))
    sock.send(_message(NFQNL_MSG_VERDICT, NLM_F_REQUEST, queue, header))


def serve(sock: socket.socket, queue: int, delay: float, loss: float, stop: socket.socket) -> None:
    """Hold each queued packet `delay` seconds, then accept it, or drop it with probability
    `loss`; once `stop` is readable, accept every packet still held and return."""
    held: collections.deque[tuple[float, int, int]] = collections.deque()  # due, id, verdict
    chance = random.Random()
    while True:
        wait = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable = select.select([sock, stop], [], [], wait)[0]
        if stop in readable:
            break
        if readable:
            arrived = time.monotonic()
            for kind, body in _messages(sock.recv(1 << 20)):
                packet_id = _packet_id(body) if kind == NFQNL_MSG_PACKET else None
                if packet_id is not None:
                    verdict = NF_DROP if chance.random() < loss else NF_ACCEPT
                    held.append((arrived + delay, packet_id, verdict))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet_id, verdict = held.popleft()
            _verdict(sock, queue, packet_id, verdict)
    for _, packet_id, _ in held:
        _verdict(sock, queue, packet_id, NF_ACCEPT)


def main(argv: list[str]) -> None:
    queue, delay_ms, loss_pct = int(argv[0]), float(argv[1]), float(argv[2])
    stop, wake = socket.socketpair()
    wake.setblocking(False)
    signal.set_wakeup_fd(wake.fileno())  # SIGTERM makes `stop` readable
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    sock = bind(queue)
    print("ready", flush=True)
    serve(sock, queue, delay_ms / 1000.0, loss_pct / 100.0, stop)


if __name__ == "__main__":
    main(sys.argv[1:])
