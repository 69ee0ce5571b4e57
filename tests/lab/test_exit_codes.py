"""One rule for exit codes, whoever catches the mistake: a request that could never be valid
as written exits 2 (a usage error) whether the client or the head refuses it; a request the
head refuses for the state of things (no such job now, not yours, already ended) exits 1.
Each case through the real program against a real head."""

from __future__ import annotations

import pytest

#: requests no state of the cluster could make valid; the client lets them through and the
#: head refuses them
NEVER_VALID = [
    (["submit", "--gpu-mem", "17T", "--", "true"], "--gpu-mem"),
    (["quota", "alice", "-5"], "quota"),
    (["quota", "alice", "--", "-5"], "quota"),
    (["node", "drain", ""], "name"),
    (["cancel", str(1 << 70)], "job id"),
    (["job", str(1 << 70)], "job id"),
    (["logs", str(1 << 70)], "job id"),
    # bookings (issue 41): what no cluster could book as written
    (["reserve", "--gpus", "node01:x", "--start", "now", "--duration", "1h"], "--gpus"),
    (["reserve", "--gpus", "node01:0", "--start", "now", "--duration", "30s"], "--duration"),
    (["reserve", "--gpus", "node01:0", "--start", "now", "--duration", "40d"], "--duration"),
    (["reserve", "--gpus", "node01:0", "--start", "now", "--duration", "1h", "--name", "no good"], "--name"),
    (["reserve", "--gpu-count", "65", "--start", "now", "--duration", "1h"], "--gpu-count"),
    (["reserve", "--delete", "no good"], "--delete"),
    (["reserve", "--gpus", "node99:0", "--start", "now", "--duration", "1h"], "no GPU node99:0"),
    (["reserve", "--gpu-count", "64", "--start", "now", "--duration", "1h"], "no node here has 64 GPUs"),
]


@pytest.mark.parametrize("argv, says", NEVER_VALID, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_request_that_can_never_be_valid_exits_2_wherever_it_is_caught(head, argv, says):
    done = head.run(*argv)
    assert done.returncode == 2, (argv, done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert says in done.stderr, done.stderr


def test_a_refusal_for_the_state_of_things_exits_1(head):
    """The same commands, valid as written, refused for what is (or is not) there now."""
    for argv in (["cancel", "999999"], ["job", "999999"], ["node", "drain", "nosuchnode"],
                 ["node", "resume", "nosuchnode"]):
        done = head.run(*argv)
        assert done.returncode == 1, (argv, done.returncode, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
