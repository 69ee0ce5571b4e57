"""The ``:`` command line's parser (pure): what it accepts, and what it says otherwise."""

from __future__ import annotations

import pytest

from nebula_tui.screens.commandline import Command, CommandError, completions, parse


@pytest.mark.parametrize("typed, expected", [
    (":job 7", Command("job", ("7",))),
    ("job 7", Command("job", ("7",))),
    (":j 7", Command("job", ("7",))),
    (":gpu node02:1", Command("gpu", ("node02:1",))),
    (":gpu GPU-5c906bb9-33af-51b0", Command("gpu", ("GPU-5c906bb9-33af-51b0",))),
    (":drain node01", Command("drain", ("node01",))),
    (":drain node01 fan swap on Friday", Command("drain", ("node01", "fan swap on Friday"))),
    (":user alice", Command("user", ("alice",))),
    (":hist", Command("history", ())),
    (":q", Command("quit", ())),
    ("  :Queue ", Command("queue", ())),
    (":cancel 12", Command("cancel", ("12",))),
])
def test_commands_people_type(typed, expected):
    assert parse(typed) == expected


@pytest.mark.parametrize("typed, says", [
    (":", "type a command"),
    (":jbo 7", "no command 'jbo'"),
    (":re node01", "could be :release, :resume, :remove"),
    (":job", "usage: :job ID"),
    (":job seven", "'seven' is not a job id"),
    (":job 7 8", "usage: :job ID"),
    (":gpu node02", "is not a GPU; give NODE:INDEX"),
    (":drain", "usage: :drain NODE [REASON]"),
    (":user a;rm", "'a;rm' is not a user name"),
    (":node ../x", "'../x' is not a node name"),
    (":queue now", "usage: :queue"),
])
def test_mistakes_say_what_would_work(typed, says):
    with pytest.raises(CommandError) as err:
        parse(typed)
    assert says in str(err.value)


def test_completions_come_from_the_cluster():
    lines = completions([3, 12], ["node01"], ["node01:0"], ["alice"])
    assert ":job 12" in lines and ":drain node01" in lines
    assert ":gpu node01:0" in lines and ":user alice" in lines and ":history" in lines
