"""The submit form: the R4 fields, checked as you type, with a preview of where the job
would go now (the ``plan`` request) before it is submitted.

Workers: ``plan`` (the preview, debounced, newest wins) and ``submit``. On success the form
is replaced by the new job's screen.
"""

from __future__ import annotations

import re
import time

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Button, Checkbox, Input, Label, Static

from ..forecasts import starts_text
from ..api import MAX_GPU_COUNT, ApiError
from ..model import format_mb
from ..units import parse_size_mb
from ..wire import JobWire, PlanView, SubmitReply, SubmitRequest
from .base import ClusterScreen, OpMissing
from .widgets.keys import SUBMIT_KEYS

#: Quiet time after the last keystroke before the preview is asked for (seconds).
PREVIEW_DELAY_S = 0.3

#: The form's fields: (id, label, placeholder).
FIELDS = (
    ("name", "Name", "optional, e.g. bert-finetune"),
    ("gpu_count", "GPU count", "1"),
    ("gpu_mem", "GPU memory", "per GPU, e.g. 8G; empty = a whole card"),
    ("workdir", "Workdir", "absolute path on the node; empty = $HOME"),
    ("command", "Command", "shell command line, e.g. python train.py --epochs 3"),
    ("reservation", "Booking", "optional: a booking of yours (nebula reservations)"),
)
BOOKING_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_field(field: str, value: str) -> str | None:
    """The one-line problem with one field's text, or None when it is fine. The same rules
    as ``nebula submit`` (sizes through ``parse_size_mb``)."""
    value = value.strip()
    if field == "name":
        if len(value) > 128:
            return "at most 128 characters"
    elif field == "gpu_count":
        if value and not (value.isdigit() and 1 <= int(value) <= MAX_GPU_COUNT):
            return f"a whole number from 1 to {MAX_GPU_COUNT}"
    elif field == "gpu_mem":
        if value:
            try:
                parse_size_mb(value)
            except ValueError as err:
                return str(err)
    elif field == "workdir":
        if value and not value.startswith("/"):
            return "must be an absolute path on the node (starts with /)"
    elif field == "command":
        if not value:
            return "required: the command the job runs"
    elif field == "reservation":
        if value and not BOOKING_NAME.match(value):
            return "a booking's name: letters, digits, dots, dashes, underscores"
    return None


def request_fields(values: dict[str, str], preemptible: bool = False) -> SubmitRequest:
    """The form as the fields of a ``submit`` / ``plan`` request (valid values only)."""
    fields: SubmitRequest = {"command": [values["command"].strip()], "shell": True,
                    "gpu_count": int(values["gpu_count"].strip() or 1)}
    if preemptible:
        fields["preemptible"] = True
    if values["name"].strip():
        fields["name"] = values["name"].strip()
    if values["gpu_mem"].strip():
        fields["gpu_mem_mb"] = parse_size_mb(values["gpu_mem"].strip())
    if values["workdir"].strip():
        fields["workdir"] = values["workdir"].strip()
    if values.get("reservation", "").strip():
        fields["reservation"] = values["reservation"].strip()
    return fields


def plan_text(plan: PlanView, preemptible: bool = False) -> Text:
    """The head's ``plan`` in words: "Would start now as preemptible on node03:1 (whole
    card)", "Would start now, preempting job 41 (preemptible)", "Would wait: …"."""
    if plan.get("decision") == "start":
        where = ", ".join(f"{g['node']}:{g['index']} "
                          f"({'whole card' if g.get('exclusive') else format_mb(g['memory_mb'])})"
                          for g in plan.get("gpus", []))
        kind = "as preemptible " if preemptible else ""
        return Text.assemble((f"Would start now {kind}on ", "green"), (where, "bold green"))
    if plan.get("decision") == "preempt":
        ids = plan.get("preempts") or []
        jobs = f"job {ids[0]}" if len(ids) == 1 else "jobs " + ", ".join(map(str, ids))
        return Text.assemble(("Would start now, ", "green"), (f"preempting {jobs} (preemptible)", "bold green"))
    when = starts_text(plan.get("starts"), time.time())
    said = f"Would {when.replace('not within', 'not start within')}" if when.startswith("not") \
        else f"Would start {when}"
    start: list[str | tuple[str, str]] = [(said, "bold yellow"), ". "] if when else []
    reason = plan.get("reason") or "no reason given"
    if reason.startswith("waits "):  # "waits for its booking: …" reads "Would wait for its booking: …"
        return Text.assemble(*start, ("Would wait ", "yellow"), reason.removeprefix("waits "))
    return Text.assemble(*start, ("Would wait: ", "yellow"), reason)


class Submitted(Message):
    """The head accepted the job."""

    def __init__(self, job: JobWire) -> None:
        super().__init__()
        self.job = job


#: The form's frame says so while fields lie below the fold (at 80x24 Preemptible and
#: Submit did, with nothing to tell).
MORE_BELOW = "↓ more below (Tab moves on)"


class FormScroll(VerticalScroll):
    """The form, its frame saying when there is more below."""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self.cue()

    def on_resize(self) -> None:
        self.call_after_refresh(self.cue)

    def cue(self) -> None:
        self.border_subtitle = MORE_BELOW if self.scroll_y < self.max_scroll_y else ""


class SubmitScreen(ClusterScreen):
    SCREEN_TITLE = "Submit"
    KEYS = SUBMIT_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._preview_timer: Timer | None = None

    def compose_body(self) -> ComposeResult:
        with FormScroll(id="submit-form"):
            yield Static("Fill in a command to see where the job would go.", id="preview")
            for ident, label, placeholder in FIELDS:
                with Horizontal(classes="field"):
                    yield Label(label, classes="field-label")
                    yield Input(placeholder=placeholder, id=f"f-{ident}")
                yield Static("", id=f"e-{ident}", classes="field-error")
            with Horizontal(classes="field"):
                yield Label("", classes="field-label")
                # not -p: that is Slurm's partition (--pool) on the command line
                yield Checkbox("Preemptible (--preemptible)", id="f-preemptible")
            # said below the box, wrapped: as its label it was cut even at 120 columns
            yield Static("runs on idle cards now, whatever your fair share; stopped and requeued "
                         "when a normal job needs them", classes="field-hint")
            with Horizontal(id="submit-buttons"):
                yield Button("Submit (ctrl+s)", id="submit", variant="primary")
                yield Button("Back (esc)", id="back")

    def on_mount(self) -> None:
        self.query_one("#submit-form").border_title = "Submit a job"
        self.query_one("#f-name", Input).focus()

    def values(self) -> dict[str, str]:
        return {ident: self.query_one(f"#f-{ident}", Input).value for ident, _, _ in FIELDS}

    def preemptible(self) -> bool:
        return self.query_one("#f-preemptible", Checkbox).value

    def fields(self) -> SubmitRequest:
        """The form as a ``submit`` / ``plan`` request."""
        return request_fields(self.values(), self.preemptible())

    @on(Checkbox.Changed)
    def _kind_changed(self) -> None:
        self._ask_preview()

    def problems(self, show: bool = True) -> dict[str, str]:
        """Each field's problem (shown under it when ``show``); empty when all are fine."""
        found = {}
        for ident, value in self.values().items():
            problem = check_field(ident, value)
            if problem:
                found[ident] = problem
        if show:
            for ident, _, _ in FIELDS:
                self._show_problem(ident, found.get(ident))
        return found

    def _show_problem(self, ident: str, problem: str | None) -> None:
        box = self.query_one(f"#e-{ident}", Static)
        box.update(problem or "")
        box.set_class(bool(problem), "shown")
        self.query_one(f"#f-{ident}", Input).set_class(bool(problem), "invalid")

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        ident = (event.input.id or "").removeprefix("f-")
        problem = check_field(ident, event.value)
        # An empty command is only an error once the user has tried to submit.
        if ident == "command" and not event.value.strip():
            problem = None
        self._show_problem(ident, problem)
        if self._preview_timer is not None:
            self._preview_timer.stop()
        self._preview_timer = self.set_timer(PREVIEW_DELAY_S, self._ask_preview)

    def _ask_preview(self) -> None:
        if self.problems(show=False):
            self.query_one("#preview", Static).update(
                Text("Fill in a command to see where the job would go.", style="dim")
                if list(self.problems(show=False)) == ["command"] else
                Text("Fix the fields above to see where the job would go.", style="dim"))
            return
        self.preview(self.fields())

    @work(exclusive=True, group="plan")
    async def preview(self, fields: SubmitRequest) -> None:
        """The ``plan`` group: where the job would go now; the newest form wins."""
        box = self.query_one("#preview", Static)
        try:
            plan = await self.tui.call("plan", PlanView, **fields)
        except OpMissing:
            box.update(Text("Preview is not available on this service (no 'plan' request).",
                            style="dim"))
            return
        except ApiError as err:
            box.update(Text(f"Would be refused: {err}", style="red"))
            return
        box.update(plan_text(plan, bool(fields.get("preemptible"))))

    @work(exclusive=True, group="submit")
    async def send(self, fields: SubmitRequest) -> None:
        """The ``submit`` group: submit once; the handler opens the job."""
        try:
            reply = await self.tui.call("submit", SubmitReply, **fields)
        except ApiError as err:
            self.notify(str(err), title="Not submitted", severity="error")
            return
        self.post_message(Submitted(reply["job"]))

    @on(Submitted)
    def _submitted(self, message: Submitted) -> None:
        from .job import JobScreen

        self.notify(f"Submitted job {message.job['id']}")
        self.tui.cluster.apply_job(message.job)
        self.app.switch_screen(JobScreen(message.job["id"]))

    def action_submit(self) -> None:
        found = self.problems()
        if found:
            first = next(iter(found))
            self.query_one(f"#f-{first}", Input).focus()
            self.notify(f"{dict((i, l) for i, l, _ in FIELDS)[first]}: {found[first]}",
                        title="Check the form", severity="warning")
            return
        self.send(self.fields())

    @on(Button.Pressed, "#submit")
    def _submit_pressed(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#back")
    def _back_pressed(self) -> None:
        self.tui.action_back()

    def crumb(self) -> str:
        return "Submit a job"

    @on(Input.Submitted)
    def _enter(self, event: Input.Submitted) -> None:
        # Enter moves on to the next field; on the last one it submits.
        if event.input.id == "f-command":
            self.action_submit()
        else:
            self.focus_next()
