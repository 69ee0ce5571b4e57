"""Questions the TUI asks before it does something that cannot be undone.

``ChoiceScreen`` is a modal with a question, what it concerns (the job's name, owner and
run time; the node's running jobs) and a few answers, each a key and a button. Esc, or
the safe answer, which has the focus, does nothing: Enter pressed by habit never cancels a
job.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class Choice(NamedTuple):
    """One answer: the letter that picks it, its words, what the dialog returns for it, and
    whether it is the destructive one (drawn in the error colour)."""

    key: str
    label: str
    value: Any
    danger: bool = False


class ChoiceScreen(ModalScreen[Any]):
    """A question and its answers; returns the chosen answer's value (None for esc)."""

    BINDINGS = [("escape", "answer_none", "Do nothing")]

    def __init__(self, title: str, body: Text | str, choices: tuple[Choice, ...],
                 safe: int = -1) -> None:
        """``safe``: the index of the answer that has the focus at first (the harmless one)."""
        super().__init__()
        self.title_text = title
        self.body = body
        self.choices = choices
        self.safe = safe % len(choices)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.title_text, style="bold"), id="dialog-title")
            yield Static(self.body, id="dialog-body")
            with Horizontal(id="dialog-buttons"):
                for n, choice in enumerate(self.choices):
                    yield Button(Text(f"{choice.label} ({choice.key})"), id=f"choice-{n}",
                                 variant="error" if choice.danger else "default")
            yield Static("esc: do nothing", id="dialog-hint")

    def on_mount(self) -> None:
        self.query_one(f"#choice-{self.safe}", Button).focus()

    def on_key(self, event: events.Key) -> None:
        for choice in self.choices:
            if event.character == choice.key:
                event.stop()
                self.dismiss(choice.value)
                return

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self.choices[int((event.button.id or "choice-0").removeprefix("choice-"))].value)

    def action_answer_none(self) -> None:
        self.dismiss(None)


def confirm(title: str, body: Text | str, yes: str, no: str = "Keep it") -> ChoiceScreen:
    """A yes/no question whose "no" has the focus; returns True for yes, None otherwise."""
    return ChoiceScreen(title, body, (Choice("y", yes, True, danger=True), Choice("n", no, None)))
