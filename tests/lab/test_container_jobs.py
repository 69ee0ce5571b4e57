"""Container jobs run for real with podman on the simulated lab (real sshd, tmux, podman).

The image is ``localhost/nebula-busybox``, made offline by ``scripts/podman-setup.sh`` (run
by ``scripts/test-deps.sh`` as root) from Debian's busybox-static. The lab's cards reach
containers as CDI devices (``sim/containers.py``), so a job sees exactly its own
``/dev/nvidia<N>``. Skipped, with podman's own words, where podman cannot run a container.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from labkit.harness import wait_for
from nebula_tui.api import ApiError
from labkit.harness import HeadProcess
import support.head
from support.containers import IMAGE, PROBLEM
from support.head import log, running, submit, submitted_id

GRACE_S = 3

pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")


def _config(lab) -> Path:
    """The lab's cluster file with a short isolation grace, beside it (`nebula sim` looks
    for the lab there)."""
    config = yaml.safe_load(lab.config_path.read_text())
    config["health"] = {"isolation_grace": f"{GRACE_S}s"}
    path = lab.root / "nodes-containers.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def head(openssh_lab, tmp_path_factory):
    h = HeadProcess(tmp_path_factory.mktemp("container-home"), openssh_lab,
                    config=_config(openssh_lab))
    h.start()
    try:
        yield h
    finally:
        for job in h.call("queue")["jobs"]:
            if job["state"] in ("running", "launching", "pending"):
                h.call("cancel", job=job["id"])
        h.stop()


def submit_in_image(head, *args) -> int:
    """``nebula submit --image IMAGE ARGS``: the job runs in this module's image."""
    return submit(head, "--image", IMAGE, *args)


def _sim_dirs() -> dict[str, str]:
    """Every nebula container on this machine, by name: the lab directory it was started for."""
    names = subprocess.run(["podman", "ps", "-a", "--filter", "name=^nebula-", "--format",
                            "{{.Names}}"], capture_output=True, text=True, timeout=60,
                           cwd="/").stdout.split()
    found = {}
    for name in names:
        env = subprocess.run(["podman", "inspect", "--format",
                              "{{range .Config.Env}}{{println .}}{{end}}", name],
                             capture_output=True, text=True, timeout=60, cwd="/").stdout
        found[name] = next((line.split("=", 1)[1] for line in env.splitlines()
                            if line.startswith("NEBULA_SIM_DIR=")), "")
    return found


def containers_of(head, job_id: int) -> list[str]:
    """The containers of this lab's job ``job_id`` (another run's lab may have its own job
    of that number on this machine)."""
    lab = str(head.lab.root)
    return [name for name, sim_dir in _sim_dirs().items()
            if name.startswith(f"nebula-{job_id}-") and sim_dir.startswith(lab + "/")]


@pytest.fixture(scope="module", autouse=True)
def no_stale_containers():
    """Containers left by a test run that was killed, whose lab is gone, are removed first:
    they would hold their names and the machine's memory."""
    stale = [name for name, sim_dir in _sim_dirs().items() if sim_dir and not os.path.isdir(sim_dir)]
    if stale:
        subprocess.run(["podman", "rm", "-f", *stale], capture_output=True, timeout=120, cwd="/")


def test_a_job_sees_its_cards_variables_and_data_and_keeps_its_exit_code(head, tmp_path):
    data = tmp_path / "llama-dataset"
    data.mkdir()
    (data / "shard-0.txt").write_text("tokens\n")
    job_id = submit_in_image(head, "--name", "llama-ft-001", "--gpu-count", "2", "--gpu-mem", "24G",
                    "--workdir", "/workspace", "--data-mount", f"{data}:/workspace/data:ro",
                    "--command", "pwd; ls /dev | grep nvidia; env; cat data/shard-0.txt; "
                                 "touch data/x 2>/dev/null || echo read-only; exit 3")
    job = head.wait_job(job_id, 60)
    assert (job["state"], job["exit_code"], job["reason"]) == ("failed", 3, "")
    out = log(head, job_id).splitlines()
    assert out[0] == "/workspace"
    env = dict(line.split("=", 1) for line in out if "=" in line)
    given = env["NEBULA_GPU_LIST"].split(",")
    indexes = sorted(g["index"] for g in head.call("gpus")["gpus"]
                     if g["uuid"] in given and g["node"] == job["node"])
    # Exactly its two cards (plus the control device), whatever the node has.
    assert [line for line in out if line.startswith("nvidia")] == \
        [f"nvidia{i}" for i in indexes] + ["nvidiactl"]
    assert env["NEBULA_JOB_ID"] == str(job_id) and env["NEBULA_JOB_NAME"] == "llama-ft-001"
    assert env["CUDA_VISIBLE_DEVICES"] == env["NEBULA_GPU_LIST"]  # UUIDs, in allocation order
    assert env["NEBULA_GPU_MEM_MB"] == "24576"
    assert "tokens" in out and "read-only" in out
    assert containers_of(head, job_id) == []  # --rm: nothing left behind


def test_its_memory_shows_on_its_cards_while_it_runs(head):
    job_id = submit_in_image(head, "--gpu-mem", "6G", "--", "sleep", "30")
    job = running(head, job_id)
    card = job["gpus"][0]

    def used():
        gpu = support.head.gpu(head, card["uuid"])
        return gpu["memory_used_mb"] >= 6 * 1024 and gpu
    wait_for(used, 20, what="the container's process on its card")
    head.call("cancel", job=job_id)
    assert head.wait_job(job_id, 40)["state"] == "cancelled"


def test_its_gpu_processes_are_its_own_by_their_cgroup_and_guarded(head):
    """The container's processes are children of podman's monitor, not of the job's tmux
    pane: the node tells them the job's by the container their cgroup names. So its card
    shows no unmanaged memory, and memory beyond its reservation is the guard's."""
    job_id = submit_in_image(head, "--gpu-mem", "4G", "--", "env", "NEBULA_SIM_GPU_MEM=12G", "sleep", "60")
    card = running(head, job_id)["gpus"][0]
    try:
        def attributed():
            # its command's 12 GB, and what the simulated card gives the container's init; a
            # probe may first catch the container before `env` has become `sleep` (8 GB). The
            # card may be the laptop's 8 GB one, which shows no more than it has.
            gpu = support.head.gpu(head, card["uuid"])
            held = min(12 * 1024, gpu["total_memory_mb"])
            return (gpu["processes"] and all(p["job_id"] == job_id for p in gpu["processes"])
                    and gpu["memory_used_mb"] >= held and gpu)
        def instead():
            gpu = support.head.gpu(head, card["uuid"])
            job = head.call("job", job=job_id)["job"]
            events = [e["message"] for e in head.call("events", limit=30)["events"]]
            return (f"card: {gpu}\njob: {job['state']} {job.get('reason')}\n"
                    f"containers: {containers_of(head, job_id)}\nevents: {events}")
        gpu = wait_for(attributed, 60, what="the container's 12 GB attributed to its job",
                       seen=instead)
        assert gpu["unmanaged_used_mb"] == 0, gpu
        said = wait_for(lambda: [e for e in head.call("events", limit=200)["events"]
                                 if f"job {job_id} holds " in e["message"]], 60,
                        what="the guard's event")
        held_gb = re.search(r"holds (\d+(?:\.\d)?) GB on node\d+:\d, over its 4 GB reservation",
                            said[0]["message"])
        assert held_gb and float(held_gb.group(1)) > 4, said
    finally:
        with contextlib.suppress(ApiError):  # the guard may have ended it already
            head.call("cancel", job=job_id)
        head.wait_job(job_id, 40)


def test_sigusr1_reaches_the_command_inside_the_container(head, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job_id = submit_in_image(head, "--no-requeue", "--data-mount", f"{ckpt}:/ckpt",
                    "--command", "trap 'echo saved > /ckpt/step-100; exit 0' USR1; "
                                 "while :; do sleep 0.2; done")
    job = running(head, job_id)
    wait_for(lambda: containers_of(head, job_id), 20, what="the container to be up")
    card = job["gpus"][0]
    done = head.run("sim", "inject", "xid", "95", "--node", card["node"], "--gpu", str(card["index"]))
    assert done.returncode == 0, done.stderr
    ended = head.wait_job(job_id, 30)
    assert ended["state"] == "failed" and "was isolated (Xid 95" in ended["reason"]
    assert (ckpt / "step-100").read_text() == "saved\n"
    wait_for(lambda: any("back in service" in e["message"]
                         for e in head.call("events", limit=200)["events"]), 30,
             what="the card back in service")


def test_cancel_stops_the_container(head):
    job_id = submit_in_image(head, "--command", "trap 'echo bye; exit 0' TERM; while :; do sleep 0.2; done")
    running(head, job_id)
    wait_for(lambda: containers_of(head, job_id), 20, what="the container to be up")
    head.call("cancel", job=job_id)
    assert head.wait_job(job_id, 40)["state"] == "cancelled"
    assert "bye" in log(head, job_id)  # SIGTERM reached the command: a clean stop
    wait_for(lambda: containers_of(head, job_id) == [], 20, what="the container to be gone")


def test_a_failed_pull_fails_the_job_with_the_runtimes_words_and_frees_the_card(head):
    done = head.run("submit", "--image", "127.0.0.1:1/lab/none:1", "--", "true", check=True)
    job = head.wait_job(submitted_id(done.stdout), 60)
    assert job["state"] == "failed"
    assert job["reason"].startswith("pulling 127.0.0.1:1/lab/none:1 on node0")
    assert "connection refused" in job["reason"]
    assert not any(job["id"] in g["jobs"] for g in head.call("gpus")["gpus"])


def test_a_pull_shows_as_the_jobs_state_until_it_fails(head):
    """A registry on loopback that takes the connection and never answers: the pull hangs
    (shown as the running job's reason), then fails with podman's words when it goes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        done = head.run("submit", "--image", f"127.0.0.1:{port}/lab/slow:1", "--", "true", check=True)
        job_id = submitted_id(done.stdout)
        pulling = wait_for(lambda: (j := head.job(job_id))["reason"].startswith("pulling image")
                           and j, 30, what="the pull to show")
        assert pulling["state"] == "running"
        assert pulling["reason"] == f"pulling image 127.0.0.1:{port}/lab/slow:1"
        queue = head.run("queue", check=True).stdout
        assert f"pulling image 127.0.0.1:{port}/lab/slow:1" in queue
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
    job = head.wait_job(job_id, 60)
    assert job["state"] == "failed" and job["reason"].startswith(
        f"pulling 127.0.0.1:{port}/lab/slow:1 on {job['node']} failed: ")


def test_a_mount_source_missing_on_the_node_fails_the_job_at_once(head, tmp_path):
    gone = tmp_path / "not-here"
    done = head.run("submit", "--image", IMAGE, "--data-mount", f"{gone}:/data", "--", "true",
                    check=True)
    job = head.wait_job(submitted_id(done.stdout), 30)
    assert job["state"] == "failed"
    assert job["reason"] == f"--data-mount's source {gone} does not exist on {job['node']} " \
                            f"(or root cannot reach it)"
    assert log(head, job["id"]) == f"nebula: {job['reason']}\n"


def test_the_head_killed_mid_run_readopts_the_container(openssh_lab, tmp_path):
    head = HeadProcess(tmp_path / "home", openssh_lab)
    head.start()
    flag = tmp_path / "flag"
    flag.mkdir()
    try:
        job_id = submit_in_image(head, "--data-mount", f"{flag}:/flag", "--command",
                        "echo started; while [ ! -e /flag/go ]; do sleep 0.2; done; echo done; exit 4")
        running(head, job_id)
        wait_for(lambda: containers_of(head, job_id), 20, what="the container to be up")
        head.kill()
        head.start()
        assert head.job(job_id)["state"] == "running"
        (flag / "go").touch()
        job = head.wait_job(job_id, 30)
        assert (job["state"], job["exit_code"], job["attempt"]) == ("failed", 4, 0)
        assert log(head, job_id).split() == ["started", "done"]  # one run, never two
    finally:
        head.stop()


def test_nebula_run_with_an_image_is_a_shell_in_the_container(head):
    """`nebula run --image … -- sh` in a real terminal (a pane of a tmux server of our own)."""
    tmux = ["tmux", "-L", "nebula-run-image-test"]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in head.env.items()
                   if k.startswith("NEBULA") or k == "PATH")
    subprocess.run([*tmux, "kill-server"], capture_output=True)
    subprocess.run([*tmux, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "100", "-y", "30",
                    "sh", "-c", f"env {env} TERM=screen {shlex.quote(sys.executable)} -m nebula_tui "
                    f"run --pty --image {IMAGE} --gpu-mem 4G -- sh; echo run-exit=$?; sleep 600"], check=True)

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "t"], capture_output=True,
                              text=True).stdout
    try:
        wait_for(lambda: "\n/ #" in screen(), 60, what="the container's shell prompt")
        subprocess.run([*tmux, "send-keys", "-t", "t", "tty; ls /dev | grep -c '^nvidia[0-9]'",
                        "Enter"], check=True)
        shown = wait_for(lambda: re.search(r"/dev/pts/\d+\n(\d+)\n", screen()), 20,
                         what="its terminal and its cards")
        assert shown.group(1) == "1"  # one card: the one it asked for
        subprocess.run([*tmux, "send-keys", "-t", "t", "exit 5", "Enter"], check=True)
        try:
            wait_for(lambda: "run-exit=5" in screen(), 30, what="the shell's exit ending the job")
        except AssertionError as err:
            raise AssertionError(f"{err}; the terminal showed:\n{screen()}") from None
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


SETUID_IMAGE = "localhost/nebula-test-setuid"
# Becomes root if the kernel lets it, then runs its arguments: what an image of a lab
# user's own (pulled from a registry they push to) may hold.
ROOTSH = "#include <unistd.h>\nint main(int c, char **v) { if (setgid(0) || setuid(0)) return 126; " \
         "execv(v[1], v + 1); return 127; }\n"


def _setuid_image(work: Path) -> None:
    (work / "rootsh.c").write_text(ROOTSH)
    subprocess.run(["gcc", "-static", "-o", str(work / "rootsh"), str(work / "rootsh.c")], check=True)
    (work / "Containerfile").write_text(f"FROM {IMAGE}\nCOPY rootsh /rootsh\nRUN chmod 4755 /rootsh\n")
    subprocess.run(["podman", "build", "-q", "--pull=never", "-t", SETUID_IMAGE, str(work)],
                   check=True, capture_output=True, timeout=300, cwd="/")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a setuid program")
def test_a_setuid_program_in_a_users_image_gives_them_no_root_on_the_node(
        openssh_lab, tmp_path_factory, tmp_path, request):
    """Rootful podman runs a lab user's command by their uid. A setuid-root program of their
    image would make it root inside the container, and root there reads every host file a
    data mount shows: here one only root may read."""
    from support.users import lab_users, shared_head, submit_as

    _setuid_image(tmp_path)
    request.addfinalizer(lambda: subprocess.run(["podman", "rmi", "-f", SETUID_IMAGE],
                                                capture_output=True, timeout=120, cwd="/"))
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "s").write_text("only-root-reads-this\n")
    (secret / "s").chmod(0o600)
    inside = "/host/" + str(secret.relative_to("/tmp")) + "/s"
    with contextlib.contextmanager(lab_users)("nebctrlab", ("nebctrann",), ()), \
            contextlib.contextmanager(shared_head)(openssh_lab, tmp_path_factory, "nebctrlab") as head:
        job = submit_as(head, "nebctrann", "--image", SETUID_IMAGE, "--data-mount", "/tmp:/host:ro",
                        "--gpu-mem", "1G", "--", "/rootsh", "/bin/cat", inside)
        ended = head.wait_job(job, timeout=120)
        output = head.run("logs", str(job)).stdout
        assert "only-root-reads-this" not in output
        assert (ended["state"], ended["exit_code"]) == ("failed", 126), (ended, output)
