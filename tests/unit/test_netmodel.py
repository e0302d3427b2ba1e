"""The ideal alpha-beta model of benchmarks/netmodel.py: each formula on numbers worked by hand."""

from __future__ import annotations

import pytest

from benchmarks.netmodel import (
    ALL_GATHER,
    ALL_REDUCE,
    Collective,
    Compute,
    Link,
    Program,
    charged_step_time,
    collective_time,
    comm_end,
    link_of_namespace,
    step_time,
    wire_bytes,
)

LINK = Link(bandwidth=100.0, latency=0.5)  # 100 bytes/s, 0.5 s per collective


def test_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_message() -> None:
    c = Collective(ALL_REDUCE, 400)
    assert wire_bytes(c, 4) == 600  # 2 * 3/4 * 400
    assert collective_time(c, 4, LINK) == pytest.approx(0.5 + 6.0)
    assert wire_bytes(c, 2) == 400
    # bounded by 2 S however many workers
    assert wire_bytes(c, 1024) < 800 < wire_bytes(Collective(ALL_GATHER, 400), 4)


def test_all_gather_sends_n_minus_1_messages() -> None:
    c = Collective(ALL_GATHER, 100)
    assert wire_bytes(c, 5) == 400
    assert collective_time(c, 5, LINK) == pytest.approx(0.5 + 4.0)


def test_one_worker_communicates_nothing() -> None:
    assert collective_time(Collective(ALL_REDUCE, 10**9), 1, LINK) == 0.0
    assert wire_bytes(Collective(ALL_GATHER, 10**9), 1) == 0.0


def test_unknown_collective_is_an_error() -> None:
    with pytest.raises(ValueError, match="broadcast"):
        collective_time(Collective("broadcast", 1), 2, LINK)


def test_communication_hidden_behind_backward_costs_nothing() -> None:
    compute = Compute(forward=1.0, backward=10.0, optimizer=0.5, ready=(2.0, 10.0))
    small = [[Collective(ALL_REDUCE, 100)], []]  # 0.5 + 1 s, from 2 s on: ends at 3.5 < 10
    assert step_time(compute, small, 2, LINK) == pytest.approx(11.5)
    assert step_time(compute, small, 2, LINK, overlap=False) == pytest.approx(11.5 + 1.5)


def test_buckets_wait_for_their_gradients_and_for_the_link() -> None:
    compute = Compute(forward=1.0, backward=4.0, optimizer=0.5, ready=(1.0, 2.0, 4.0))
    buckets = [[Collective(ALL_REDUCE, 200)],                              # 1 -> 3.5
               [Collective(ALL_GATHER, 100), Collective(ALL_REDUCE, 50)],  # 3.5 -> 5 -> 6
               [Collective(ALL_REDUCE, 100)]]                              # 6 -> 7.5
    assert comm_end(compute, buckets, 2, LINK) == pytest.approx(7.5)
    assert step_time(compute, buckets, 2, LINK) == pytest.approx(1.0 + 7.5 + 0.5)
    # a late bucket starts when ready, not when the link frees up
    late = Compute(forward=1.0, backward=20.0, optimizer=0.5, ready=(1.0, 2.0, 15.0))
    assert comm_end(late, buckets, 2, LINK) == pytest.approx(15.0 + 1.5)


def test_a_bucket_without_collectives_does_not_wait() -> None:
    compute = Compute(forward=0.0, backward=1.0, optimizer=0.0, ready=(0.0, 9.0))
    assert comm_end(compute, [[Collective(ALL_REDUCE, 100)], []], 2, LINK) == pytest.approx(1.5)


def test_messages_and_ready_times_must_match() -> None:
    compute = Compute(forward=0.0, backward=1.0, optimizer=0.0, ready=(0.5,))
    with pytest.raises(ValueError, match="2 buckets"):
        comm_end(compute, [[], []], 2, LINK)


def test_scaled_compute_keeps_the_profile() -> None:
    compute = Compute(forward=1.0, backward=2.0, optimizer=1.0, ready=(1.0, 2.0))
    scaled = compute.scaled(0.4)
    assert scaled.total == pytest.approx(0.4)
    assert scaled.forward == pytest.approx(0.1)
    assert scaled.ready == pytest.approx((0.1, 0.2))


def test_a_shared_qdisc_gives_each_of_n_workers_a_share() -> None:
    link = link_of_namespace(rate=1000.0, n=2, latency=0.1)
    assert link == Link(bandwidth=500.0, latency=0.1)
    # two ranks all-reducing S through one qdisc of rate R move 2 S bytes: 2 S / R seconds
    assert collective_time(Collective(ALL_REDUCE, 300), 2, link) == pytest.approx(0.1 + 0.6)


# ---- the second ideal: compression charged its CPU time -----------------------------------
def free(collectives: list[Collective]) -> Program:
    """A bucket's program with no compression work: start every collective, wait for each."""
    return Program(tuple(("start", i) for i in range(len(collectives)))
                   + tuple(("wait", i) for i in range(len(collectives))))


@pytest.mark.parametrize("ready", [(1.0, 2.0, 4.0), (1.0, 2.0, 15.0), (0.0, 0.0, 0.0)])
def test_free_compression_is_the_first_ideal(ready: tuple[float, ...]) -> None:
    compute = Compute(forward=1.0, backward=max(4.0, ready[-1]), optimizer=0.5, ready=ready)
    buckets = [[Collective(ALL_REDUCE, 200)], [], [Collective(ALL_GATHER, 100),
                                                  Collective(ALL_REDUCE, 50)]]
    assert charged_step_time(compute, buckets, [free(b) for b in buckets], 2, LINK) == \
        pytest.approx(step_time(compute, buckets, 2, LINK))


def test_compression_takes_the_core_from_backward_and_delays_the_buckets() -> None:
    # Worked by hand (module doc): bucket 0 ready at 1 compresses 1 -> 2, all-reduces 2 -> 3.5,
    # decodes 3.5 -> 4; backward has lost 1.5 s by then, so bucket 1 (ready after 4 s of
    # backward) is ready at 5.5, compresses to 6, all-reduces 6 -> 7.5; backward ends at 5.5.
    compute = Compute(forward=1.0, backward=4.0, optimizer=0.5, ready=(1.0, 4.0))
    buckets = [[Collective(ALL_REDUCE, 100)], [Collective(ALL_REDUCE, 100)]]
    programs = [Program((("cpu", 1.0), ("start", 0), ("wait", 0), ("cpu", 0.5))),
                Program((("cpu", 0.5), ("start", 0), ("wait", 0)))]
    assert charged_step_time(compute, buckets, programs, 2, LINK) == pytest.approx(1 + 7.5 + 0.5)
    assert programs[0].cpu == 1.5
    # late buckets: bucket 0 (9 -> 10 -> 11.5 -> 12) costs backward 1 s (it ends at 11);
    # bucket 1, ready at 11, waits for bucket 0's end (12): 12.5, all-reduced by 14
    late = Compute(forward=1.0, backward=10.0, optimizer=0.5, ready=(9.0, 10.0))
    assert charged_step_time(late, buckets, programs, 2, LINK) == pytest.approx(1 + 14 + 0.5)


def test_a_collective_started_early_overlaps_the_work_after_it() -> None:
    # Started first and waited for last (the hook's dense all-reduce): the link carries it
    # while the core compresses.
    compute = Compute(forward=0.0, backward=1.0, optimizer=0.0, ready=(0.0,))
    bucket = [Collective(ALL_REDUCE, 100), Collective(ALL_REDUCE, 100)]  # 1.5 s each
    program = Program((("start", 0), ("cpu", 2.0), ("start", 1), ("wait", 1), ("wait", 0)))
    assert charged_step_time(compute, [bucket], [program], 2, LINK) == pytest.approx(3.5)


def test_bad_programs_are_errors() -> None:
    compute = Compute(forward=0.0, backward=1.0, optimizer=0.0, ready=(0.5,))
    with pytest.raises(ValueError, match="1 buckets of messages, 2 programs"):
        charged_step_time(compute, [[]], [free([]), free([])], 2, LINK)
    with pytest.raises(ValueError, match="'sleep'"):
        charged_step_time(compute, [[]], [Program((("sleep", 1.0),))], 2, LINK)
