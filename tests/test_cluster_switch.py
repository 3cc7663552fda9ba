"""The delaying switch of the emulated network (NOTE [ The delaying switch ]): when each packet is due, which are
dropped and why; hand-computed times on a link of 1 byte per millisecond. No root needed (no device is made)."""

from __future__ import annotations

import pytest

from edgetrain.distributed.tunswitch import Switch, SwitchSpec

ADDRESSES = ["10.9.0.2", "10.9.0.3", "10.9.0.4"]


def _spec(*, loss: float = 0.0, queue_s: float = 1.0) -> SwitchSpec:
    return SwitchSpec(["a", "b", "c"], ADDRESSES, rate_bps=8000.0, delay_s=0.005, loss=loss, seed=7, queue_s=queue_s)


def _packet(target: int, size_bytes: int = 100) -> bytes:
    """An IPv4 packet (only the version and the destination matter to the switch) of ``size_bytes``."""
    header = bytes([0x45]) + bytes(15) + bytes(int(x) for x in ADDRESSES[target].split("."))
    return header + bytes(size_bytes - len(header))


def test_a_packet_crosses_the_up_link_then_the_down_link_then_waits_the_delay() -> None:
    switch = Switch(_spec())
    first, second, other = _packet(1), _packet(1, 200), _packet(1, 50)
    switch.receive(0, first, now_s=0.0)   # up 0 -> 0.1, down 0.1 -> 0.2, due 0.205
    switch.receive(0, second, now_s=0.0)  # waits for the up-link: 0.1 -> 0.3, down 0.3 -> 0.5, due 0.505
    switch.receive(2, other, now_s=0.0)   # its own up-link 0 -> 0.05, waits for node 1's down-link: 0.5 -> 0.55
    assert switch.next_due_s() == pytest.approx(0.205)
    assert switch.due(0.2049) == []
    assert switch.due(0.205 + 1e-9) == [(1, first)]
    assert switch.due(0.5049) == []
    assert switch.due(0.5051) == [(1, second)]
    assert switch.due(0.5551) == [(1, other)]
    assert switch.next_due_s() is None and switch.counts["forwarded"] == 3


def test_a_packet_that_would_queue_longer_than_the_limit_is_dropped() -> None:
    switch = Switch(_spec(queue_s=0.15))
    for _ in range(3):
        switch.receive(0, _packet(1), now_s=0.0)  # the up-link frees at 0.1, then 0.2: the third would wait 0.2 s
    assert switch.counts["queue_full"] == 1
    assert [target for target, _ in switch.due(10.0)] == [1, 1]


def test_cut_drops_both_ways_until_mended_and_unknown_destinations_are_counted() -> None:
    switch = Switch(_spec())
    switch.cut.add(1)
    switch.receive(0, _packet(1), now_s=0.0)
    switch.receive(1, _packet(0), now_s=0.0)
    switch.receive(0, _packet(2), now_s=0.0)
    switch.receive(0, bytes([0x60]) + bytes(60), now_s=0.0)  # IPv6: not switched
    assert (switch.counts["cut"], switch.counts["unknown"]) == (2, 1)
    switch.cut.discard(1)
    switch.receive(0, _packet(1), now_s=1.0)
    assert sorted(target for target, _ in switch.due(10.0)) == [1, 2]


@pytest.mark.parametrize("size_bytes", [1500, 64_500])
def test_loss_is_per_ethernet_frame_and_seeded(size_bytes: int) -> None:
    runs, packet = [], _packet(1, size_bytes)
    for _ in range(2):
        switch = Switch(_spec(loss=0.01, queue_s=1e9))
        for i in range(20_000):
            switch.receive(0, packet, now_s=float(i))
        runs.append(switch.counts["lost"])
    expected = 1 - 0.99 ** (size_bytes // 1500)  # 1% for one frame, 35% for a 43-frame packet
    assert runs[0] == runs[1]  # the same seed drops the same packets
    sigma = (expected * (1 - expected) / 20_000) ** 0.5
    assert abs(runs[0] / 20_000 - expected) < 4 * sigma
