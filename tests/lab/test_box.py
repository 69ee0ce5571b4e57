"""The admin guide, run as written under a real systemd: docs/admin-guide.md's blocks tagged
``box:…`` in a Debian booted by systemd-nspawn (tests/support/boxfixtures.py), against the
simulated lab's sshd nodes on 127.0.0.1.

In order, as an admin would: the previous release installed from its wheel (built from
the commit before this version's), the service account, its key, ``nodes.yaml``, the
service and its backup timer, the nodes added through the service; two users submitting,
each alone with their own jobs; the upgrade to this checkout's wheel with jobs running
(each runs once, keeps its id, log and accounting, checked by its GPU-hours); ``systemctl
reload`` with a changed and a broken ``nodes.yaml``; the timer's backup; the uninstall,
leaving nothing on the nodes. What the test changes in the guide's text is said where it
does: the example addresses become the lab's (127.0.0.1 and a port), and the nodes' half of
the key step (the public key into the nodes' authorized_keys) is done on the lab's side.

Where a real Slurm runs here (``slurm_lab``: root, slurm-wlm installed), ``nodes.yaml`` has
it as pool ``hpc`` with ``user: submitter``: the box's service reaches its login node on
127.0.0.1 as the host's sshd nodes, alice authorises the head's pool key there as
``docs/pools.md`` says, and one of her jobs runs on that Slurm through the upgrade, its
GPU-hours those of the cluster's own ``sacct``. Without Slurm that job is left out, saying so.
"""

from __future__ import annotations

import json
import pwd
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from support.boxfixtures import (Box, BoxCannotBoot, box_root, checkout_wheel, guide_blocks, previous_release,
                         release_wheel, tracked_copy, wheelhouse, why_no_box)
from labkit.harness import wait_for

from nebula_tui.model import charged_gpu_hours
from nebula_tui.sim.slurmlab import unlock_for_ssh

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.box, pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(bool(why_no_box()), reason=why_no_box() or "")]

#: the lab's users; on a real lab the nodes know them by the same names (LDAP, or useradd)
USERS = ("alice", "bob")
#: where each job notes that it ran, on the nodes (the lab's nodes are this machine)
RUNS = Path("/tmp/nebula-box-runs")
#: the box's scheduler.preemptible_charge
PREEMPTIBLE_CHARGE = 0.5


def version_of(wheel: Path) -> str:
    return wheel.name.split("-")[1]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path | None]:
    """This checkout's wheel, and the previous release's (None without git history)."""
    new = checkout_wheel(tmp_path_factory)
    commit = previous_release()
    old = release_wheel(commit) if commit else None
    return {"new": new, "old": old}


@pytest.fixture(scope="module")
def host_users():
    """The lab's users on the nodes (this machine): made when missing, removed after."""
    made = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-m", name], check=True, capture_output=True)
            made.append(name)
    RUNS.mkdir(exist_ok=True)
    RUNS.chmod(0o1777)
    try:
        yield {name: pwd.getpwnam(name).pw_uid for name in USERS}
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(RUNS, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(request, host_users):
    """The host's real Slurm with alice able to log in to its login node (None, said, where
    there is none: the rest of the guide runs without a pool)."""
    try:
        lab = request.getfixturevalue("slurm_lab")
    except pytest.skip.Exception as skipped:
        print(f"box: no pool job: {skipped}")
        yield None
        return
    unlock_for_ssh("alice")  # useradd leaves it locked, which sshd refuses
    try:
        yield lab
    finally:
        lab.revoke("alice")


@pytest.fixture(scope="module")
def box(tmp_path_factory, wheels, host_users, openssh_lab, slurm):
    share = tmp_path_factory.mktemp("share")
    shutil.copytree(REPO / "deploy", share / "deploy")
    (share / "dist").mkdir()
    try:
        root = box_root()
    except RuntimeError as err:  # no Debian mirror to debootstrap from, say
        pytest.skip(f"no root filesystem for the box: {err}")
    the = Box(root, share, wheelhouse(*filter(None, wheels.values())), share.parent / "box.log")
    started = time.monotonic()
    try:
        the.boot()
    except BoxCannotBoot as err:
        pytest.skip(f"systemd-nspawn cannot boot a container here: {err}")
    except BaseException:
        the.stop()
        raise
    print(f"box: booted in {time.monotonic() - started:.1f} s")
    for name, uid in host_users.items():
        the.sh(f"useradd -m -u {uid} {name}")
    authorized = openssh_lab.root / "authorized_keys"
    keys_before = authorized.read_text()
    try:
        yield the
    finally:
        authorized.write_text(keys_before)
        the.stop()


def in_dist(box: Box, wheel: Path) -> None:
    """The one wheel the guide's `dist/nebula_tui-*.whl` names."""
    for old in (box.share / "dist").glob("*.whl"):
        old.unlink()
    shutil.copy2(wheel, box.share / "dist" / wheel.name)


def nebula(box: Box, args: str, user: str, check: bool = True) -> subprocess.CompletedProcess:
    return box.sh(f"nebula {args}", user=user, check=check)


def job_of(box: Box, job: int, user: str = "root") -> dict:
    return json.loads(nebula(box, f"job {job} --json", user).stdout)


def journal(box: Box, unit: str = "nebula") -> str:
    return box.sh(f"journalctl -u {unit} --no-pager -o cat").stdout


def test_the_guide_installs_a_shared_head_under_systemd(box, wheels, openssh_lab, slurm):
    blocks = guide_blocks()
    first = wheels["old"] or wheels["new"]
    in_dist(box, first)
    done = box.sh(blocks["install"])
    assert f"nebula {version_of(first)}" in done.stdout

    box.sh(blocks["account"])
    box.sh(blocks["account"].splitlines()[-1].replace("alice", "bob"))  # the next user, alike

    pub = box.sh(blocks["key"]).stdout.strip().splitlines()[-1]
    assert pub.startswith("ssh-ed25519 ") and pub.endswith("@nebula-box")
    with (openssh_lab.root / "authorized_keys").open("a") as keys:  # on each node
        keys.write(pub + "\n")

    config = yaml.safe_load(blocks["nodes.yaml"])
    assert config["cluster"]["run_as"] == "submitter" and config["nodes"] == []
    config["cluster"]["user"] = openssh_lab.user  # the lab's login account (root here)
    config["cluster"]["probe_interval"] = 1       # the lab's pace: seconds, not minutes
    # what a preemptible job's GPU-hours count, said here so that the figures below can
    config.setdefault("scheduler", {})["preemptible_charge"] = PREEMPTIBLE_CHARGE
    if slurm is not None:  # the host's Slurm as the lab's pool, each user as themselves
        config["pools"] = [slurm.pool_entry("hpc", user="submitter", poll_interval="1s",
                                            known_hosts="/etc/nebula/hpc_known_hosts")]
        shutil.copy(slurm.known_hosts_path, box.share / "hpc_known_hosts")
    (box.share / "nodes.yaml").write_text(yaml.safe_dump(config))
    box.sh(blocks["config"])
    if slurm is not None:  # the login node's host key, as its admins publish it
        box.sh("install -m 644 /root/work/hpc_known_hosts /etc/nebula/hpc_known_hosts")
    box.sh(blocks["service"])
    assert box.sh("systemctl is-active nebula").stdout.strip() == "active"
    assert "enabled" in box.sh("systemctl is-enabled nebula-backup.timer").stdout
    assert box.sh("stat -c '%U %a' /var/lib/nebula /etc/nebula/nodes.yaml").stdout.split() == [
        "nebula", "700", "nebula", "640"]
    wait_for(lambda: box.sh("test -S /run/nebula/nebula.sock", check=False).returncode == 0, 30,
             what="the service's socket")
    assert box.sh("stat -c '%U %G %a' /run/nebula /run/nebula/nebula.sock").stdout.split() == [
        "nebula", "gpulab", "750", "nebula", "gpulab", "660"]

    # The example addresses become the lab's; each `node add` asks on a terminal.
    script = blocks["nodes"]
    for i, name in enumerate(("node01", "node02"), start=1):
        script = script.replace(f"{name} 10.0.0.1{i}", f"{name} 127.0.0.1 --port {openssh_lab.port(name)}")
    assert "10.0.0." not in script
    said = ""
    for line in filter(None, script.splitlines()):
        if " node add " in line:  # the admin compares the fingerprint and answers y
            line = f"printf 'y\\n' | script -qec {shlex.quote(line)} /dev/null"
        said += box.sh(line).stdout
    assert said.count("Trust it?") == 2, said
    assert "Added node01" in said and "Added node02" in said, said
    assert said.count("Smoke test: job") == 2 and "succeeded" in said, said
    kept = box.sh("cat /etc/nebula/nodes.yaml").stdout
    assert "node01" in kept and "node02" in kept
    wait_for(lambda: "Nodes: 2" in nebula(box, "status", "alice").stdout, 60,
             what="both nodes, as alice sees them")
    assert "serving 0 nodes from /etc/nebula/nodes.yaml" in journal(box)


def history_of(box: Box) -> dict[int, dict]:
    """Each ended job as `nebula history --json` says (the admin sees every user's)."""
    history = json.loads(nebula(box, "history --json", "root").stdout)
    return {j["id"]: j for j in (history if isinstance(history, list) else history["jobs"])}


def report_hours(box: Box) -> dict[str, float]:
    """Each user's GPU-hours this month, as `nebula report --json` says."""
    hours: dict[str, float] = {}
    for row in json.loads(nebula(box, "report --json", "root").stdout)["users"]:
        hours[row["user"]] = hours.get(row["user"], 0.0) + row["gpu_hours"]
    return hours


def expected_gpu_hours(box: Box, job: dict, by_the_old_release: bool = False) -> float:
    """What the accounting rule of the release that ended the job charges it, had it run
    once: its run time times its cards times its charge, a slice counting its gigabytes over
    the reference card's (``model.charged_gpu_hours``) — or, by the previous release, its
    share of the memory of the card it ran on."""
    charge = PREEMPTIBLE_CHARGE if job["preemptible"] else 1.0
    if not by_the_old_release:
        return charged_gpu_hours([(p["memory_mb"], p["exclusive"]) for p in job["gpus"]], job["run_s"],
                                 charge=charge)
    listed = json.loads(nebula(box, "gpus --json", "root").stdout)
    totals = {g["uuid"]: g["total_memory_mb"] for g in (listed if isinstance(listed, list) else listed["gpus"])}
    cards = sum(1.0 if p["exclusive"] else min(1.0, p["memory_mb"] / totals[p["uuid"]])
                for p in job["gpus"])
    return job["run_s"] / 3600 * cards * charge


def sacct_gpu_hours(slurm, name: str) -> float:
    """GPU-hours of the one Slurm job named ``name``, from the cluster's own accounting."""
    done = subprocess.run(["sacct", "-X", "-n", "-P", "-a", "--name", name,
                           "--format=JobID,Elapsed,AllocTRES"], capture_output=True, text=True,
                          env=slurm.env, timeout=30, check=True)
    (line,) = done.stdout.split()
    _, elapsed, tres = line.split("|")
    h, m, s_ = (int(x) for x in elapsed.split("-")[-1].split(":"))
    gpus = int(re.search(r"gres/gpu=(\d+)", tres).group(1))
    return gpus * (h * 3600 + m * 60 + s_) / 3600


def test_two_users_each_with_their_own_jobs_through_an_upgrade(box, wheels, slurm):
    submit = "submit --gpu-mem 1G --time 10m"
    # one file per part: a gang spread over two nodes runs its command once on each
    mark = (f"echo ran-$NEBULA_JOB_ID >> {RUNS}/$NEBULA_JOB_ID.${{NODE_RANK:-0}}; "
            "echo log-of-$NEBULA_JOB_ID")
    jobs: dict[int, str] = {}

    def submitted(user: str, args: str, how: str = submit) -> int:
        done = nebula(box, f"{how} {args}", user)
        job = int(re.search(r"Submitted job (\d+)", done.stdout + done.stderr).group(1))
        jobs[job] = user
        return job

    # One ended before the upgrade: its figures are read now and again after it.
    early = submitted("alice", f"--name early --command '{mark}; sleep 2'")
    wait_for(lambda: early in history_of(box), 60, what="the early job ended")
    before = history_of(box)[early]
    assert before["state"] == "succeeded" and before["gpu_hours"] > 0, before

    long = submitted("alice", f"--name long --command '{mark}; sleep 25'")
    spare = submitted("alice", f"--name spare --preemptible --command '{mark}; sleep 20'")
    gang = submitted("bob", f"--name gang --gpu-count 2 --nodes 2 --command '{mark}; sleep 20'")
    across = [long, spare, gang]
    pooled = None
    if slurm is not None:
        # alice authorises the head's pool key on the login node, as docs/pools.md says
        said = nebula(box, "pool authorize hpc", "alice").stdout
        line = next(x.strip() for x in said.splitlines() if x.strip().startswith("from="))
        slurm.authorize("alice", line)
        pooled = submitted("alice", f"--name box-pooled --command '{mark}; sleep 25'",
                           "submit --pool hpc --gpu-count 1 --time 10m")
        across.append(pooled)
    wait_for(lambda: all(job_of(box, j)["state"] == "running" for j in across), 90,
             what="the jobs running")
    submitted("bob", f"--name later --command '{mark}'")

    # Each user alone with their own: the other's command line is hidden, their logs and
    # cancel refused.
    assert job_of(box, gang, "alice")["command"] == ["(hidden: only bob and admins see it)"]
    assert "sleep 20" in " ".join(job_of(box, gang, "bob")["command"])
    refused = nebula(box, f"logs {gang}", "alice", check=False)
    assert refused.returncode != 0 and "bob" in refused.stderr + refused.stdout
    refused = nebula(box, f"cancel {long}", "bob", check=False)
    assert refused.returncode != 0

    if wheels["old"] is not None:
        in_dist(box, wheels["new"])
        done = box.sh(guide_blocks()["upgrade"])
        assert f"nebula {version_of(wheels['new'])}" in done.stdout
    def ended() -> bool:
        return all(job_of(box, j)["state"] in ("succeeded", "failed", "cancelled", "timeout") for j in jobs)
    wait_for(ended, 180, what="every job ended")
    for job, user in jobs.items():
        seen = job_of(box, job, user)
        assert seen["state"] == "succeeded" and seen["user"] == user, seen
        parts = sorted(RUNS.glob(f"{job}.*"))
        assert parts, f"job {job} never ran"
        for part in parts:
            assert part.read_text() == f"ran-{job}\n", f"job {job}'s part {part.suffix} ran more than once"
        assert f"log-of-{job}" in nebula(box, f"logs {job}", user).stdout
    ran = history_of(box)
    assert set(jobs) <= set(ran), ran.keys()

    # The accounting, by its figures: the job that ended before the upgrade is charged the
    # same after it; one that ran through it, its whole run once (neither restarted at the
    # upgrade nor charged twice); the pool job, what Slurm's own sacct says it held.
    assert ran[early]["gpu_hours"] == before["gpu_hours"] and ran[early]["run_s"] == before["run_s"]
    assert abs(before["gpu_hours"] - expected_gpu_hours(box, before, wheels["old"] is not None)) < 1e-6, before
    for job, slept in ((long, 25), (spare, 20), (gang, 20)):
        seen = ran[job]
        assert slept - 1 <= seen["run_s"] < slept + 60, seen
        expected = expected_gpu_hours(box, seen)
        assert abs(seen["gpu_hours"] - expected) < 1e-6, (seen, expected)
        print(f"box: job {job} ran {seen['run_s']:.1f} s on {len(seen['gpus'])} slice(s): "
              f"{seen['gpu_hours']:.6f} GPU-h, as the rule says {expected:.6f}")
    if pooled is not None:
        assert ran[pooled]["node"].startswith("hpc:"), ran[pooled]
        slurm_said = sacct_gpu_hours(slurm, "box-pooled")
        assert slurm_said >= 25 / 3600 and abs(ran[pooled]["gpu_hours"] - slurm_said) < 1e-6, \
            (ran[pooled], slurm_said)
        print(f"box: pool job {pooled}: {ran[pooled]['gpu_hours']:.6f} GPU-h, sacct {slurm_said:.6f}")
    # …and the report's totals are those jobs' sums, user by user.
    hours = report_hours(box)
    for user in USERS:
        theirs = sum(ran[j]["gpu_hours"] for j, u in jobs.items() if u == user)
        assert abs(hours.get(user, 0.0) - theirs) < 1e-5, (user, hours, theirs)


def test_the_journal_shows_the_head_and_the_timer_makes_backups(box):
    assert re.search(r"serving \d+ nodes from /etc/nebula/nodes.yaml", journal(box))
    assert "nebula-backup.timer" in box.sh("systemctl list-timers --all --no-pager").stdout
    newest = "ls -t /var/lib/nebula/backups 2>/dev/null | head -n 1"
    before = box.sh(newest).stdout
    box.sh("systemctl start nebula-backup.service")  # what the timer starts
    assert box.sh(newest).stdout not in ("", before)
    assert "nebula backup: /var/lib/nebula/backups/" in journal(box, "nebula-backup")


def test_a_reload_applies_a_changed_nodes_yaml_and_refuses_a_broken_one(box):
    reload = guide_blocks()["reload"]
    # The admin's edit: node02 drained, a limit changed (with the service's own Python,
    # which has PyYAML).
    box.sh("/opt/nebula/bin/python3 -c '"
           "import yaml; p = \"/etc/nebula/nodes.yaml\"; c = yaml.safe_load(open(p)); "
           "[n.update(drained=True) for n in c[\"nodes\"] if n[\"name\"] == \"node02\"]; "
           "c[\"limits\"] = {\"log_max\": \"5G\"}; open(p, \"w\").write(yaml.safe_dump(c))'")
    box.sh(reload)  # SIGHUP: the head reads the file while systemctl returns
    said = wait_for(lambda: re.search(r"reloaded /etc/nebula/nodes.yaml: (.*)", journal(box)), 30,
                    what="the reload's line in the journal")
    assert "node02 drained" in said.group(1) and "limits changed" in said.group(1), said.group(0)
    wait_for(lambda: "drained" in nebula(box, "status", "root").stdout, 30, what="node02 drained")
    box.sh("echo 'nodes: [this is not' >> /etc/nebula/nodes.yaml")
    box.sh(reload)
    wait_for(lambda: re.search(r"refused /etc/nebula/nodes.yaml:\d+(:\d+)?: .*the running one stays",
                               journal(box)), 30, what="the refusal in the journal")
    assert box.sh("systemctl is-active nebula").stdout.strip() == "active"
    assert "node01" in nebula(box, "status", "alice").stdout


def test_the_uninstall_leaves_nothing_running(box, openssh_lab):
    box.sh(guide_blocks()["uninstall"])
    assert "nebula" not in box.sh("systemctl list-unit-files --no-pager").stdout
    # ("[/]": the pattern does not match the shell that runs pgrep)
    assert not box.sh("pgrep -af '[/]opt/nebula|[n]ebula serve' || true").stdout.strip()
    assert box.sh("id nebula", check=False).returncode != 0

    def left_on_nodes() -> list[str]:
        found = subprocess.run(["pgrep", "-af", str(openssh_lab.root)], capture_output=True,
                               text=True).stdout.splitlines()
        return [p for p in found if "sshd" not in p and "pgrep" not in p]
    wait_for(lambda: not left_on_nodes(), 30, what="nothing of the head left on the nodes")


#: what a box's /etc holds, as paths with their size and time (a change shows in either)
ETC = "find /etc -xdev -printf '%p %s %T@\\n' | sort"
ENABLED = "systemctl list-unit-files --state=enabled --no-legend --no-pager"


def test_the_readmes_demo_leaves_the_machine_as_it_was(box):
    """`make demo` as root on a machine with systemd: what it installs (`make setup-demo`)
    and the demo itself (headless, stopped with Ctrl-C) enable no unit, start no sshd and
    change nothing under /etc."""
    tracked_copy(box.share / "repo")
    before = {"etc": box.sh(ETC).stdout, "enabled": box.sh(ENABLED).stdout}
    done = box.sh("make setup-demo", cwd="/root/work/repo", timeout=600)
    assert re.search(r"setup: ready: \.venv \(\d+ s\)", done.stdout), done.stdout
    box.sh("cd /root/work/repo; .venv/bin/nebula demo --headless > demo.out 2>&1 & demo=$!; "
           "for i in $(seq 90); do grep -q 'export NEBULA_HOME' demo.out && break; sleep 1; done; "
           ".venv/bin/nebula status --home /root/.nebula/demo >/dev/null; kill -INT $demo; "
           "for i in $(seq 30); do kill -0 $demo 2>/dev/null || exit 0; sleep 1; done; exit 1",
           timeout=180)
    # (the box shares the host's network: the host's own port 22 is not the demo's doing)
    assert box.sh("pgrep -x sshd", check=False).returncode == 1, "an sshd runs in the box"
    assert "install ok installed" not in box.sh("dpkg-query -W -f='${Status}' openssh-server",
                                                 check=False).stdout
    after = {"etc": box.sh(ETC).stdout, "enabled": box.sh(ENABLED).stdout}
    assert after["enabled"] == before["enabled"]
    changed = set(after["etc"].splitlines()) ^ set(before["etc"].splitlines())
    assert not changed, sorted(changed)
