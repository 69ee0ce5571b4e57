"""At 80 columns every screen's footer shows each of its keys whole, Quit the last of them
(the job page's cut "q Quit" to "q Q"): the real app reading a fixed head."""

from __future__ import annotations

import pytest
from support.fixedhead import FixedHead
from support.tui import until
from textual.widgets._footer import FooterKey

from nebula_tui.screens import commandline
from nebula_tui.screens.app import make_app
from nebula_tui.screens.gpus import GpuDetailScreen
from nebula_tui.screens.job import JobScreen


@pytest.fixture
def fixed_head(tmp_path):
    head = FixedHead(tmp_path / "fixed.sock").start()
    yield head
    head.stop()


async def test_every_footer_key_fits_at_80_columns(fixed_head):
    app = make_app(fixed_head.socket, cluster_name="gpulab")
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.cluster.gpus) == 9 and app.user, what="the fixed lab")
        pages = [(":overview", None), (":gpus", None), (":queue", None), (":users", None),
                 (":nodes", None), (":job 12", JobScreen), (":gpu node02:3", GpuDetailScreen)]
        for line, kind in pages:
            app.run_command(commandline.parse(line))
            if kind is not None:
                await until(pilot, lambda kind=kind: isinstance(app.screen, kind), what=line)
            await until(pilot, lambda: (keys := list(app.screen.query(FooterKey)))
                        and all(k.region.right for k in keys),
                        what=f"{line}'s footer laid out")
            keys = list(app.screen.query(FooterKey))
            cut = [f"{k.key_display} {k.description}" for k in keys if k.region.right > 80]
            assert not cut, f"{line}: keys past the 80th column: {cut}"
            assert any(k.description == "Quit" for k in keys), (line, [k.description for k in keys])
