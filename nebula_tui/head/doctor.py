"""``nebula doctor``: what each node needs, checked, one line per check with the fix.

The head is the one author of the checks (the CLI and the TUI's node page display them):
what it already knows of a node (its SSH link, the nodelet's hello, the probes' problems)
plus one short read-only script run on the node's own connection, with the node's ``env``
from nodes.yaml, as the nodelet and every job get it. What a node does not need is no
failure: a container runtime is checked only where a job asks for an image or nodes.yaml
names a runtime; ``hidepid`` only where several users' jobs share the nodes
(``run_as: submitter``).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from pathlib import Path
from typing import Literal

from ..model import NodeState
from ..node_admin import known_key
from ..remote.ssh import NodeUnavailable
from ..wire import DoctorCheck, DoctorReply
from .state import HeadState

#: ✓ passes, ✗ fails (exit 1), ! worth knowing (no failure), - not needed here.
Status = Literal["ok", "fail", "warn", "skip"]
OK: Status = "ok"
FAIL: Status = "fail"
WARN: Status = "warn"
SKIP: Status = "skip"
#: How far a node's clock may be from the head's before times mislead (seconds).
CLOCK_SLACK_S = 2.0
#: Free space below which job directories (logs) may fill the disk.
MIN_FREE_MB = 1024
#: How long the node's script may take.
SCRIPT_TIMEOUT_S = 20.0
#: Python the nodelet needs on a node.
MIN_PYTHON = (3, 6)

# Each line "key value"; nothing user-given is inside this text: the job directory and
# the user asked for come as quoted arguments.
_SCRIPT = r'''dir=$1 user=$2 runtimes=$3
echo "tmux $(command -v tmux)"
echo "python3 $(python3 -c 'import sys; print(sys.version.split()[0])' 2>&1 | head -n 1)"
echo "clock $(python3 -c 'import time; print(time.time())' 2>/dev/null)"
echo "free_kb $(df -Pk "$dir" 2>/dev/null | awk 'NR==2 {print $4}')"
echo "proc $(awk '$2 == "/proc" {print $4; exit}' /proc/mounts 2>/dev/null)"
if command -v nvidia-smi >/dev/null; then
  echo "persistence $(nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader 2>/dev/null | tr '\n' ';')"
fi
if [ -n "$user" ]; then
  if [ "$(id -u)" = 0 ]; then echo "run_as runuser"
  elif sudo -n -u "$user" -- true 2>/dev/null; then echo "run_as sudo"
  else echo "run_as no"; fi
fi
for rt in $runtimes; do
  case $rt in
    apptainer) apptainer --version >/dev/null 2>&1 && echo "runtime_ok $rt" || echo "runtime_no $rt" ;;
    *) "$rt" info >/dev/null 2>&1 && echo "runtime_ok $rt" || echo "runtime_no $rt" ;;
  esac
done
'''


def line(check: str, status: Status, text: str, fix: str = "") -> DoctorCheck:
    return {"check": check, "status": status, "text": text, "fix": fix}


class Doctor:
    def __init__(self, state: HeadState) -> None:
        self.state = state

    async def check(self, user: str, names: list[str]) -> DoctorReply:
        """Every check of each node named (all when none), and whether none failed."""
        for name in names:
            self.state.node(name)  # an unknown name: one line saying which nodes there are
        names = names or [n.name for n in self.state.config.nodes]
        found = await asyncio.gather(*(self._node(user, n) for n in names))
        nodes: dict[str, list[DoctorCheck]] = dict(zip(names, found))
        return {"nodes": nodes,
                "passed": all(c["status"] != FAIL for checks in nodes.values() for c in checks)}

    async def _node(self, user: str, name: str) -> list[DoctorCheck]:
        config, view = self.state.config.node(name), self.state.nodes[name]
        key = config.identity or "the default keys in ~/.ssh"
        where = f"{config.host}:{config.port}"
        checks: list[DoctorCheck] = []
        if view.state == NodeState.UP:
            checks.append(line("ssh", OK, f"{config.user}@{where} with {key}, host key checked "
                                          f"against {config.known_hosts}"))
        else:
            checks.append(line("ssh", FAIL, f"{where} with {key} and {config.known_hosts}: "
                                            f"{view.detail or view.reason or view.state.value}"))
        known = known_key(Path(config.known_hosts), config.host, config.port)
        checks.append(line("host key", OK, f"{config.known_hosts} knows {where}") if known else
                       line("host key", FAIL, f"{config.known_hosts} has no key for {where}",
                            f"nebula node remove {name}, then nebula node add {name} {config.host} "
                            f"--port {config.port} (it shows the fingerprint to check)"))
        if view.state != NodeState.UP:
            return checks + [line("node", SKIP, "the other checks need SSH")]
        try:
            found, sent, answered = await self._run_script(user, name)
        except (NodeUnavailable, asyncio.TimeoutError, OSError) as err:
            return checks + [line("node", FAIL, f"the checks did not run: {err or 'no answer'}",
                                  "see the ssh line")]
        found_checks = [self._python(found), self._tmux(found), *self._vendors(name, found),
                        self._clock(found, sent, answered), self._disk(found, view.hello.node_dir),
                        self._run_as(user, found), *self._runtimes(name, found), self._hidepid(found)]
        return checks + [c for c in found_checks if c is not None]

    async def _run_script(self, user: str, name: str) -> tuple[dict[str, str], float, float]:
        view = self.state.nodes[name]
        runas = user if self._shared() and user != self.state.config.node(name).user else ""
        argv = ["sh", "-c", _SCRIPT, "doctor", view.hello.node_dir or "~",
                runas, " ".join(self._needed_runtimes(name))]
        sent = time.time()
        out = await self.state.links[name].run_check(shlex.join(argv), SCRIPT_TIMEOUT_S)
        answered = time.time()
        found: dict[str, str] = {}
        for text in out.splitlines():
            key, _, value = text.partition(" ")
            found[key] = (found[key] + " " + value) if key in found else value.strip()
        return found, sent, answered

    # ------------------------------------------------------------------ the checks
    @staticmethod
    def _python(found: dict) -> DoctorCheck:
        version = found.get("python3", "")
        parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if len(parts) == 2 and parts >= MIN_PYTHON:
            return line("python3", OK, f"python3 {version}")
        return line("python3", FAIL, f"python3 {version or 'not found'} (the nodelet needs 3.6 or newer)",
                    "install python3 (apt install python3) where the login's PATH finds it")

    @staticmethod
    def _tmux(found: dict) -> DoctorCheck:
        if found.get("tmux"):
            return line("tmux", OK, f"tmux at {found['tmux']}")
        return line("tmux", FAIL, "tmux not found in the login's PATH (jobs run in tmux sessions)",
                    "install tmux (apt install tmux), or put its directory in PATH (env: in nodes.yaml)")

    def _vendors(self, name: str, found: dict) -> list[DoctorCheck]:
        view = self.state.nodes[name]
        checks: list[DoctorCheck] = []
        backends = view.hello.backends
        for vendor in sorted({v for b in backends if (v := b.get("vendor"))}):
            used = ", ".join(b["name"] for b in backends if b.get("vendor") == vendor)
            cards = sum(1 for g in self.state.gpus.values() if g.node == name and g.reading.vendor == vendor)
            if view.reason:  # an up node's reason is what its last probe could not read
                checks.append(line(vendor, FAIL, f"{used}: {view.reason}",
                                   "see `nebula node show " + name + "`"))
            else:
                checks.append(line(vendor, OK, f"{used} answers: {cards} card(s) read"))
        if any(b.get("vendor") == "nvidia" for b in backends):
            if not any(b.get("name") == "nvml" for b in backends):
                checks.append(line("nvml", WARN, "libnvidia-ml.so.1 does not load: read through "
                                                 "nvidia-smi (a process each probe)",
                                   "install the driver's NVML library (libnvidia-ml)"))
            off = [p.split(",")[0].strip() for p in found.get("persistence", "").split(";")
                   if p.strip() and "enabled" not in p.lower()]
            if off:
                checks.append(line("persistence", WARN, f"persistence mode off on GPU {', '.join(off)}: "
                                                        "each job start waits for the driver",
                                   "nvidia-smi -pm 1 (or enable nvidia-persistenced)"))
        if not backends:
            checks.append(line("gpus", FAIL, "no GPU tool answered",
                               "install the vendor's driver and tool (nvidia-smi, amd-smi, xpu-smi, npu-smi)"))
        return checks

    @staticmethod
    def _clock(found: dict, sent: float, answered: float) -> DoctorCheck:
        try:
            node = float(found.get("clock", ""))
        except ValueError:
            return line("clock", FAIL, "the node's clock could not be read", "check python3")
        off = node - (sent + answered) / 2
        if abs(off) <= CLOCK_SLACK_S + (answered - sent) / 2:
            return line("clock", OK, f"within {CLOCK_SLACK_S:g} s of the head's ({off:+.1f} s)")
        return line("clock", FAIL, f"{abs(off):.0f} s {'ahead of' if off > 0 else 'behind'} the head's",
                    "run a time service on both (chrony or systemd-timesyncd)")

    @staticmethod
    def _disk(found: dict, where: str | None) -> DoctorCheck:
        free = found.get("free_kb", "")
        if not free.isdigit():
            return line("disk", FAIL, f"free space of {where} could not be read", "check the job directory")
        mb = int(free) // 1024
        if mb >= MIN_FREE_MB:
            return line("disk", OK, f"{mb / 1024:,.1f} GB free where job directories live ({where})")
        return line("disk", FAIL, f"{mb} MB free where job directories live ({where})",
                    "free space there (old job directories go after their retention)")

    def _shared(self) -> bool:
        return self.state.config.run_as == "submitter"

    def _run_as(self, user: str, found: dict) -> DoctorCheck | None:
        if not self._shared():
            return None
        how = found.get("run_as")
        if how is None:  # the login is the user: nothing to switch
            return line("run_as", OK, f"jobs of {user} run as the login itself")
        if how in ("runuser", "sudo"):
            via = "runuser: the login is root" if how == "runuser" else "sudo -n -u"
            return line("run_as", OK, f"jobs can run as {user} ({via})")
        return line("run_as", FAIL, f"the login cannot run a job as {user} (run_as: submitter)",
                    "log in as root, or give the login a sudoers rule: LOGIN ALL=(ALL) NOPASSWD: ALL")

    def _needed_runtimes(self, name: str) -> list[str]:
        """The runtimes a job here would use: nodes.yaml's, or those the node has when a job
        asks for an image; none where no job needs one."""
        node = self.state.config.node(name)
        pinned = getattr(node, "runtime", None)
        if pinned:
            return [pinned]
        wanted = any(j.spec.image for j in self.state.jobs.values())
        return list(self.state.nodes[name].hello.runtimes)[:1] if wanted else []

    def _runtimes(self, name: str, found: dict) -> list[DoctorCheck]:
        needed = self._needed_runtimes(name)
        if not needed and any(j.spec.image for j in self.state.jobs.values()):
            return [line("containers", FAIL, "a job asks for an image and no container runtime is here",
                         "install podman (or docker, apptainer) for the login user")]
        good = found.get("runtime_ok", "").split()
        return [line("containers", OK, f"{rt} runs") if rt in good else
                line("containers", FAIL, f"{rt} does not run for the login user",
                     f"check `{rt} info` as that user") for rt in needed]

    def _hidepid(self, found: dict) -> DoctorCheck | None:
        if not self._shared():
            return None
        options = found.get("proc", "")
        if any(o.startswith("hidepid=") and o != "hidepid=0" for o in options.split(",")):
            return line("hidepid", OK, f"/proc is mounted {options}: users do not see each other's commands")
        return line("hidepid", FAIL, "/proc shows every user's command lines to every job here",
                    "mount -o remount,hidepid=invisible /proc (and in /etc/fstab)")

