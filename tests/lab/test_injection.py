"""No user-supplied string can inject shell commands on a node (R22), end to end: job
names, arguments and workdirs full of metacharacters reach the node and run literally."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from support.head import log, submitted_id

NASTY = st.sampled_from([";", "$(", ")", "`", "'", '"', "\n", "\\", "|", "&", ">", "<", "*", "$HOME",
                         "${IFS}", "-", " ", "#", "!", "~", "\t", "%s", "'\"'"])
TEXT = st.lists(st.one_of(NASTY, st.text(alphabet="abcé日 /.", max_size=4)), min_size=1,
                max_size=6).map("".join)
PRINT_ARGV = "import json, os, sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))"


@pytest.mark.slow
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=TEXT.filter(lambda s: "\n" not in s and len(s) <= 128), args=st.lists(TEXT, max_size=4),
       folder=TEXT.filter(lambda s: "/" not in s and s.strip(" ") not in ("", ".", "..")))
@example(name="--", args=["日日/é\\#"], folder='bac"')  # argparse had made the name []
def test_names_arguments_and_workdirs_run_literally(head, name, args, folder):
    workdir = Path(tempfile.mkdtemp(prefix="inj-")) / folder
    workdir.mkdir()
    canary = Path(tempfile.mkdtemp(prefix="canary-"))
    env_args = [a.replace("$HOME", str(canary)) for a in args]  # a stray expansion would hit it
    # --name=VALUE: a name may start with '-' like an option does.
    done = head.run("submit", f"--name={name}", "--gpu-mem", "4G", "--workdir", str(workdir), "--wait",
                    "--", sys.executable, "-c", PRINT_ARGV, *env_args)
    assert done.returncode == 0, done.stderr
    job = submitted_id(done.stdout)
    assert head.job(job)["name"] == name
    ran = json.loads(log(head, job))
    assert ran == [str(workdir), *env_args]
    assert list(canary.iterdir()) == []
