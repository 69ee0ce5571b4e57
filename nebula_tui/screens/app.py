"""The Textual application: one factory (``make_app``) for the CLI and the tests alike.

The app only knows the head service's socket; everything it shows arrives over that socket
(a subscription for live state, one request per user action). One worker (group
``events``) reads the subscription and posts messages; the app's handlers fold them into
``self.cluster`` and tell the visible screen what changed.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from functools import partial
from pathlib import Path

from textual import on, work
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..api import ApiError, AsyncClient
from ..printable import printable, printable_tree
from ..service import Home, ServiceUnavailable, connect
from .base import ClusterScreen, OpMissing
from .cluster import Cluster
from .gpus import GpusScreen
from .job import JobScreen
from .keys import GLOBAL_KEYS, HELP_KEYS, Key, bindings, help_lines
from .messages import (EventLogged, GpusChanged, JobChanged, NodeChanged, SnapshotArrived,
                       StreamLost)
from .nodes import NodesScreen
from .overview import OverviewScreen
from .queue import QueueScreen
from .submit import SubmitScreen
from .users import UsersScreen

#: Reconnect back-off: first wait, factor, longest wait (seconds).
RETRY_FIRST_S = 0.5
RETRY_FACTOR = 2.0
RETRY_MAX_S = 10.0

#: Telemetry is batched this long: readings of nodes reporting meanwhile (125 nodes
#: report about once a second each) are folded in with one message (seconds).
TELEMETRY_BATCH_S = 0.25

#: What a job action says when it worked.
DONE_VERB = {"cancel": "cancelled", "hold": "held", "release": "released"}


def screen_keys(screen) -> tuple[Key, ...]:
    """The keys that work on ``screen``: its own, then the global ones."""
    return tuple(getattr(screen, "KEYS", ())) + GLOBAL_KEYS


class HelpScreen(ModalScreen[None]):
    """The keys of the screen it was opened over, then the global ones."""

    BINDINGS = bindings(HELP_KEYS)

    def __init__(self, keys: tuple[Key, ...], title: str) -> None:
        super().__init__()
        self.key_rows = keys
        self.title_text = title

    def compose(self) -> ComposeResult:
        lines = help_lines(self.key_rows)
        width = max(len(k) for k, _ in lines)
        text = "\n".join(f"{k:>{width}}  {d}" for k, d in lines)
        with Vertical(id="help"):
            yield Static(f"Keys — {self.title_text}", id="help-title")
            yield Static(text, id="help-keys")
            yield Static("esc closes this help · ctrl+p searches these", id="help-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class KeyCommands(Provider):
    """The command palette's entries: the same rows as the keys of the current screen."""

    def _keys(self) -> list[Key]:
        return [k for k in screen_keys(self.screen) if k.palette]

    def _run(self, key: Key) -> None:
        self.app.call_later(self.app.run_action, key.action, self.screen)

    def _help(self, key: Key) -> str:
        return f"key {key.display or key.key}"

    async def discover(self) -> Hits:
        for key in self._keys():
            yield DiscoveryHit(key.description, partial(self._run, key), help=self._help(key))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for key in self._keys():
            score = matcher.match(key.description)
            if score > 0:
                yield Hit(score, matcher.highlight(key.description), partial(self._run, key),
                          help=self._help(key))


class NebulaApp(App):
    """NebulaGrid TUI: a client of one head service."""

    CSS_PATH = "nebula.tcss"
    TITLE = "NebulaGrid"
    BINDINGS = bindings(GLOBAL_KEYS)
    COMMANDS = App.COMMANDS | {KeyCommands}
    MODES = {"overview": OverviewScreen, "gpus": GpusScreen, "queue": QueueScreen,
             "users": UsersScreen, "nodes": NodesScreen}
    DEFAULT_MODE = "overview"

    def __init__(self, client: AsyncClient, cluster_name: str | None = None) -> None:
        super().__init__()
        self.client = client
        self.cluster = Cluster()
        self.connection: tuple[str, bool] = ("connecting…", False)
        self.user: str | None = None  # who the head says we are (for "mine")
        self._gpu_events: list[dict] = []  # telemetry batch: "gpus" events, in stream order
        if cluster_name:
            self.title = f"NebulaGrid — {cluster_name}"

    def on_mount(self) -> None:
        self.sub_title = "connecting…"
        self.stream_events()
        self.who_am_i()

    def on_unmount(self) -> None:
        gc.unfreeze()  # what _snapshot froze is the collector's again

    # ------------------------------------------------------------------ requests
    async def call(self, op: str, **fields) -> dict:
        """One request to the head; raises ApiError (OpMissing for an op it lacks). Every
        string in the reply is made printable (other users' names and commands)."""
        try:
            return printable_tree(await self.client.call(op, **fields))
        except ApiError as err:
            if str(err).startswith("unknown request"):
                raise OpMissing(f"'{op}' is not available on this service") from None
            raise ApiError(printable(err)) from None

    @work(group="whoami")
    async def who_am_i(self) -> None:
        """The ``whoami`` group: ask once who the head thinks we are (peer credentials)."""
        try:
            self.user = (await self.call("ping")).get("user")
        except ApiError:
            pass

    @work(group="actions")
    async def job_action(self, op: str, job_id: int) -> None:
        """The ``actions`` group: cancel / hold / release one job; the outcome (or the
        service's refusal) becomes a notification."""
        try:
            await self.call(op, job=job_id)
        except OpMissing as err:
            self.notify(str(err), title=f"Cannot {op} job {job_id}", severity="warning")
        except ApiError as err:
            self.notify(str(err), title=f"Cannot {op} job {job_id}", severity="error")
        else:
            self.notify(f"Job {job_id} {DONE_VERB.get(op, op)}")

    @work(exclusive=True, group="events")
    async def stream_events(self) -> None:
        """The ``events`` group: at most one subscription to the head at a time.

        Reads the stream, posting one message per event; when the stream breaks it posts
        StreamLost and subscribes again with exponential back-off. Runs until cancelled
        (a new ``stream_events`` call, i.e. ``r``, replaces it).
        """
        delay = RETRY_FIRST_S
        loop = asyncio.get_running_loop()
        while True:
            try:
                async for event in self.client.events():
                    event = printable_tree(event)  # names, commands, reasons of anyone
                    kind = event.get("type")
                    if kind == "snapshot":
                        delay = RETRY_FIRST_S
                        self._gpu_events = []  # changes to an older state: superseded
                        self.post_message(SnapshotArrived(event))
                    elif kind == "job":
                        self.post_message(JobChanged(event["job"]))
                    elif kind == "gpus":
                        self._gpu_events.append(event)
                        if len(self._gpu_events) == 1:  # a new batch: one message for it
                            loop.call_later(TELEMETRY_BATCH_S, self._post_gpu_batch)
                    elif kind == "node":
                        self.post_message(NodeChanged(event["node"]))
                    elif kind == "event":
                        self.post_message(EventLogged(event["event"]))
                    elif event.get("ok") is False:
                        raise ApiError(event.get("error", "subscription refused"))
                reason = "the head service closed the event stream"
            except (ApiError, OSError, ValueError, KeyError) as err:
                reason = str(err) or type(err).__name__
            self.post_message(StreamLost(reason, delay))
            await asyncio.sleep(delay)
            delay = min(delay * RETRY_FACTOR, RETRY_MAX_S)

    def _post_gpu_batch(self) -> None:
        # The batch goes with its message: queued after any snapshot posted before it, so
        # changes are always folded into the state they were sent against.
        batch, self._gpu_events = self._gpu_events, []
        if batch:
            self.post_message(GpusChanged(batch))

    # ------------------------------------------------------------------ handlers
    def _visible(self) -> ClusterScreen | None:
        """The screen on top when it renders cluster data and is ready to (None while
        starting, shutting down, or under a modal)."""
        stack = self.screen_stack
        screen = stack[-1] if stack else None
        return screen if isinstance(screen, ClusterScreen) and screen.is_mounted else None

    def _changed(self, change: str, key: object = None) -> None:
        shown = self._visible()
        if shown is not None:
            shown.cluster_changed(change, key)
        for screen in self._cluster_screens():  # the others catch up when shown
            if screen is not shown:
                screen.missed(change)

    def _cluster_screens(self) -> list[ClusterScreen]:
        """Every screen of cluster data, on any mode's stack."""
        screens = []
        for mode in self.MODES:
            try:
                stack = self.get_screen_stack(mode)
            except KeyError:  # a mode not shown yet
                continue
            screens += (s for s in stack if isinstance(s, ClusterScreen))
        return screens

    @on(SnapshotArrived)
    def _snapshot(self, message: SnapshotArrived) -> None:
        self.cluster.apply_snapshot(message.snapshot)
        # A big cluster's snapshot is some 100,000 objects that live until the next one:
        # keep the garbage collector's full passes (over 100 ms each at 10,000 jobs, a
        # stall the user feels) from walking them again and again. They are still freed
        # by reference counting when replaced: decoded JSON holds no cycles. Garbage is
        # collected first so that none is frozen; the app thaws everything as it ends.
        gc.collect()
        gc.freeze()
        self._set_connection("connected", lost=False)
        self._changed("all")

    @on(JobChanged)
    def _job(self, message: JobChanged) -> None:
        self.cluster.apply_job(message.job)
        self._changed("job", message.job["id"])

    @on(GpusChanged)
    def _gpus(self, message: GpusChanged) -> None:
        changed = set()
        for event in message.events:
            if self.cluster.apply_gpus(event["node"], event["gpus"], event.get("gone", ())):
                changed.add(event["node"])
        for node in changed:  # nodes whose readings did not move cost no screen work
            self._changed("gpus", node)

    @on(NodeChanged)
    def _node(self, message: NodeChanged) -> None:
        self.cluster.apply_node(message.node)
        self._changed("node", message.node["name"])

    @on(EventLogged)
    def _event(self, message: EventLogged) -> None:
        self.cluster.apply_event(message.event)
        self._changed("event")

    @on(StreamLost)
    def _lost(self, message: StreamLost) -> None:
        self.cluster.connected = False
        self._set_connection(f"disconnected — retrying in {message.retry_s:g}s "
                             f"({message.reason})", lost=True)

    def _set_connection(self, state: str, *, lost: bool) -> None:
        self.connection = (state, lost)
        self.sub_title = state
        if screen := self._visible():
            screen.show_connection()

    # ------------------------------------------------------------------ actions
    def action_show(self, mode: str) -> None:
        # Pushed screens (a job, a GPU, the form) stay on their mode's stack.
        if isinstance(self.screen, ModalScreen):
            raise SkipAction()  # (a priority key) help and prompts keep the screen under them
        if self.current_mode == mode:
            return
        try:
            shown_before = bool(self.get_screen_stack(mode))
        except KeyError:
            shown_before = False
        self._quick_switch = shown_before
        try:
            self.switch_mode(mode)
        finally:
            self._quick_switch = False

    _quick_switch = False  # switching to a screen that is already mounted

    def delay_update(self, delay: float = 0.05) -> None:
        # switch_mode holds every paint back for 50 ms, to hide a screen that is still
        # mounting. A screen shown before is ready: showing it at once is 50 ms sooner.
        if not self._quick_switch:
            super().delay_update(delay)

    def action_submit_form(self) -> None:
        if not isinstance(self.screen, SubmitScreen):
            self.push_screen(SubmitScreen())

    def open_job(self, job_id: int) -> None:
        self.push_screen(JobScreen(job_id))

    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_reconnect(self) -> None:
        self._set_connection("reconnecting…", lost=False)
        self.stream_events()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            name = getattr(self.screen, "SCREEN_TITLE", type(self.screen).__name__)
            self.push_screen(HelpScreen(screen_keys(self.screen), name))


def make_app(socket_path: Path, cluster_name: str | None = None) -> NebulaApp:
    """The app, talking to the head service listening on ``socket_path``."""
    return NebulaApp(AsyncClient(Path(socket_path)), cluster_name)


def _cluster_name(home: Home, config: str | None) -> str | None:
    """The cluster's name from nodes.yaml, for the header; None when it cannot be read."""
    from ..config import ConfigError, find_config, load_config

    try:
        path = find_config(config, home.root)
        return load_config(path).name if path else None
    except (ConfigError, OSError):
        return None


def run_tui(home: Home, config: str | None) -> int:
    """Start the head service if needed, then run the TUI until the user quits."""
    try:
        connect(home, config).close()  # autostarts the service like tmux does
    except (ServiceUnavailable, ApiError) as err:
        print(f"nebula: {err}", file=sys.stderr)
        return 1
    app = make_app(home.socket, _cluster_name(home, config))
    app.run()
    return app.return_code or 0
