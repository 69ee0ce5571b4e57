"""The cluster a replay's head runs with: the inventory's nodes (never connected to: the
replay plays them) and the settings of a real ``nodes.yaml`` (``--config``), with an admin's
what-ifs (``--set scheduler.half_life=3d``) on top — validated by the same ``config``
package as ``nebula serve``'s, so a setting means in a replay what it means on the lab."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..config.cluster import ClusterConfig, parse_config
from . import inventory

#: when a replay's month starts (2026-11-02 00:00 UTC, a Monday): the head's clock reads
#: real dates, so months, weekdays and the fair share's decay mean what they do on a lab
REPLAY_EPOCH = 1_793_577_600.0
#: the sections of nodes.yaml that are settings (the rest name the lab's own machines)
SETTING_SECTIONS = ("scheduler", "health", "limits", "accounting")


class SetupError(ValueError):
    """A --config or --set that cannot be used; str() says what to write."""


def replay_config(inv: dict[str, list[dict]], config: Path | None, sets: list[str]) -> ClusterConfig:
    settings: dict = {}
    if config is not None:
        try:
            data = yaml.safe_load(config.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise SetupError(f"--config {config}: cannot read it ({err})") from None
        parse_config(config.read_text(), config)  # its own errors name its file and line
        settings = {k: v for k, v in data.items() if k in SETTING_SECTIONS and v}
    for item in sets:
        key, _, value = item.partition("=")
        section, _, name = key.strip().partition(".")
        if not value or section not in SETTING_SECTIONS or not name:
            raise SetupError(f"--set {item!r}: write SECTION.KEY=VALUE with a section of "
                             f"{', '.join(SETTING_SECTIONS)}, e.g. scheduler.half_life=3d")
        settings.setdefault(section, {})[name] = yaml.safe_load(value)
    text = inventory.config_text(inv, yaml.safe_dump(settings, sort_keys=False) if settings else "")
    return parse_config(text, "--set" if sets else "the replay's cluster")
