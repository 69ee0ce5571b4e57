"""The ``:`` command line (as in k9s or vim): one line that goes anywhere.

``parse`` turns what was typed into a ``Command`` or raises ``CommandError`` naming what
is wrong and what would work; each command's ``Spec`` says how the app carries it out.
Pure: no widgets, except ``CommandLine``, the modal that reads the line (with completion
from the cluster's job ids, node and GPU names and users).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Input, Static


class Spec(NamedTuple):
    """One command: its name, what it takes (for the help), what it does, and how the app
    carries it out (``run(app, args)``, with the arguments ``parse`` checked)."""

    name: str
    args: str
    description: str
    run: Callable[[Any, tuple[str, ...]], object]


def _show(mode: str) -> Callable[[Any, tuple[str, ...]], object]:
    return lambda app, a: app.show(mode)


def _on_node(then: Callable[[Any, tuple[str, ...]], object]) -> Callable[[Any, tuple[str, ...]], object]:
    """``then`` for a node the cluster has (the app says the nodes it has otherwise)."""
    return lambda app, a: app.known_node(a[0]) and then(app, a)


def _gpu(app: Any, a: tuple[str, ...]) -> None:
    uuid = app.find_gpu(a[0])
    if uuid:
        app.open_gpu(uuid)


#: Every command, in the order the help lists them. Any unique prefix works (``:j 7``).
COMMANDS: tuple[Spec, ...] = (
    Spec("job", "ID", "open a job (running, waiting or ended)", lambda app, a: app.open_job(int(a[0]))),
    Spec("gpu", "NODE:INDEX", "open a GPU, e.g. :gpu node02:1", _gpu),
    Spec("user", "NAME", "a user's share and jobs",
         lambda app, a: app.on_mode("users", lambda screen: screen.select_user(a[0]))),
    Spec("node", "NODE", "a node's GPUs",
         _on_node(lambda app, a: app.on_mode("gpus", lambda screen: screen.filter_to(f"{a[0]}:")))),
    Spec("cancel", "ID", "cancel a job (asks first)", lambda app, a: app.ask_cancel(int(a[0]))),
    Spec("hold", "ID", "hold a waiting job", lambda app, a: app.job_action("hold", int(a[0]))),
    Spec("release", "ID", "release a held job", lambda app, a: app.job_action("release", int(a[0]))),
    Spec("drain", "NODE [REASON]", "no new jobs on a node (asks first)",
         _on_node(lambda app, a: app.ask_drain(a[0], a[1] if len(a) > 1 else None))),
    Spec("resume", "NODE", "a drained node takes jobs again",
         _on_node(lambda app, a: app.node_action("resume", a[0]))),
    Spec("remove", "NODE", "remove a node from the cluster (asks first)",
         _on_node(lambda app, a: app.ask_remove(a[0]))),
    Spec("overview", "", "the overview", _show("overview")),
    Spec("gpus", "", "every GPU", _show("gpus")),
    Spec("queue", "", "running and waiting jobs", _show("queue")),
    Spec("history", "", "every job, ended ones too",
         lambda app, a: app.on_mode("queue", lambda screen: screen.show_all(True))),
    Spec("users", "", "users and fair share", _show("users")),
    Spec("nodes", "", "nodes and the events log", _show("nodes")),
    Spec("submit", "", "the submit form", lambda app, a: app.action_submit_form()),
    Spec("help", "", "the keys of this screen", lambda app, a: app.action_help()),
    Spec("quit", "", "leave the TUI", lambda app, a: app.call_later(app.action_quit)),
)
#: each command's spec by its name
BY_NAME = {spec.name: spec for spec in COMMANDS}

ALIASES = {"q": "quit", "j": "job", "g": "gpu", "u": "user", "h": "help", "n": "node"}

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_GPU = re.compile(r"^([A-Za-z0-9_.-]{1,64}):(\d{1,3})$|^GPU-[0-9a-fA-F-]{8,64}$")


class Command(NamedTuple):
    name: str
    args: tuple[str, ...]


class CommandError(ValueError):
    """What was typed is not a command; str() says what is wrong and what would work."""


def _spec(word: str) -> Spec:
    word = ALIASES.get(word.lower(), word.lower())
    exact = [s for s in COMMANDS if s.name == word]
    found = exact or [s for s in COMMANDS if s.name.startswith(word)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise CommandError(f"no command '{word}'; try :job 7, :gpu node02:1, :drain node01, "
                           f":user alice (:help lists them)")
    names = ", ".join(f":{s.name}" for s in found)
    raise CommandError(f"':{word}' could be {names}: type more of it")


def parse(text: str) -> Command:
    """``":job 7"`` -> Command("job", ("7",)). The leading ``:`` is optional."""
    words = text.strip().lstrip(":").split()
    if not words:
        raise CommandError("type a command, e.g. :job 7 (esc closes the line)")
    spec = _spec(words[0])
    args = tuple(words[1:])
    usage = f"usage: :{spec.name} {spec.args}".rstrip()
    takes = spec.args.split()
    required = [a for a in takes if not a.startswith("[")]
    if len(args) < len(required) or (len(args) > len(takes) and not spec.args.endswith("]")):
        raise CommandError(usage)
    if "ID" in takes and not (args[0].isdigit() and int(args[0]) > 0):
        raise CommandError(f"'{args[0]}' is not a job id; {usage}")
    if spec.name == "gpu" and not _GPU.match(args[0]):
        raise CommandError(f"'{args[0]}' is not a GPU; give NODE:INDEX (e.g. node02:1) or its UUID")
    if takes and takes[0] in ("NODE", "NAME") and not _NAME.match(args[0]):
        what = "node" if takes[0] == "NODE" else "user"
        raise CommandError(f"'{args[0]}' is not a {what} name; {usage}")
    if spec.name == "drain" and len(args) > 1:
        args = (args[0], " ".join(args[1:]))
    return Command(spec.name, args)


def help_lines() -> list[tuple[str, str]]:
    return [(f":{s.name} {s.args}".rstrip(), s.description) for s in COMMANDS]


def completions(job_ids: Iterable[int], nodes: Iterable[str], gpus: Iterable[str],
                users: Iterable[str]) -> list[str]:
    """Whole command lines the input suggests as one types (the cluster's own names)."""
    lines = [f":{s.name}" + (" " if s.args else "") for s in COMMANDS]
    lines += [f":job {j}" for j in sorted(job_ids, reverse=True)[:200]]
    for node in sorted(nodes):
        lines += [f":drain {node}", f":resume {node}", f":node {node}", f":remove {node}"]
    lines += [f":gpu {g}" for g in sorted(gpus)]
    lines += [f":user {u}" for u in sorted(users)]
    return lines


class CommandLine(ModalScreen["Command | None"]):
    """The line at the bottom: enter runs it (a mistake is said at once, the line stays),
    esc closes it."""

    BINDINGS = [("escape", "close", "Close"), ("tab", "complete", "Complete")]

    def __init__(self, suggestions: list[str]) -> None:
        super().__init__()
        self.suggestions = suggestions

    def compose(self) -> ComposeResult:
        with Vertical(id="command-line"):
            yield Static("", id="command-error")
            yield Input(value=":", id="command-input",
                        suggester=SuggestFromList(self.suggestions, case_sensitive=False))
            yield Static(":job ID · :gpu NODE:INDEX · :user NAME · :drain NODE · :cancel ID · "
                         ":history · :help · tab completes · esc closes", id="command-hint")

    def on_mount(self) -> None:
        box = self.query_one("#command-input", Input)
        box.focus()
        box.cursor_position = len(box.value)

    @on(Input.Submitted, "#command-input")
    def _run(self, event: Input.Submitted) -> None:
        try:
            command = parse(event.value)
        except CommandError as err:
            self.query_one("#command-error", Static).update(str(err))
            return
        self.dismiss(command)

    def action_complete(self) -> None:
        box = self.query_one("#command-input", Input)
        box.cursor_position = len(box.value)
        box.action_cursor_right()  # at the end of the line: takes the suggestion

    def action_close(self) -> None:
        self.dismiss(None)
