"""A free TCP port for a server that may stop and start again on it (a broker, `serve`'s gateway).

Binding port 0 gives a port from the kernel's ephemeral range, the range it also hands to every other
port-0 bind and outgoing connection. While such a server is down, its clients keep reconnecting to its
port; if the kernel gives that port to another process's listener meanwhile, the clients' bytes reach the
wrong server and the restarted server cannot bind. (Seen in the suite: a Kafka client of a broker stopped
by one test sent its ApiVersions request to another test's TCP sink.) A port chosen below the ephemeral
range is never handed out by the kernel, so only a process that names it can take it.
"""

from __future__ import annotations

import random
import socket

LOOPBACK = "127.0.0.1"  # the one address Eventide binds and dials unless told otherwise
LOWEST = 10000  # above the well-known and most registered services' ports
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        with open(_EPHEMERAL_RANGE) as f:
            low, high = (int(p) for p in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = LOOPBACK) -> int:
    """A port free on `host` right now, below the kernel's ephemeral range (see bound_socket)."""
    with bound_socket(host) as s:
        return s.getsockname()[1]


def bound_socket(host: str = LOOPBACK, attempts: int = 200) -> socket.socket:
    """A TCP socket bound on `host` to a port below the kernel's ephemeral range, chosen at random; bound to
    one the kernel picks (port 0) when that range starts at LOWEST or below, or no port tried there is free.
    A listener that keeps it has no window in which another process could take its port."""
    low, _ = ephemeral_range()
    rnd = random.SystemRandom()
    for _ in range(attempts if low > LOWEST else 0):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((host, rnd.randrange(LOWEST, low)))
        except OSError:
            s.close()
            continue
        return s
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((host, 0))
    return s
