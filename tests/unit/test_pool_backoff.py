"""A pool login refused is not tried again at once: the head believes the refusal 60 s,
doubled at each refusal in a row, up to an hour (a login node's fail2ban counts failed
logins). Driven by the time the head passes in (its clock), never by sleeping."""

from __future__ import annotations

from nebula_tui.head.pool_books import REFUSAL_MAX_S, REFUSAL_TTL_S, PoolView


def test_a_refused_login_backs_off_60_s_doubling_to_an_hour():
    view, now, waits = PoolView(), 1_000_000.0, []
    for _ in range(9):
        view.refuse("alice", now)
        wait = view.refused["alice"][0] - now
        assert view.refusing("alice", now + wait - 1)
        assert not view.refusing("alice", now + wait)
        waits.append(wait)
        now += wait  # tried again once the wait is over, and refused again
    assert REFUSAL_TTL_S == 60 and REFUSAL_MAX_S == 3600
    assert waits == [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]


def test_one_accounts_refusals_do_not_hold_back_another():
    view = PoolView()
    for t in (0.0, 60.0, 180.0):
        view.refuse("alice", t)
    assert view.refusing("alice", 181.0)
    assert not view.refusing("bob", 181.0)
    view.refuse("bob", 181.0)
    assert view.refused["bob"][0] == 181.0 + 60


def test_a_login_that_works_again_starts_the_backoff_afresh():
    """``Pools.admit`` forgets an account's refusals when its login works (pops the entry):
    the next refusal waits 60 s again, not the hour it had reached."""
    view = PoolView()
    for i in range(8):
        view.refuse("alice", i * 4000.0)
    view.refused.pop("alice", None)
    view.refuse("alice", 50_000.0)
    assert view.refused["alice"] == (50_000.0 + 60, 1)
