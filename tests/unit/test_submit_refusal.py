"""A submit no card here could ever serve is refused from the cards' hardware classes,
which the head counts without building a view of every card: the same classes, the same
sentence, as the views give.

The head is the real ``Engine`` over a real store file (``inprocess``), two nodes of two
A100s (80 GB) each.
"""

from __future__ import annotations

import getpass

import pytest


from nebula_tui.head.scheduling import pending_job
from nebula_tui.model import Job, JobSpec, UnfitRequest
from nebula_tui.scheduler import admission

ME = getpass.getuser()


def test_the_heads_count_of_hardware_classes_is_the_views_count(engine):
    counted = engine.state.hardware()
    assert counted == admission.node_hardware(engine.state.gpu_views())
    assert list(counted) == ["node01", "node02"] and sum(counted["node01"].values()) == 2


async def test_a_submit_too_big_for_every_card_is_refused_as_the_views_would_refuse_it(engine):
    spec = JobSpec(command=("true",), gpu_mem_mb=100 * 1024)
    expected = admission.refusal(pending_job(Job(id=0, user=ME, spec=spec, submitted_at=0.0)),
                                 engine.state.gpu_views(), engine.state.settings.config)
    assert expected and "80" in expected
    with pytest.raises(UnfitRequest) as refused:
        await engine.submit_on_disk(ME, spec)
    assert str(refused.value) == expected
    job = await engine.submit_on_disk(ME, JobSpec(command=("true",), gpu_mem_mb=40 * 1024))
    assert job.id in engine.jobs


async def test_a_node_choice_naming_no_node_here_or_leaving_none_is_refused(engine):
    for spec, says in ((JobSpec(command=("true",), nodelist=("node01", "node99")), "node99 is no node"),
                       (JobSpec(command=("true",), exclude=("gpu7",)), "-x/--exclude: gpu7 is no node"),
                       (JobSpec(command=("true",), nodelist=("node01",), exclude=("node01",)),
                        "-w/-x leave no node with GPUs")):
        with pytest.raises(UnfitRequest, match=says):
            await engine.submit_on_disk(ME, spec)
    job = await engine.submit_on_disk(ME, JobSpec(command=("true",), gpu_mem_mb=1024, exclude=("node01",)))
    assert engine.jobs[job.id].spec.exclude == ("node01",)
