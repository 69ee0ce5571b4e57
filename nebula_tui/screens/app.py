"""The Textual application: one factory (``make_app``) for the CLI and the tests alike.

The app only knows the head service's socket; everything it shows arrives over that socket
(a subscription for live state, one request per user action). One worker (group
``events``) reads the subscription and posts messages; ``folding.py`` folds them into
``self.cluster`` and the app tells the visible screen what changed.

Why one module: the app is where the stream's folded changes meet the screens and where
navigation, preferences and quitting live; what is folded is ``folding.py``'s, what a
person asks of the cluster is ``actions.py``'s (mixed in), each screen a module of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
import signal
import sys
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import on, work
from textual.actions import SkipAction
from textual.app import App, ComposeResult, SystemCommand
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from ..api import ApiError, AsyncClient
from ..client.cluster import Cluster
from ..client.service import ServiceUnavailable, connect
from ..homedir import Home
from ..printable import printable_json
from . import commandline
from ..waits import within
from ..wire import GpusEvent, PingReply, StreamSnapshot
from .actions import ClusterActions
from .base import ClusterApp, ClusterScreen
from .gpus import GpuDetailScreen, GpusScreen
from .job import JobScreen
from .look import LOOK
from .folding import fold, message_of
from .messages import GpusChanged, SnapshotArrived, StreamLost, StreamMessage
from .nodes import NodesScreen
from .overview import OverviewScreen
from .queue import QueueScreen
from .submit import SubmitScreen
from .users import UsersScreen
from .widgets.dialogs import Choice, ChoiceScreen
from .widgets.keys import (GLOBAL_KEYS, HELP_KEYS, SCREEN_KEYS, SCREENS, TABLE_KEYS, Key, bindings,
                           help_lines)
from .widgets.rowtable import RowTable

#: Reconnect back-off: first wait, factor, longest wait (seconds).
RETRY_FIRST_S = 0.5
RETRY_FACTOR = 2.0
RETRY_MAX_S = 10.0

#: Telemetry is batched this long: readings of nodes reporting meanwhile (125 nodes
#: report about once a second each) are folded in with one message (seconds).
TELEMETRY_BATCH_S = 0.25

#: How long a command that goes to a screen waits for its first drawing (seconds).
SCREEN_DRAWN_S = 5.0

#: The TUI's own preferences (the theme), in the user's NebulaGrid home.
PREFS_FILE = "tui.json"

#: How quitting a demo ended: its lab stopped, or left running in the background.
STOP_LAB, LEAVE_LAB = "stop", "leave"

#: Pages opened over a main screen; one replaces another instead of piling up.
DETAIL_SCREENS = (JobScreen, GpuDetailScreen, SubmitScreen)


def screen_keys(screen) -> tuple[Key, ...]:
    """The keys that work on ``screen``: its own, its tables', then the global ones."""
    own = tuple(getattr(screen, "KEYS", ()))
    tables = TABLE_KEYS if isinstance(screen, Screen) and screen.query(RowTable) else ()
    # a key the screen gives a meaning of its own (⏎: open the job) is listed once, with it
    taken = {k.key for k in own}
    return own + tuple(k for k in tables if k.key not in taken) + GLOBAL_KEYS


class HelpScroll(VerticalScroll):
    """The help's body: scrolls with the table keys people already use here."""

    BINDINGS = [("j", "scroll_down", "Down"), ("k", "scroll_up", "Up"),
                ("g", "scroll_home", "Top"), ("G", "scroll_end", "Bottom")]


class HelpScreen(ModalScreen[None]):
    """The keys of the screen it was opened over, then the global ones, then the commands."""

    BINDINGS = bindings(HELP_KEYS)

    def __init__(self, keys: tuple[Key, ...], title: str) -> None:
        super().__init__()
        self.key_rows = keys
        self.title_text = title

    def compose(self) -> ComposeResult:
        lines = help_lines(self.key_rows)
        commands = commandline.help_lines()
        width = max(len(k) for k, _ in lines)
        text = "\n".join(f"{k:>{width}}  {d}" for k, d in lines)
        cwidth = max(len(c) for c, _ in commands)
        ctext = "\n".join(f"{c:<{cwidth}}  {d}" for c, d in commands)
        # It scrolls (j/k, arrows, pgup/pgdn, g/G): every screen's keys, the global ones and
        # the commands are more lines than 80x24 holds.
        with HelpScroll(id="help"):
            yield Static(f"Keys — {self.title_text}", id="help-title")
            yield Static(text, id="help-keys", markup=False)
            yield Static("Commands (type : first)", id="help-commands-title")
            yield Static(ctext, id="help-commands", markup=False)  # "[REASON]" is text
            yield Static("esc closes this help · j/k scroll · ctrl+p searches every action",
                         id="help-hint")

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)


class KeyCommands(Provider):
    """The command palette's entries: every action of every screen. The current screen's
    keys run where they are; another main screen's are shown as "Nodes: Drain node" and
    switch to that screen first."""

    def _entries(self) -> list[tuple[str, Key, Callable[[], None]]]:
        app, screen = cast("NebulaApp", self.app), self.screen
        entries: list[tuple[str, Key, Callable[[], None]]] = [
            (k.description, k, partial(app.run_key, k, screen)) for k in screen_keys(screen) if k.palette]
        here = {type(screen)}
        for key, mode, title in SCREENS:
            cls = app.MODES[mode]
            if cls in here:
                continue
            for k in SCREEN_KEYS[mode]:
                if k.palette:
                    entries.append((f"{title}: {k.description}", k, partial(app.run_key_on, mode, k)))
        return entries

    def _help(self, key: Key) -> str:
        return f"key {key.shown_key}"

    async def discover(self) -> Hits:
        for label, key, run in self._entries():
            yield DiscoveryHit(label, run, help=self._help(key))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for label, key, run in self._entries():
            score = matcher.match(label)
            if score > 0:
                yield Hit(score, matcher.highlight(label), run, help=self._help(key))


def screenshot_path(home: Path | None, now: float) -> Path:
    """Where `P` saves: ``screenshots/`` in the NebulaGrid home (the current directory
    without one), under an ASCII name a shell takes as it is (the window's title held an
    em dash and the cluster's name)."""
    folder = (home / "screenshots") if home is not None else Path.cwd()
    return folder / time.strftime("nebula-%Y%m%d-%H%M%S.svg", time.localtime(now))


class NebulaApp(ClusterActions, App):
    """NebulaGrid TUI: a client of one head service."""

    CSS_PATH = "nebula.tcss"
    TITLE = "NebulaGrid"
    BINDINGS = bindings(GLOBAL_KEYS)
    COMMANDS = App.COMMANDS | {KeyCommands}
    MODES = {"overview": OverviewScreen, "gpus": GpusScreen, "queue": QueueScreen,
             "users": UsersScreen, "nodes": NodesScreen}
    DEFAULT_MODE = "overview"

    def __init__(self, client: AsyncClient, cluster_name: str | None = None, *,
                 home: Path | None = None, demo_lab: bool = False) -> None:
        """``home``: the user's NebulaGrid home (preferences, screenshots); ``demo_lab``:
        quitting may stop the demo's lab, so it asks first while jobs run."""
        super().__init__()
        self.client = client
        self.cluster = Cluster()
        self.connection: tuple[str, bool] = ("connecting…", False)
        self.user: str | None = None  # who the head says we are (for "mine")
        self._gpu_events: list[GpusEvent] = []  # telemetry batch: "gpus" events, in stream order
        self.home = home
        self.demo_lab = demo_lab
        #: called first when a demo's terminal closes (SIGHUP) or it is killed (SIGTERM)
        self.on_hangup: Callable[[], None] | None = None
        self.bar_name = f"NebulaGrid · {cluster_name}" if cluster_name else "NebulaGrid"
        if cluster_name:
            self.title = f"NebulaGrid — {cluster_name}"
        theme = self._prefs().get("theme")
        if theme in self.available_themes:
            self.theme = theme
        LOOK.use_theme(self.current_theme)

    def on_mount(self) -> None:
        self.sub_title = "connecting…"
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self.stream_events()
        self.who_am_i()
        self.call_after_refresh(self._warm_up)
        if self.demo_lab:
            # A closed terminal (SIGHUP) or a kill (SIGTERM) ends the TUI through its own exit,
            # and the demo then stops its lab. An exception raised by a Python signal handler
            # can land inside Textual's writer queue and leave it locked: a demo hung so.
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGHUP, signal.SIGTERM):
                loop.add_signal_handler(sig, self._hang_up)

    def _hang_up(self) -> None:
        if self.on_hangup is not None:
            self.on_hangup()
        self.exit()

    def _warm_up(self) -> None:
        """Mount every main screen once, unseen, while the first one waits for the head's
        snapshot. Textual's first show of a screen parses every stylesheet again, composes,
        mounts and styles the screen's widgets: two thirds of a first visit, which then
        costs what a switch back costs. The switches are batched: nothing is painted."""
        if not self.is_running:  # the app is closing already
            return
        home = self.current_mode
        cold = [mode for mode in self.MODES if mode != home and not self._mounted_mode(mode)]
        # One synchronous step, so no key meets a screen switched to only for this.
        with self.batch_update():
            mounting = [self.switch_mode(mode) for mode in cold]
            self.switch_mode(home)
        self._styled_when_mounted(cold, mounting)

    @work(group="warm-up", exit_on_error=False)
    async def _styled_when_mounted(self, modes: list[str], mounting: list) -> None:
        """Textual restyles a screen at its first show unless it was styled for the app's
        current CSS (its CSS update count), which it notes only for a screen shown and
        mounted; a warmed-up screen's widgets were styled as they mounted: say so."""
        styled_for = self._css_update_count
        for mounted in mounting:
            await mounted
        if self._css_update_count != styled_for:  # the theme changed meanwhile: restyle
            return
        for mode in modes:
            for screen in self.get_screen_stack(mode):
                screen._css_update_count = styled_for

    def _mounted_mode(self, mode: str) -> bool:
        try:
            return bool(self.get_screen_stack(mode))
        except KeyError:  # a mode not shown yet
            return False

    def on_unmount(self) -> None:
        gc.unfreeze()  # what _snapshot froze is the collector's again

    # ------------------------------------------------------------------ preferences
    def _prefs_path(self) -> Path | None:
        return self.home / PREFS_FILE if self.home else None

    def _prefs(self) -> dict:
        path = self._prefs_path()
        try:
            prefs = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: the defaults
        return prefs if isinstance(prefs, dict) else {}

    def _save_prefs(self, **changes) -> None:
        path = self._prefs_path()
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**self._prefs(), **changes}) + "\n")
        except OSError as err:
            self.notify(f"cannot remember the theme: {err}", severity="warning")

    def _theme_changed(self, theme) -> None:
        LOOK.use_theme(theme)
        self._save_prefs(theme=theme.name)
        shown = self._visible()
        for screen in self._cluster_screens():
            screen.restyle(shown=screen is shown)

    @work(group="whoami")
    async def who_am_i(self) -> None:
        """The ``whoami`` group: ask once who the head thinks we are (peer credentials)."""
        try:
            self.user = (await self.call("ping", PingReply)).get("user")
        except ApiError:
            pass

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
                # names, commands, reasons of anyone: printable, however they came
                async for event in self.client.events(decode=printable_json):
                    kind = event.get("type")
                    if kind == "snapshot":
                        delay = RETRY_FIRST_S
                        self._gpu_events = []  # changes to an older state: superseded
                        self.post_message(SnapshotArrived(cast(StreamSnapshot, event)))
                    elif kind == "gpus":
                        self._gpu_events.append(cast(GpusEvent, event))
                        if len(self._gpu_events) == 1:  # a new batch: one message for it
                            loop.call_later(TELEMETRY_BATCH_S, self._post_gpu_batch)
                    elif (message := message_of(event)) is not None:
                        self.post_message(message)
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
        starting, shutting down, or under a modal). A screen just pushed is mounted before
        its widgets are: until its first showing has drawn it (``drawn``) it only notes what
        it missed, which that showing catches up on."""
        stack = self.screen_stack
        screen = stack[-1] if stack else None
        if isinstance(screen, ClusterScreen) and screen.is_mounted and screen.drawn.is_set():
            return screen
        return None

    def tell_screens(self, change: str, key: object = None) -> None:
        """Tell the visible screen what changed; the others note it for when they are shown."""
        shown = self._visible()
        if shown is not None:
            shown.cluster_changed(change, key)
            if change in ("all", "node"):
                shown.show_bar()  # the cluster's reachability
        for screen in self._cluster_screens():  # the others catch up when shown
            if screen is not shown:
                screen.missed(change)

    def _cluster_screens(self) -> list[ClusterScreen]:
        """Every screen of cluster data, on any mode's stack."""
        screens: list[ClusterScreen] = []
        for mode in self.MODES:
            try:
                stack = self.get_screen_stack(mode)
            except KeyError:  # a mode not shown yet
                continue
            screens += (s for s in stack if isinstance(s, ClusterScreen))
        return screens

    @on(StreamMessage)
    def _fold(self, message: StreamMessage) -> None:
        """Fold a stream message into ``self.cluster`` (``folding.fold``) and tell the screens."""
        folded = fold(self.cluster, message)
        if folded.restyle:
            shown = self._visible()
            for screen in self._cluster_screens():
                screen.restyle(shown=screen is shown)
        if folded.snapshot:
            # A big cluster's snapshot is some 100,000 objects that live until the next one:
            # keep the garbage collector's full passes (over 100 ms each at 10,000 jobs, a
            # stall the user feels) from walking them again and again. They are still freed
            # by reference counting when replaced: decoded JSON holds no cycles. Garbage is
            # collected first so that none is frozen; the app thaws everything as it ends.
            gc.collect()
            gc.freeze()
        if folded.connection is not None:
            self._set_connection(folded.connection[0], lost=folded.connection[1])
        for change, key in folded.changes:
            self.tell_screens(change, key)

    def _set_connection(self, state: str, *, lost: bool) -> None:
        self.connection = (state, lost)
        self.sub_title = state
        if screen := self._visible():
            screen.show_connection()

    # ------------------------------------------------------------------ navigation
    def show(self, mode: str):
        """Show main screen ``mode`` itself: a detail page open on it or on the screen left
        is closed (``1``–``5`` always land on the screen they name). Returns an awaitable
        that is done once the screen is mounted."""
        while len(self.screen_stack) > 1 and isinstance(self.screen, DETAIL_SCREENS):
            self.pop_screen()
        if self.current_mode == mode:
            return self.switch_mode(mode)  # (done at once: nothing to switch)
        self._quick_switch = self._mounted_mode(mode)
        try:
            return self.switch_mode(mode)
        finally:
            self._quick_switch = False

    def action_show(self, mode: str) -> None:
        if isinstance(self.screen, ModalScreen):
            raise SkipAction()  # (a priority key) help and prompts keep the screen under them
        self.show(mode)

    _quick_switch = False  # switching to a screen that is already mounted

    def delay_update(self, delay: float = 0.05) -> None:
        # switch_mode holds every paint back for 50 ms, to hide a screen that is still
        # mounting. A screen shown before is ready: showing it at once is 50 ms sooner.
        if not self._quick_switch:
            super().delay_update(delay)

    def on_mode(self, mode: str, then: Callable[[Screen], object]) -> None:
        """Show ``mode``, then call ``then`` with its screen once it is mounted."""
        async def go() -> None:
            await self.show(mode)
            screen = self.screen
            if isinstance(screen, ClusterScreen):  # a first visit: once its rows are there
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(SCREEN_DRAWN_S, screen.drawn.wait())
            then(screen)

        self.run_worker(go(), group="navigate", exclusive=True)

    def open_detail(self, screen: Screen) -> None:
        """A detail page replaces the one shown (Esc always goes back to the main screen)."""
        if isinstance(self.screen, DETAIL_SCREENS) and len(self.screen_stack) > 1:
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def action_back(self) -> None:  # type: ignore[override]  # (Textual's is async: ours pops at once)
        if len(self.screen_stack) > 1:
            self.pop_screen()

    def action_submit_form(self) -> None:
        if not isinstance(self.screen, SubmitScreen):
            self.open_detail(SubmitScreen())

    def open_job(self, job_id: int) -> None:
        self.open_detail(JobScreen(job_id))

    def open_gpu(self, uuid: str) -> None:
        self.open_detail(GpuDetailScreen(uuid))

    def run_key(self, key: Key, screen: Screen) -> None:
        """Run a key's action as if pressed on ``screen`` (a table key on its table)."""
        target: DOMNode = screen
        if key in TABLE_KEYS:
            focused = screen.focused
            target = focused if isinstance(focused, RowTable) else screen.query(RowTable).first()
        self.call_later(self.run_action, key.action, target)

    def run_key_on(self, mode: str, key: Key) -> None:
        """Run a main screen's key from anywhere: show that screen first."""
        self.on_mode(mode, lambda screen: self.run_key(key, screen))

    # ------------------------------------------------------------------ actions
    def action_toggle_theme(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_reconnect(self) -> None:
        self._set_connection("reconnecting…", lost=False)
        self.stream_events()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            name = getattr(self.screen, "SCREEN_TITLE", type(self.screen).__name__)
            self.push_screen(HelpScreen(screen_keys(self.screen), name))

    def action_save_screenshot(self) -> None:
        target = screenshot_path(self.home, time.time())
        try:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            path = self.save_screenshot(filename=target.name, path=str(target.parent))
        except OSError as err:
            self.notify(f"cannot save a screenshot in {target.parent}: {err}", severity="error")
            return
        self.notify(f"Screenshot saved: {path}", timeout=10)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title == "Screenshot":  # Textual's wants ~/Downloads; ours does not
                command = SystemCommand(command.title, command.help,
                                        lambda: self.set_timer(0.1, self.action_save_screenshot))
            yield command

    async def action_quit(self) -> None:
        """Quit; a demo whose lab runs jobs asks whether to stop them with it."""
        running = [j for j in self.cluster.jobs.values() if j["state"] in ("running", "launching")]
        if not (self.demo_lab and running):
            self.exit(STOP_LAB)
            return
        if isinstance(self.screen, ChoiceScreen):
            return
        many = len(running) > 1
        body = Text(f"{len(running)} job{'s' if many else ''} {'run' if many else 'runs'} on "
                    f"the demo's lab:\n" + self._jobs_lines(running) + "\n")
        body.append("Stopping the lab stops them. Left running, `nebula demo` opens it again.",
                    style="dim")
        choices = (Choice("s", "Stop lab, jobs", STOP_LAB, danger=True),
                   Choice("l", "Leave running", LEAVE_LAB),
                   Choice("c", "Stay", None))

        def answered(choice: str | None) -> None:
            if choice is not None:
                self.exit(choice)

        self.push_screen(ChoiceScreen("Quit the demo?", body, choices, safe=1), answered)


def make_app(socket_path: Path, cluster_name: str | None = None, *, home: Path | None = None,
             demo_lab: bool = False) -> NebulaApp:
    """The app, talking to the head service listening on ``socket_path``."""
    return NebulaApp(AsyncClient(Path(socket_path)), cluster_name, home=home, demo_lab=demo_lab)


def _cluster_name(home: Home, config: str | None) -> str | None:
    """The cluster's name from nodes.yaml, for the bar; None when it cannot be read. (What
    the TUI draws by, its temperature thresholds among them, comes from the head.)"""
    from ..config.cluster import find_config, load_config
    from ..model import ConfigError

    try:
        path = find_config(config, home.root)
        cluster = load_config(path) if path else None
    except (ConfigError, OSError):
        return None
    return cluster.name if cluster is not None else None


def open_tui(home: Home, config: str | None, *, demo_lab: bool = False,
             on_hangup: Callable[[], None] | None = None) -> NebulaApp:
    """Run the TUI on the home's service until the user quits; returns the app, whose
    ``return_value`` says how (``LEAVE_LAB`` when a demo's user chose to leave its lab
    running) and ``return_code`` whether it failed. ``on_hangup``: a demo's, called when
    its terminal closes."""
    app = make_app(home.socket, _cluster_name(home, config), home=home.root, demo_lab=demo_lab)
    app.on_hangup = on_hangup
    app.run()
    return app


def run_tui(home: Home, config: str | None) -> int:
    """Start the head service if needed, then run the TUI until the user quits."""
    try:
        connect(home, config).close()  # autostarts the service like tmux does
    except (ServiceUnavailable, ApiError) as err:
        print(f"nebula: {err}", file=sys.stderr)
        return 1
    return open_tui(home, config).return_code or 0


if TYPE_CHECKING:
    def _as_the_screens_take_it(app: NebulaApp) -> ClusterApp:
        """mypy's check that the app is the ``ClusterApp`` the screens use (``self.tui``)."""
        return app
