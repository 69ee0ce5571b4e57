"""The CLI's argument types: a parser whose usage errors are one line (with "did you mean
…?"), and the converters of flag values (sizes, durations, moments, states, job ids …),
each refusing bad input with a sentence that says how to write it."""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from typing import NoReturn

from ..model import JobState
from ..units import TaskArray, parse_duration_s, parse_size_mb

#: Exit code of a usage error (a bad flag or value), as argparse uses.
USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the flag and this (sub-)command's own
    ``--help``, not a usage dump; a mistyped choice gets "did you mean …?"."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(USAGE_ERROR)

    def _print_message(self, message: str, file=None) -> None:
        # argparse drops a write that fails: `nebula --help | head -0` would then exit 0,
        # unlike every other command whose pipe closed early (main gives them 141).
        if message:
            (file or sys.stderr).write(message)

    def _check_value(self, action, value):
        # argparse's own check of a choice (a sub-command is a choice too), plus a suggestion.
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            choices = [str(c) for c in action.choices]
            what = "command" if isinstance(action, argparse._SubParsersAction) else "choice"
            message = f"unknown {what} '{value}'" + _did_you_mean(str(value), choices)
            if not _close(str(value), choices):
                message += f"; choose from {', '.join(choices)}"
            # A sub-command's error needs no "argument command:" in front of it.
            raise argparse.ArgumentError(None if what == "command" else action, message) from None

    def _get_values(self, action, arg_strings):
        # `--name=--` gives a flag the value "--", as any other. argparse on Python 3.11
        # strips a "--" from every value it is handed, leaving that flag an empty list.
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)

    def unrecognized(self, extras: list[str]) -> NoReturn:
        """Words this (sub-)command does not know: the error names them and, for a
        mistyped flag, the closest one it has."""
        message = f"unrecognized arguments: {' '.join(extras)}"
        flags = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        first_flag = next((e.split("=")[0] for e in extras if e.startswith("-")), None)
        if first_flag:
            message += _did_you_mean(first_flag, flags)
        elif self.prog == "nebula submit":
            message += "; the command to run goes after `--`"
        self.error(message)


def _close(word: str, choices: list[str]) -> list[str]:
    return difflib.get_close_matches(word, choices, n=1, cutoff=0.6)


def _did_you_mean(word: str, choices: list[str]) -> str:
    match = _close(word, choices)
    return f" (did you mean '{match[0]}'?)" if match else ""


def leaf_parser(parser: OneLineParser, args: argparse.Namespace) -> OneLineParser:
    """The innermost sub-command parser that ``args`` went through (``nebula node drain``;
    each is a ``OneLineParser``: ``cli.parser`` makes them so)."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or name is None:
            return parser
        parser = sub.choices[name]


def size_mb(text: str) -> int:
    try:
        return parse_size_mb(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def count(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more, not '{text}'")
    return int(text)


def pattern(regex, example: str):
    def check(text: str) -> str:
        if not regex.match(text):
            raise argparse.ArgumentTypeError(f"'{text}' is not valid; write it like {example}")
        return text
    return check


def duration(text: str) -> float:
    try:
        return parse_duration_s(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


STATES = tuple(s.value for s in JobState)
FINISHED_STATES = tuple(s.value for s in JobState if s.finished)
#: The tables of ``nebula report`` (``--csv`` prints one).
REPORT_TABLES = ("users", "nodes", "days")


def job_states(text: str) -> tuple[str, ...]:
    states = tuple(s.strip() for s in text.split(",") if s.strip())
    for state in states:
        if state not in STATES:
            raise argparse.ArgumentTypeError(
                f"'{state}' is not a state{_did_you_mean(state, list(STATES))}; "
                f"states: {', '.join(STATES)}")
    return states


def ended_states(text: str) -> tuple[str, ...]:
    states = job_states(text)
    for state in states:
        if state not in FINISHED_STATES:
            raise argparse.ArgumentTypeError(
                f"'{state}' is not an end state; end states: {', '.join(FINISHED_STATES)}")
    return states


def when(text: str) -> float:
    """A moment: a date or date and time (local time), or a duration ago (7d, 6h)."""
    for pattern in ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S",
                    "%Y-%m-%dT%H:%M:%S", "%Y-%m"):
        try:
            return time.mktime(time.strptime(text, pattern))
        except ValueError:
            continue
    try:
        return time.time() - duration(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a time; write a date (2026-12-01, '2026-12-01 14:00') or a time "
            "ago (90m, 6h, 7d)") from None


def ahead(text: str) -> float:
    """A moment from now on: "now", a time from now ("+2h", "in 2h"), or a date and time
    (local time)."""
    text = text.strip()
    if text == "now":
        return time.time()
    if text.startswith(("+", "in ")):
        return time.time() + duration(text.removeprefix("+").removeprefix("in ").strip())
    for pattern in ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(text, pattern))
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(f"'{text}' is not a time ahead; write '2026-12-11 09:00', now or +2h")


def users(text: str) -> list[str]:
    """"alice,bob" -> ["alice", "bob"]."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one user name, e.g. alice,bob")
    return names


def address(text: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:9400 for IPv6) of a listening socket."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not HOST:PORT; write it like 127.0.0.1:9400")
    return host, int(port)


def job_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:  # ids count from 1
        raise argparse.ArgumentTypeError(f"'{text}' is not a job id (a number, as `nebula queue` shows)")
    return int(text)


def array(text: str) -> TaskArray:
    try:
        return TaskArray.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def checked(check):
    """An argparse type from an ``environments`` check: its sentence is the usage error."""
    def convert(text: str) -> str:
        try:
            return check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[-1]) from None
    return convert
