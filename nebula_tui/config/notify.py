"""The ``notify:`` section of nodes.yaml: who is told when a job ends or a GPU is isolated,
and how (``head/notify.py`` sends). Its builder raises :class:`SettingError` as the other
sections' do."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .settings import SettingError, as_mapping, check_known


@dataclass(frozen=True)
class NotifySettings:
    """``notify:`` — who is told when a job ends or a GPU is isolated, and how.

    ``webhooks``: URLs told of the events of jobs submitted with ``--notify`` (naming the
    owner); ``admin_webhooks`` and ``admin_mail``: told of every job's failure, time-out and
    requeue, and of every GPU isolated. Owners of ``--notify`` jobs get mail at
    ``USER@mail_domain`` (just ``USER``, local delivery, without one) through ``sendmail``,
    a command line (found on PATH or in /usr/sbin when not given; no mail where there is none).
    """

    webhooks: tuple[str, ...] = ()
    admin_webhooks: tuple[str, ...] = ()
    admin_mail: tuple[str, ...] = ()
    mail_domain: str | None = None
    sendmail: str | None = None
    mail_from: str | None = None


def notify_settings(value: Any) -> NotifySettings:
    data = as_mapping("notify", value)
    check_known("notify", data, ("webhooks", "admins", "mail_domain", "sendmail", "from"))
    admins = as_mapping("notify.admins", data.get("admins"), "admins")
    check_known("notify.admins", admins, ("webhooks", "mail"), "admins")
    texts = {key: _text("notify", key, data.get(key)) for key in ("mail_domain", "sendmail", "from")}
    for key in ("mail_domain", "from"):
        if texts[key] is not None and not _MAIL_RE.match(texts[key].split("@")[-1]):
            raise SettingError(f"notify.{key}: {texts[key]!r} is not a mail domain or address",
                               key)
    return NotifySettings(webhooks=_urls("notify.webhooks", data.get("webhooks")),
                          admin_webhooks=_urls("notify.admins.webhooks", admins.get("webhooks")),
                          admin_mail=_addresses("notify.admins.mail", admins.get("mail")),
                          mail_domain=texts["mail_domain"], sendmail=texts["sendmail"],
                          mail_from=texts["from"])


_MAIL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_ADDRESS_RE = re.compile(r"^[A-Za-z0-9_.+-]+(@[A-Za-z0-9][A-Za-z0-9.-]*)?$")


def _text(section: str, key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\n" in value:
        raise SettingError(f"{section}.{key} must be one line of text, found {value!r}", key)
    return value


def _keys(what: str) -> tuple[str, ...]:
    """Where ``what`` (e.g. ``notify.admins.mail``) is under its section."""
    return tuple(what.split(".")[1:])


def _list(what: str, value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise SettingError(f"{what} must be a list, e.g. [https://chat.example.org/hooks/…]",
                           *_keys(what))
    return value


def _urls(what: str, value: Any) -> tuple[str, ...]:
    urls = _list(what, value)
    for url in urls:
        if not isinstance(url, str) or not re.match(r"^https?://[^\s]+$", url):
            raise SettingError(f"{what}: {url!r} is not an http(s):// URL", *_keys(what))
    return tuple(urls)


def _addresses(what: str, value: Any) -> tuple[str, ...]:
    addresses = _list(what, value)
    for address in addresses:
        if not isinstance(address, str) or not _ADDRESS_RE.match(address):
            raise SettingError(f"{what}: {address!r} is not a mail address", *_keys(what))
    return tuple(addresses)
