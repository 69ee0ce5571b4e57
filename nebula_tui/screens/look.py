"""What colours mean, once for every screen and both themes.

A handful of roles (ok, warn, bad, info, muted, free) carry every colour the TUI draws: job
states, GPU and node states, temperatures, bars. Each role is taken from the app's theme
(its success, warning, error and accent colours), darkened on a light background so that
text stays readable, so a role means the same thing in the dark and the light theme.

``LOOK`` is the one instance the render functions read; the app sets it whenever its
theme changes (``use_theme``) and tells the screens to draw again. Temperatures are drawn
by the health policy's thresholds (``model.Temperatures``: the scheduler's and the
throttling detector's "hot" and "warm"), which the head sends in its snapshot
(``use_temperatures``): the TUI never decides what is hot itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from textual.color import Color
from textual.theme import Theme

from ..model import Temperatures
from ..views import JobPhase

#: A card's heat (``Temperatures.heat``) -> role.
HEAT_ROLE = {"hot": "bad", "warm": "warn", "cool": "ok", None: "muted"}

#: Every job phase -> role (a test holds that none is left out).
PHASE_ROLE: dict[JobPhase, str] = {
    JobPhase.PENDING: "warn", JobPhase.HELD: "muted", JobPhase.LAUNCHING: "info",
    JobPhase.RUNNING: "ok", JobPhase.CANCELLING: "warn", JobPhase.EVICTING: "warn",
    JobPhase.STOPPING: "warn", JobPhase.SUCCEEDED: "ok", JobPhase.FAILED: "bad",
    JobPhase.CANCELLED: "muted", JobPhase.TIMEOUT: "bad",
}

#: State -> role, for every state the head publishes (jobs, GPUs, nodes, slices).
STATE_ROLE: dict[str, str] = {
    **{phase.value: role for phase, role in PHASE_ROLE.items()},
    # GPUs and slices
    "idle": "free", "free": "free", "busy": "info", "allocated": "info",
    "maintenance": "warn", "unreachable": "warn", "lost": "bad",
    # nodes
    "up": "ok", "connecting": "muted", "drained": "warn", "unknown": "warn", "down": "bad",
}

#: Roles that are drawn bold as well (what must catch the eye).
BOLD_ROLES = frozenset({"bad", "free"})


@dataclass
class Look:
    """The styles of the roles for one theme, and the temperature thresholds."""

    dark: bool = True
    temperatures: Temperatures = field(default_factory=Temperatures)
    styles: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.styles:
            self.use_colours(dark=True, success="#4EBF71", warning="#ffa62b", error="#ba3c5b",
                             accent="#0178D4")

    def use_colours(self, *, dark: bool, success: str, warning: str, error: str,
                    accent: str) -> None:
        def text_colour(value: str) -> str:
            colour = Color.parse(value)
            # Theme colours are made for a dark ground; on a light one they are too pale.
            return (colour if dark else colour.darken(0.25)).hex

        ok, warn, bad, info = (text_colour(c) for c in (success, warning, error, accent))
        self.dark = dark
        roles = {"ok": ok, "warn": warn, "bad": bad, "info": info, "free": ok, "muted": "dim"}
        self.styles = {role: f"bold {colour}" if role in BOLD_ROLES and colour != "dim" else colour
                       for role, colour in roles.items()}
        self.styles[""] = ""

    def use_theme(self, theme: Theme) -> None:
        """Take the roles' colours from a Textual theme (``App.current_theme``)."""
        self.use_colours(dark=theme.dark, success=theme.success or "#4EBF71",
                         warning=theme.warning or "#ffa62b", error=theme.error or "#ba3c5b",
                         accent=theme.primary or "#0178D4")

    def use_temperatures(self, published: Mapping[str, Any] | None) -> bool:
        """Draw by the thresholds the head published (its snapshot's ``temperatures``);
        True when they changed. A head that sends none leaves the defaults."""
        known = {k: float(v) for k, v in (published or {}).items()
                 if k in ("hot_c", "warm_c") and isinstance(v, (int, float))}
        temperatures = Temperatures(**known)
        changed = temperatures != self.temperatures
        self.temperatures = temperatures
        return changed

    # ------------------------------------------------------------------ roles
    def role(self, role: str) -> str:
        return self.styles.get(role, "")

    def state(self, state: str | None) -> str:
        """The style of a job, GPU, node or slice state."""
        return self.styles.get(STATE_ROLE.get(state or "", ""), "")

    def temperature_role(self, temp_c: float | None) -> str:
        return HEAT_ROLE[self.temperatures.heat(temp_c)]

    def temperature(self, temp_c: float | None) -> str:
        return self.styles[self.temperature_role(temp_c)]

    def fill(self, fraction: float | None) -> str:
        """A bar's colour by how full it is: ok, warn above 70%, bad above 90%."""
        if fraction is None or fraction < 0.7:
            return self.styles["ok"]
        return self.styles["warn"] if fraction < 0.9 else self.styles["bad"]


#: The look every render function reads (see the module's docstring).
LOOK = Look()
