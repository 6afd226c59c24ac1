"""Ports for servers that stop and start again: never one the kernel hands to a port-0 bind."""

import socket

import pytest

from transforms import ports


def test_a_free_port_is_below_the_kernels_ephemeral_range_and_bindable():
    low, high = ports.ephemeral_range()
    assert 1024 <= low <= high
    for _ in range(50):
        port = ports.free_port()
        assert ports.LOWEST <= port < low
        with socket.socket() as s:
            s.bind((ports.LOOPBACK, port))


def test_a_bound_socket_keeps_its_port_below_the_range():
    low, _ = ports.ephemeral_range()
    with ports.bound_socket() as held:
        port = held.getsockname()[1]
        assert ports.LOWEST <= port < low
        with socket.socket() as other, pytest.raises(OSError):
            other.bind((ports.LOOPBACK, port))


def test_a_port_in_use_is_not_given(monkeypatch):
    with socket.socket() as taken, socket.socket() as probe:
        taken.bind((ports.LOOPBACK, 0))
        taken.listen()
        probe.bind((ports.LOOPBACK, 0))
        port, free = taken.getsockname()[1], probe.getsockname()[1]
        probe.close()  # free again
        # The random choice sees the taken port first, then the free one: the free one is given.
        monkeypatch.setattr(ports, "LOWEST", min(port, free))
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (max(port, free) + 1, 65535))
        monkeypatch.setattr(ports.random, "SystemRandom", lambda: _Cycle([port, free]))
        assert ports.free_port() == free


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST, 65535))
    port = ports.free_port()
    with socket.socket() as s:
        s.bind((ports.LOOPBACK, port))


class _Cycle:
    def __init__(self, values):
        self.values = values
        self.i = 0

    def randrange(self, _low, _high):
        self.i += 1
        return self.values[(self.i - 1) % len(self.values)]
