"""nebula node add / remove (R21): the host-key trust step, nodes.yaml edited in place,
the running service picking the change up."""

from __future__ import annotations

import asyncssh
import pytest

from support.labfixtures import fingerprint
from support.tui import until
from labkit.harness import wait_for


def test_adding_a_node_needs_its_fingerprint_then_it_comes_up(small_cluster, openssh_lab):
    head, port = small_cluster, openssh_lab.port("node03")
    before, known_before = head.path.read_text(), head.known.read_text()

    wrong = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port), "--trust", "SHA256:nope")
    assert wrong.returncode == 1 and "not trusted" in wrong.stderr and wrong.stderr.count("\n") == 1
    no_tty = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port), stdin=None)
    assert no_tty.returncode == 1 and "--trust" in no_tty.stderr
    assert head.path.read_text() == before and head.known.read_text() == known_before

    good = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port),
                    "--trust", fingerprint(openssh_lab, "node03"), check=True)
    assert "Added node03" in good.stdout and fingerprint(openssh_lab, "node03") in good.stdout
    assert head.path.read_text().startswith("# our lab\n")  # comments kept
    wait_for(lambda: any(n["name"] == "node03" and n["state"] == "up" for n in head.call("status")["nodes"]),
             30, what="node03 up")
    wait_for(lambda: sum(g["node"] == "node03" for g in head.call("gpus")["gpus"]) == 2, 15,
             what="node03's two GPUs")

    removed = head.run("node", "remove", "node03", check=True)
    assert "Removed node03" in removed.stdout
    assert all(n["name"] != "node03" for n in head.call("status")["nodes"])
    assert all(g["node"] != "node03" for g in head.call("gpus")["gpus"])
    assert "node03" not in head.path.read_text()


def test_a_known_host_with_another_key_is_never_retrusted(small_cluster, openssh_lab):
    head, port = small_cluster, openssh_lab.port("node03")
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    with open(head.known, "a") as f:
        f.write(f"[127.0.0.1]:{port} {impostor[0]} {impostor[1]}\n")
    done = head.run("node", "add", "node03", "127.0.0.1", "--port", str(port),
                    "--trust", fingerprint(openssh_lab, "node03"))
    assert done.returncode == 1 and "ssh-keygen -R" in done.stderr
    assert "node03" not in head.path.read_text()


@pytest.mark.slow
async def test_the_tui_adds_a_node_after_showing_its_fingerprint(small_cluster, openssh_lab):
    import asyncio

    from textual.widgets import Static

    from nebula_tui.screens.app import make_app
    from nebula_tui.screens.nodes import AddNodePrompt, NodesScreen

    head, port = small_cluster, openssh_lab.port("node03")

    app = make_app(head.socket)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="the nodes screen")
        await pilot.press("a")
        await until(pilot, lambda: isinstance(app.screen, AddNodePrompt), what="the add prompt")
        await pilot.press(*"node03", "enter", *"127.0.0.1", "enter", *str(port), "enter")
        shown = lambda: str(app.screen.query_one("#add-fingerprint", Static).render())  # noqa: E731
        await until(pilot, lambda: fingerprint(openssh_lab, "node03") in shown(), what="the fingerprint")
        assert "node03" not in head.path.read_text()  # nothing is trusted before the second Enter
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen), what="the prompt closed")
        await asyncio.sleep(0)
    assert "node03" in head.path.read_text()
    wait_for(lambda: any(n["name"] == "node03" for n in head.call("status")["nodes"]), 10, what="node03")
