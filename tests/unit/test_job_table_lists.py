"""The job table keeps the lists a scheduling pass reads — the jobs it considers and those
holding cards — up to date by each change, instead of a walk over every job at every pass
(a long queue's replay passes thousands of times over thousands of waiting jobs).

Over random histories of real ``Job`` changes (submits, new waiting reasons, holds and
releases, pools, launches, runs, requeues, ends), what the table keeps must be what a walk
over it finds, in the table's order, and its index (who holds which card, each user's
count) what a table built afresh from the same jobs has: a waiting job's new reason skips
the index, and must leave it right.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nebula_tui.head.state import JobTable
from nebula_tui.model import Job, JobSpec, JobState, Launching, Pending, Placement, Running

USERS = ("ada", "bob")
OPS = ("submit", "reason", "hold", "release", "pool", "user", "launch", "run", "requeue", "end")


def walked(table: JobTable) -> list[Job]:
    return [j for j in table.values() if j.state == JobState.PENDING and not j.held_by and not j.pooled]


def placed(job_id: int, card: int) -> tuple[Placement, ...]:
    return (Placement(f"GPU-{card}", f"node{card % 3}", card, 1000, True),)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 30), st.integers(0, 5)), max_size=80))
def test_the_kept_waiting_and_holding_lists_are_what_a_walk_finds_in_the_tables_order(steps):
    table = JobTable()
    next_id = 1
    for op, pick, card in steps:
        ids = list(table)
        job = table[ids[pick % len(ids)]] if ids else None
        if op == "submit" or job is None:
            table[next_id] = Job(next_id, USERS[pick % 2], JobSpec(command=("true",)), float(next_id))
            next_id += 1
        elif op == "reason" and type(job.status) is Pending:
            table[job.id] = job.with_reason(f"reason {card}")
        elif op == "hold" and type(job.status) is Pending:
            table[job.id] = replace(job, status=Pending("held", held_by=job.user))
        elif op == "release" and type(job.status) is Pending:
            table[job.id] = replace(job, status=Pending())
        elif op == "pool" and type(job.status) is Pending:
            table[job.id] = replace(job, pool="slurm")
        elif op == "user" and type(job.status) is Pending:  # (an admin's move of a waiting job)
            table[job.id] = replace(job, user=USERS[(USERS.index(job.user) + 1) % 2])
        elif op == "launch" and type(job.status) is Pending:
            table[job.id] = replace(job, status=Launching(placed(job.id, card), token="t"))
        elif op == "run" and type(job.status) is Launching:
            table[job.id] = replace(job, status=Running(job.status.placements, 1.0, token="t"))
        elif op == "requeue" and job.state.holds_gpus:
            table[job.id] = replace(job, status=Pending("requeued"), attempt=job.attempt + 1)
        elif op == "end":
            if card % 2:
                table.pop(job.id)
            else:
                del table[job.id]
        kept = table.waiting()
        assert list(kept) == [j.id for j in walked(table)]
        assert all(kept[j.id] is j for j in walked(table))
        assert table.holding_in_order() == [j for j in table.values() if j.state.holds_gpus]
        fresh = JobTable(table.values())
        assert table.holding == fresh.holding
        assert +table.per_user == +fresh.per_user
        for node in ("node0", "node1", "node2"):
            assert table.on(node) == fresh.on(node)


def test_a_new_reason_is_the_same_job_with_that_reason():
    job = Job(7, "ada", JobSpec(command=("true",), gpu_count=2), 5.0, Pending("before", held_by=None),
              attempt=2, pool=None, preemptions=1)
    assert job.with_reason("after") == replace(job, status=replace(job.status, reason="after"))
    assert job.with_reason("after").state == JobState.PENDING and job.reason == "before"
