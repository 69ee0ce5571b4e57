"""``:`` commands are carried out as their specs say (``commandline.COMMANDS``), on the real
app reading a fixed head over its socket: a screen, a page, a filter, and a node the cluster
does not have, which is said instead of done; an action the head cannot do, said."""

from __future__ import annotations

import pytest
from support.tui import until
from support.fixedhead import FixedHead

from nebula_tui.screens import commandline
from nebula_tui.screens.app import make_app
from nebula_tui.screens.gpus import GpuDetailScreen, GpusScreen
from nebula_tui.screens.job import JobScreen
from nebula_tui.screens.users import UsersScreen


@pytest.fixture
def fixed_head(tmp_path):
    head = FixedHead(tmp_path / "fixed.sock").start()
    yield head
    head.stop()


def test_every_command_has_its_way_of_being_carried_out():
    assert list(commandline.BY_NAME) == [spec.name for spec in commandline.COMMANDS]
    assert all(callable(spec.run) for spec in commandline.COMMANDS)


async def test_commands_run_from_their_specs(fixed_head):
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(str(message))  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: len(app.cluster.gpus) == 9 and app.user, what="the fixed lab")

        def run(line: str) -> None:
            app.run_command(commandline.parse(line))

        run(":users")
        await until(pilot, lambda: isinstance(app.screen, UsersScreen), what="the users screen")
        run(":job 12")
        await until(pilot, lambda: isinstance(app.screen, JobScreen) and app.screen.job_id == 12,
                    what="job 12's page")
        run(":gpu node02:3")
        await until(pilot, lambda: isinstance(app.screen, GpuDetailScreen), what="the GPU's page")
        run(":node nosuch")
        await until(pilot, lambda: any("no node 'nosuch'" in n for n in notes), what="the refusal")
        run(":gpu nosuch:0")
        await until(pilot, lambda: any("no GPU 'nosuch:0'" in n for n in notes), what="the GPU refusal")
        run(":node node02")
        await until(pilot, lambda: isinstance(app.screen, GpusScreen), what="the GPUs of node02")
        run(":hold 16")  # the fixed head answers no hold: the action says so, in one line
        await until(pilot, lambda: any("'hold' is not available" in n for n in notes), what="the hold's answer")
