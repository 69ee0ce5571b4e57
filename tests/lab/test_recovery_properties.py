"""Random interleavings of what a head lives through: SIGKILL, its database restored from a
backup, a second head on the same nodes, a node going silent. After each sequence:

* no job ran twice (every start its command logged is its only one);
* no job the store acknowledged is lost: every id handed out is in the database and ended,
  except ids handed out after the backup that was restored whose job never reached a node
  (the restore took them; their ids are never handed out again), and every job that did
  reach a node is in the database with the end it had there;
* no job is "running" without a process, and no GPU is held by a job that ended.

Bounded: SEQUENCES seeded sequences of STEPS steps, loopback only (the session's lab).
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from labkit.harness import wait_for
from labkit.harness import FINISHED, HeadProcess
from support.stores import never_overcommitted

SEQUENCES = 2
STEPS = 8
OPS = ("submit", "submit", "kill", "backup", "restore", "second_head", "silence")


class World:
    """One sequence: the head under test, its backups, and what was handed out."""

    def __init__(self, lab, root: Path, rng: random.Random):
        self.lab, self.root, self.rng = lab, root, rng
        self.ran = root / "ran.txt"
        self.head = HeadProcess(root / "home", lab)
        self.acknowledged: set[int] = set()
        self.at_risk: set[int] = set()  # handed out after the backup later restored
        self.backup: Path | None = None
        self.since_backup: set[int] = set()
        self.second_heads = 0

    def command(self, tag: str) -> list[str]:
        nap = self.rng.choice((0, 0.3, 1, 2))
        return ["sh", "-c", f'echo "{tag} $NEBULA_JOB_ID start" >> {self.ran}; sleep {nap}; '
                            f'echo "{tag} $NEBULA_JOB_ID end" >> {self.ran}']

    def submit(self) -> None:
        with self.head.client() as client:
            for _ in range(self.rng.randint(1, 4)):
                job = client.call("submit", command=self.command("A"), gpu_mem_mb=4096)["job"]["id"]
                assert job not in self.acknowledged, f"id {job} handed out twice"
                self.acknowledged.add(job)
                self.since_backup.add(job)

    def kill(self) -> None:
        self.head.kill()
        time.sleep(self.rng.uniform(0, 0.5))
        self.head.start(wait_nodes=False)

    def take_backup(self) -> None:
        self.backup = self.root / "backup.db"
        source, target = sqlite3.connect(self.head.home / "state.db"), sqlite3.connect(self.backup)
        with target:
            source.backup(target)
        source.close()
        target.close()
        self.since_backup = set()

    def restore(self) -> None:
        if self.backup is None:
            return self.take_backup()
        self.head.kill()
        db = self.head.home / "state.db"
        shutil.copy(self.backup, db)
        for suffix in ("-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        self.at_risk |= self.since_backup
        self.head.start(wait_nodes=False)

    def second_head(self) -> None:
        """Another home on the same nodes: its jobs get the same numbers."""
        self.second_heads += 1
        other = HeadProcess(self.root / f"second{self.second_heads}", self.lab)
        other.start()
        try:
            with other.client() as client:
                ids = [client.call("submit", command=self.command(f"B{self.second_heads}"),
                                   gpu_mem_mb=4096)["job"]["id"] for _ in range(2)]
            for job in ids:
                assert other.wait_job(job, 60)["state"] == "succeeded"
        finally:
            other.stop()

    def silence(self) -> None:
        node = self.rng.choice(sorted(self.lab.nodes))
        self.lab.stop_node(node)
        try:
            time.sleep(self.rng.uniform(1, 4))
        finally:
            self.lab.start_node(node)

    def step(self, op: str) -> None:
        {"submit": self.submit, "kill": self.kill, "backup": self.take_backup,
         "restore": self.restore, "second_head": self.second_head, "silence": self.silence}[op]()


def sequence(rng: random.Random) -> list[str]:
    """STEPS random steps, among them at least one restore of a backup taken earlier, with
    jobs handed out (and some running) between the two."""
    ops = [rng.choice(OPS) for _ in range(STEPS)]
    at = rng.randrange(2, STEPS)
    ops[at - 2:at + 1] = ["backup", "submit", "restore"]
    return ops


def restore_pending(db_path: Path) -> bool:
    """Whether the store still waits for nodes to tell what ran since its backup."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return db.execute("SELECT 1 FROM meta WHERE key = 'restore_pending'").fetchone() is not None
    finally:
        db.close()


def check(world: World) -> None:
    head = world.head
    db = sqlite3.connect(head.home / "state.db")
    states = dict(db.execute("SELECT id, state FROM jobs"))
    runs = Counter()
    ends = set()
    for line in world.ran.read_text().split("\n") if world.ran.exists() else []:
        if line.strip():
            tag, job, what = line.split()
            runs[(tag, int(job), what)] += 1
            if what == "end":
                ends.add((tag, int(job)))
    twice = sorted(key for key, n in runs.items() if n > 1)
    assert not twice, f"ran twice: {twice}"
    started = {job for tag, job, what in runs if tag == "A" and what == "start"}
    for job in world.acknowledged:
        if job in states:
            assert states[job] in FINISHED, f"job {job} is {states[job]} at the end"
        else:
            assert job in world.at_risk and job not in started, \
                f"job {job} was acknowledged{' and ran' if job in started else ''} but is lost"
    for job in started:
        assert job in states, f"job {job} ran but the store lost it"
        if ("A", job) in ends:
            assert states[job] == "succeeded", f"job {job} ended well but is {states[job]}"
    held = db.execute("SELECT COUNT(*) FROM allocations WHERE released_at IS NULL").fetchone()[0]
    assert held == 0, f"{held} GPU allocations still held after every job ended"
    db.close()
    never_overcommitted(head.home / "state.db")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", range(SEQUENCES))
def test_random_crashes_restores_second_heads_and_silences(openssh_lab, tmp_path, seed):
    rng = random.Random(1800 + seed)
    world = World(openssh_lab, tmp_path, rng)
    world.head.start()
    try:
        world.submit()
        ops = sequence(rng)
        print(f"seed {seed}: {' '.join(ops)}")
        for op in ops:
            world.step(op)
            time.sleep(rng.uniform(0, 1.5))
        world.head.stop()
        world.head.start()

        def all_ended():
            # A job the restored store lost is in no queue until its node has told of it:
            # first every node has (the store is no longer waiting on them), then the ends.
            if restore_pending(world.head.home / "state.db"):
                return False
            with world.head.client() as client:
                return all(j["state"] in FINISHED
                           for j in client.call("queue")["jobs"] if j["id"] in world.acknowledged)
        wait_for(all_ended, 180, interval=0.5, what="every node to tell what ran, and every job to end")
    finally:
        world.head.stop()
    check(world)
