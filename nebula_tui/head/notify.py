"""Notifications: a job's end, failure, time-out or requeue, and a GPU's isolation, told to
the job's owner (jobs submitted with ``--notify``) and to the admins, by webhook and mail.

``notify:`` in nodes.yaml (``settings.NotifySettings``) says where: ``webhooks`` get the
events of ``--notify`` jobs, naming the owner; ``admins.webhooks`` and ``admins.mail``
every job's failure, time-out and requeue and every isolation; the owner of a ``--notify``
job gets mail too. A webhook gets one JSON object — ``{"text": …}``, which Slack,
Mattermost and Matrix's hookshot take as a message, and ``"nebula"`` with the facts for a
script; mail goes through the box's ``sendmail`` (``-t -oi``) where there is one.

Nothing here may slow the head: the rooms only call ``job_ended``/``job_requeued``/
``gpu_isolated``, which put the notice in each destination's queue and return. Each
destination has a worker of its own, so a slow or dead endpoint delays only itself; its
queue is bounded (notices beyond it are dropped with a line in the log).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

from .. import views
from ..model import Job
from ..printable import printable
from ..config.notify import NotifySettings
from ..units import duration_short
from ..waits import within
from .state import HeadState, job_nodes

log = logging.getLogger(__name__)

#: Notices waiting for one destination; more are dropped (a dead endpoint must not grow the head).
QUEUE_LIMIT = 200
#: One webhook request, or one sendmail run, at most this long.
SEND_TIMEOUT_S = 10.0
#: End states the admins hear of (besides requeues and isolations); owners hear of every end.
ADMIN_END_STATES = ("failed", "timeout")


@dataclass(frozen=True)
class Notice:
    """One thing to tell: ``event`` (``job_succeeded``, ``job_failed`` … ``job_requeued``,
    ``gpu_isolated``), a one-line ``text``, a mail ``subject`` and the facts."""

    event: str
    text: str
    subject: str
    facts: dict


class Notifier:
    def __init__(self, state: HeadState):
        self.state = state
        self.settings: NotifySettings = state.config.notify or NotifySettings()
        self._queues: dict[tuple[str, str], asyncio.Queue] = {}  # (kind, where) -> notices
        self._sendmail = _find_sendmail(self.settings.sendmail)

    # ------------------------------------------------------------- what happened
    def job_ended(self, job: Job) -> None:
        state = job.state.value
        code = f" with exit code {job.exit_code}" if job.exit_code not in (None, 0) else ""
        reason = f": {job.reason}" if job.reason and state != "succeeded" else ""
        ran = duration_short(job.ended_at - job.started_at) if job.started_at and job.ended_at else None
        where = f" on {views.gpu_list(views.placed_cards(job))}" if job.placements else ""
        text = (f"job {job.id}{_name(job)} of {job.user} {state}{code}{where}"
                + (f" after {ran}" if ran else "") + reason)
        notice = Notice(f"job_{state}", text, f"job {job.id}{_name(job)} {state}{code}",
                        _facts(job))
        self._route(notice, job, admins=state in ADMIN_END_STATES)

    def job_requeued(self, job: Job, reason: str) -> None:
        why = reason.removeprefix("requeued: ")
        text = f"job {job.id}{_name(job)} of {job.user} was requeued: {why}"
        self._route(Notice("job_requeued", text, f"job {job.id}{_name(job)} requeued",
                           {**_facts(job), "reason": reason}), job, admins=True)

    def gpu_isolated(self, gpu: str, reason: str) -> None:
        live = self.state.gpus.get(gpu)
        label = self.state.label(gpu)
        model = f" ({views.short_model(live.reading.name)})" if live else ""
        text = f"GPU {label}{model} isolated: {reason}"
        self._route(Notice("gpu_isolated", text, f"GPU {label} isolated",
                           {"gpu": gpu, "label": label, "reason": reason}), None, admins=True)

    def booking_broken(self, booking: dict, why: str | None) -> None:
        """A booking can no longer be honoured (or can again): its users and the admins."""
        name = booking["name"]
        text = f"booking {name} can no longer be honoured: {why}" if why else f"booking {name} can be honoured again"
        notice = Notice("booking_broken", text, f"booking {name}", {"booking": name, "reason": why})
        self._route(notice, None, admins=True)
        if self._sendmail is not None:
            domain = self.settings.mail_domain
            for user in booking["users"]:
                self._enqueue(("mail", f"{user}@{domain}" if domain else user), notice)

    # ----------------------------------------------------------------- routing
    def _route(self, notice: Notice, job: Job | None, admins: bool) -> None:
        s = self.settings
        destinations: list[tuple[str, str]] = []
        if job is not None and job.spec.notify:
            destinations += [("webhook", url) for url in s.webhooks]
            destinations.append(("mail", f"{job.user}@{s.mail_domain}" if s.mail_domain else job.user))
        if admins:
            destinations += [("webhook", url) for url in s.admin_webhooks]
            destinations += [("mail", address) for address in s.admin_mail]
        for destination in dict.fromkeys(destinations):  # once each
            if destination[0] == "mail" and self._sendmail is None:
                continue
            self._enqueue(destination, notice)

    def _enqueue(self, destination: tuple[str, str], notice: Notice) -> None:
        queue = self._queues.get(destination)
        if queue is None:
            queue = self._queues[destination] = asyncio.Queue(QUEUE_LIMIT)
            self.state.spawn(self._deliver(destination, queue), f"notify-{destination[0]}")
        try:
            queue.put_nowait(notice)
        except asyncio.QueueFull:
            log.warning("notify: %s %s is not keeping up; dropped: %s", *destination, notice.text)

    async def _deliver(self, destination: tuple[str, str], queue: asyncio.Queue) -> None:
        kind, where = destination
        while True:
            notice = await queue.get()
            try:
                if kind == "webhook":
                    await within(SEND_TIMEOUT_S + 5, asyncio.to_thread(_post, where, notice))
                else:
                    await self._mail(where, notice)
            except Exception as err:  # noqa: BLE001 — one endpoint's failure is its own
                log.warning("notify: %s %s failed: %s", kind, where, _one_line(err))

    async def _mail(self, address: str, notice: Notice) -> None:
        message = EmailMessage()
        message["To"] = address
        if self.settings.mail_from:
            message["From"] = self.settings.mail_from
        # A job's name is its owner's text: a CR or LF there would end the header (email
        # refuses it, and the mail was lost); shown as escapes, it is one line of text.
        message["Subject"] = printable(f"[nebula] {notice.subject}")
        job = notice.facts.get("job")
        more = f"\n\nnebula job {job}\nnebula logs {job}\n" if job is not None else "\n"
        message.set_content(notice.text + more)
        assert self._sendmail is not None  # no mail is queued without one (_enqueue's callers)
        process = await asyncio.create_subprocess_exec(
            *self._sendmail, "-t", "-oi", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            _, err = await within(SEND_TIMEOUT_S, process.communicate(bytes(message)))
        except asyncio.TimeoutError:
            process.kill()
            raise RuntimeError(f"sendmail did not finish within {SEND_TIMEOUT_S:.0f}s") from None
        if process.returncode:
            raise RuntimeError(f"sendmail exited {process.returncode}: {err.decode(errors='replace')}")


def _post(url: str, notice: Notice) -> None:
    body = json.dumps({"text": notice.text, "nebula": {"event": notice.event, **notice.facts}})
    request = urllib.request.Request(url, data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "nebula-notify"})
    with urllib.request.urlopen(request, timeout=SEND_TIMEOUT_S) as reply:
        reply.read(1 << 16)


def _find_sendmail(configured: str | None) -> list[str] | None:
    """The sendmail command: as configured (a command line), else on PATH or in /usr/sbin."""
    if configured:
        return shlex.split(configured)
    found = shutil.which("sendmail") or next(
        (p for p in ("/usr/sbin/sendmail", "/usr/lib/sendmail") if Path(p).exists()), None)
    return [found] if found else None


def _name(job: Job) -> str:
    return f" ({job.spec.name})" if job.spec.name else ""


def _facts(job: Job) -> dict:
    return {"job": job.id, "name": job.spec.name, "user": job.user, "state": job.state.value,
            "exit_code": job.exit_code, "nodes": job_nodes(job)}


def _one_line(err: Exception) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    return " ".join(str(err).split()) or type(err).__name__
