"""Bookings keep their cards for their users through their window, let a job whose --time
ends before it backfill, and stop preemptible jobs at its start — snapshot in, decisions
out. The head's side (``nebula reserve``, restarts, the lab) is tests/lab/test_bookings_lab.py's.
"""

from __future__ import annotations

import getpass
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_tui.model import Placement
from nebula_tui.scheduler import Booking, Fail, Preempt, RunningJob, Start, Wait

from support.inprocess import up_engine
from nebula_tui.model import InvalidRequest, RequestError, UnfitRequest
from support.scheduling import NOW, card, job, run

HOUR = 3600.0


def booking(name="paper", cards=((("n", 0),)), start=NOW + HOUR, hours=10.0, users=("alice",)) -> Booking:
    uuids = frozenset(f"GPU-{node}-{i}" for node, i in cards)
    when = "from Fri 09:00" if start > NOW else "until Fri 19:00"
    return Booking(name, uuids, start, start + hours * HOUR, frozenset(users), f"n:0 booked for {name} {when}")


def cluster(n=2):
    return [card("n", i) for i in range(n)]


def test_inside_the_window_only_its_users_jobs_take_the_booked_cards():
    active = booking(start=NOW - HOUR, cards=(("n", 0), ("n", 1)))
    got = run(cluster(), [job(1, user="carol"), job(2, user="alice")], bookings=(active,))
    assert got[1] == Wait(1, "n:0 booked for paper until Fri 19:00")
    assert isinstance(got[2], Start)


def test_its_users_jobs_take_their_booked_cards_before_the_others():
    active = booking(start=NOW - HOUR, cards=(("n", 1),))
    got = run([card("n", 0), card("n", 1, util=90.0)], [job(1, user="alice")], bookings=(active,))
    assert [p.gpu_index for p in got[1].placements] == [1]


def test_before_the_window_only_a_job_that_ends_before_it_backfills():
    soon = booking(cards=(("n", 0),))
    queue = [job(1, time_limit_s=1800.0), job(2, time_limit_s=2 * HOUR), job(3)]
    got = run(cluster(1), queue, bookings=(soon,))
    assert isinstance(got[1], Start)
    got = run(cluster(1), queue[1:], bookings=(soon,))
    said = "n:0 booked for paper from Fri 09:00 (a job whose --time ends before then may use them now)"
    assert got[2] == Wait(2, said) and got[3] == Wait(3, said)


def test_a_preemptible_job_uses_booked_cards_until_the_window_and_is_stopped_then():
    soon = booking(cards=(("n", 0),))
    got = run(cluster(1), [job(1, user="carol", preemptible=True)], bookings=(soon,))
    assert isinstance(got[1], Start)
    begun = booking(start=NOW - 1, cards=(("n", 0),))
    held = (7, Placement("GPU-n-0", "n", 0, 24564, True))
    running = (RunningJob(7, "carol", (held[1],), NOW - HOUR, preemptible=True),
               RunningJob(8, "alice", (held[1],), NOW - HOUR, preemptible=True))
    got = run([card("n", 0, placements=[held, (8, held[1])])], [], running=running, bookings=(begun,))
    assert got[7] == Preempt(7, None, "paper") and got[7].reason == "preempted: booking paper begins on its cards"
    assert 8 not in got  # a job of its own users stays


def test_a_job_that_names_its_booking_waits_for_it_and_runs_on_its_cards_only():
    soon = booking(cards=(("n", 1),))
    got = run(cluster(), [job(1, user="alice", reservation="paper")], bookings=(soon,))
    assert got[1] == Wait(1, "waits for its booking: n:0 booked for paper from Fri 09:00")
    begun = booking(start=NOW - 1, cards=(("n", 1),))
    got = run(cluster(), [job(1, user="alice", reservation="paper")], bookings=(begun,))
    assert [p.gpu_index for p in got[1].placements] == [1]
    got = run(cluster(), [job(1, user="alice", reservation="gone")], bookings=(begun,))
    assert isinstance(got[1], Fail) and "booking gone has ended or was deleted" in got[1].reason


def test_a_booking_past_its_end_holds_nothing():
    over = booking(start=NOW - 20 * HOUR, hours=10.0, cards=(("n", 0),))
    assert isinstance(run(cluster(1), [job(1, user="carol")], bookings=(over,))[1], Start)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32))
def test_no_job_ever_starts_on_cards_a_booking_keeps_from_it(seed):
    rng = random.Random(seed)
    gpus = [card(f"n{n}", i) for n in range(2) for i in range(rng.randint(1, 4))]
    uuids = [g.uuid for g in gpus]
    bookings = []
    for b in range(rng.randint(1, 3)):
        start = NOW + rng.choice([-2 * HOUR, -60.0, 600.0, 2 * HOUR])
        cards = frozenset(rng.sample(uuids, rng.randint(1, len(uuids))))
        bookings.append(Booking(f"b{b}", cards, start, start + rng.choice([HOUR, 5 * HOUR]),
                                frozenset(rng.sample("abc", rng.randint(1, 2))), f"booked for b{b}"))
    queue = [job(j, count=rng.randint(1, 2), user=rng.choice("abcd"), preemptible=rng.random() < 0.3,
                 time_limit_s=rng.choice([None, 300.0, 3 * HOUR]),
                 reservation=rng.choice([None, None, None, "b0"]))
             for j in range(1, rng.randint(2, 8))]
    got = run(gpus, queue, bookings=tuple(bookings))
    by_id = {j.id: j for j in queue}
    for decision in got.values():
        if not isinstance(decision, Start):
            continue
        j = by_id[decision.job_id]
        for p in decision.placements:
            for b in bookings:
                if p.gpu_uuid not in b.uuids or b.end <= NOW:
                    continue
                if b.start <= NOW:
                    assert j.user in b.users or j.reservation == b.name, (j, b)
                else:
                    assert j.preemptible or (j.time_limit_s is not None and NOW + j.time_limit_s <= b.start), (j, b)
            if j.reservation is not None:
                named = next(b for b in bookings if b.name == j.reservation)
                assert p.gpu_uuid in named.uuids and named.start <= NOW


# ------------------------------------------------------------------ who may book (a real head)
async def test_who_may_book_and_what_a_booking_refuses(tmp_path):
    head = up_engine(tmp_path, "limits:\n  booking_gpu_hours: 20\n")
    admin = getpass.getuser()  # the service's own account
    try:
        now = head.clock()
        ask = {"gpus": "node01:0-1", "start": now + HOUR, "duration_s": 8 * HOUR, "users": ["carol"],
               "name": "first"}
        made = head.bookings.create("carol", ask)  # 16 GPU-hours of her 20
        assert made["booking"]["gpus"] == "node01:0-1" and made["booking"]["gpu_hours"] == 16
        with pytest.raises(RequestError, match="carol may book 20 GPU-hours a month .* booked 16 this "
                                               "month; this one is 8"):
            head.bookings.create("carol", {**ask, "gpus": "node02:0", "name": "second"})
        for gpus, words, never in (("node01:1", "node01:1 is booked for first in that window", False),
                                   ("node09:0", "there is no GPU node09:0", True),
                                   ("node01:x", "'x' is not a GPU index or range", True)):
            with pytest.raises(RequestError, match=words) as refused:
                head.bookings.create(admin, {**ask, "gpus": gpus, "name": "third"})
            # a request no state of the cluster makes valid is the client's exit 2
            assert isinstance(refused.value, InvalidRequest) is never, gpus
        with pytest.raises(UnfitRequest, match=r"no node here has 3 GPUs \(the most on one node is 2\)"):
            head.bookings.create(admin, {**ask, "gpus": None, "gpu_count": 3, "name": "third"})
        with pytest.raises(RequestError, match="a booking named first exists already"):
            head.bookings.create(admin, {**ask, "gpus": "node02:0", "name": "first"})
        with pytest.raises(RequestError, match="booking first is carol's"):
            head.bookings.delete("dave", "first")
        head.bookings.delete("carol", "first")
        counted = head.bookings.create(admin, {"gpu_count": 2, "gpu_mem_mb": 80 * 1024, "start": now,
                                               "duration_s": HOUR, "name": "counted"})
        assert counted["booking"]["gpus"] == "node01:0-1" and counted["booking"]["active"]
        assert [b.name for b in head.bookings.for_pass(now + 1)] == ["counted"]
    finally:
        await head.stop()
        head.state.store.close()
    other = up_engine(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path)
    try:
        with pytest.raises(RequestError, match=r"only admins \(.*\) may book cards here"):
            other.bookings.create("carol", {"gpus": "node01:0", "start": other.clock(), "duration_s": HOUR})
    finally:
        await other.stop()
        other.state.store.close()


async def test_a_reused_booking_name_does_not_give_back_the_month_allowance(tmp_path):
    """The allowance counts what each user booked this month, not the rows by name: ending a
    booking and booking again under its name still counts the first (issue 41)."""
    head = up_engine(tmp_path, "limits:\n  booking_gpu_hours: 20\n")
    try:
        now = head.clock()
        ask = {"gpus": "node01:0-1", "start": now + HOUR, "duration_s": 8 * HOUR, "users": ["carol"],
               "name": "mine"}
        head.bookings.create("carol", ask)  # 16 of her 20
        head.bookings.delete("carol", "mine")
        with pytest.raises(RequestError, match="carol may book 20 GPU-hours a month .* booked 16 this month"):
            head.bookings.create("carol", ask)
        head.bookings.create("carol", {**ask, "gpus": "node01:0", "duration_s": 4 * HOUR})  # 16 + 4
        head.bookings.delete("carol", "mine")
        with pytest.raises(RequestError, match="booked 20 this month; this one is 1"):
            head.bookings.create("carol", {**ask, "gpus": "node02:0", "duration_s": HOUR})
    finally:
        await head.stop()
        head.state.store.close()
