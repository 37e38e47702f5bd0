"""Free TCP ports (engine/components/ports.py): drawn below the kernel's ephemeral range, which
`connect()` and `bind(0)` take from; the kernel's own pick only where that cannot be done."""

import socket

import ddpviz.engine.components.ports as ports


def test_ports_come_from_below_the_ephemeral_range_and_bind():
    low, _ = ports.ephemeral_range()
    drawn = {ports.free_port() for _ in range(20)}
    assert all(max(1024, low - ports.POOL_SIZE) <= p < low for p in drawn), (low, drawn)
    assert len(drawn) > 1  # at random, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", drawn.pop()))  # free, as said


def test_a_taken_pool_or_no_room_below_the_range_falls_back_to_the_kernels_pick(monkeypatch):
    low, high = ports.ephemeral_range()
    monkeypatch.setattr(ports, "_bindable", lambda host, port: False)
    assert low <= ports.free_port() <= high  # bind(0): the kernel's ephemeral range
    monkeypatch.undo()
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1500, 60999))  # no 1,000 ports below it
    assert low <= ports.free_port() <= high


def test_the_range_file_is_linuxs_where_there_is_one():
    with open(ports.EPHEMERAL_RANGE_FILE) as fh:
        assert ports.ephemeral_range() == tuple(int(v) for v in fh.read().split())
