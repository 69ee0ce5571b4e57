"""The real Slurm is the oracle: the same ``#SBATCH`` scripts and flag lines (durations,
dependencies, arrays, gres, names, output patterns) go to a real Slurm 22.05's ``sbatch``
(the ``slurm_lab`` fixture) and to ``nebula submit`` on the simulated lab, and both must
have understood the same time limit, GPU count, node count, name, dependency, array and
output file — ``scontrol show job`` on one side, ``nebula job --json`` on the other — or
both refuse. Skipped, with the reason, where Slurm cannot run."""

from __future__ import annotations

import math
import re
import subprocess

import pytest

from nebula_tui.units import parse_duration_s

#: (flags, script directives or None). ``{A}`` and ``{B}``: two jobs of each side, so a
#: dependency names jobs that exist there. A case naming no GPUs asks -G 1 on both sides.
CASES = [
    # durations: a bare number is minutes; Slurm's clock forms
    (["-t", "90"], None), (["-t", "1"], None), (["--time=45"], None), (["-t", "1:30"], None),
    (["-t", "90:00"], None), (["-t", "1:30:00"], None), (["-t", "0:00:30"], None),
    (["-t", "2-12"], None), (["-t", "1-0:30"], None), (["-t", "1-2:03:04"], None),
    (["-t", "100:00:00"], None), ([], ["-t 2:00:00"]), (["-t", "90"], ["--time=30"]),
    # GPUs and nodes
    (["-G", "2"], None), (["--gpus=3"], None), (["--gres=gpu:2"], None), (["--gres=gpu"], None),
    (["--gres=gpu:1", "-N", "2"], None), (["-N", "2", "-G", "4"], None), (["-N", "1", "-G", "1"], None),
    ([], ["--gres=gpu:2"]), (["-G", "1"], ["-G 3"]),
    # names
    (["-J", "trainjob"], None), (["--job-name=a-b.c"], None), (["-J", "cli"], ["-J script"]),
    ([], ["--job-name=fromscript"]),
    # dependencies
    (["-d", "afterok:{A}"], None), (["-d", "afterok:{A}:{B}"], None), (["-d", "afterany:{A}"], None),
    (["-d", "afternotok:{A}"], None), (["-d", "after:{A}"], None), (["--dependency={A}"], None),
    ([], ["--dependency=afterok:{A}"]),
    # output files and their patterns
    (["-o", "out.txt"], None), (["-o", "%x-%j.out"], None), (["-o", "logs-%u-%j.txt"], None),
    (["-e", "err-%j.txt", "-o", "out-%j.txt"], None), (["-J", "named", "-o", "%x.log"], None),
    ([], ["--output=%x-%j.out", "--job-name=train"]), (["-o", "/tmp/abs-%j.out"], None),
    # arrays
    (["-a", "0-3"], None), (["--array=1,3,5-7"], None), (["-a", "0-9%2"], None),
    # the environment and the nodes: a variable set; a node neither cluster has
    (["--export=ALL,MY_VAR=1"], None), ([], ["--export=MY_VAR=x"]),
    (["-w", "nosuchnode99"], None), (["-x", "nosuchnode[1-2]"], None),
    # what both refuse
    (["-t", "abc"], None), (["-t", "1:2:3:4"], None), (["-t", "1-2-3"], None),
    (["-d", "nosuch:{A}"], None), (["-a", "5-2"], None), (["-a", "x"], None),
    (["-N", "abc"], None), (["-d", "afterok:abc"], None), (["--gres=gpu:x:y:z"], None),
]
SCRIPT_BODY = "sleep 300\n"


def _script(folder, index: int, directives: list[str] | None, ids: dict) -> str:
    if directives is None:
        name = "job.sh"
        text = "#!/bin/sh\n" + SCRIPT_BODY
    else:
        name = f"case{index}.sh"
        text = "#!/bin/sh\n" + "".join(f"#SBATCH {d.format(**ids)}\n" for d in directives) + SCRIPT_BODY
    (folder / name).write_text(text)
    return name


def _flags(flags: list[str], directives: list[str] | None, ids: dict) -> list[str]:
    words = [f.format(**ids) for f in flags]
    every = " ".join([*flags, *(directives or [])])
    if not re.search(r"(^| )(-G|--gpus|--gres)", every):
        words = ["-G", "1", *words]
    return words


def _slurm_meaning(fields: dict, ids: dict) -> dict:
    """What Slurm understood, from ``scontrol show job -o``'s fields."""
    limit = fields["TimeLimit"]
    nodes = int(fields["NumNodes"].split("-")[0])
    # gres:gpu:2 per node or per job; a bare gres:gpu is one
    per_node = re.search(r"gpu(?::(\d+))?$", fields.get("TresPerNode", ""))
    per_job = re.search(r"gpu(?::(\d+))?$", fields.get("TresPerJob", ""))
    gpus = (int(per_node.group(1) or 1) * nodes if per_node else
            int(per_job.group(1) or 1) if per_job else 0)
    deps = re.findall(r"(after\w*):(\d+)", fields.get("Dependency", ""))
    names = {v: k for k, v in ids.items()}
    job = fields["JobId"]
    array = fields.get("ArrayTaskId")
    return {
        "minutes": None if limit == "UNLIMITED" else round(parse_duration_s(limit) / 60),
        "gpus": gpus, "nodes": nodes, "name": fields["JobName"],
        "dependency": sorted({(kind, names.get(i, i)) for kind, i in deps}),
        "output": _marked(fields.get("StdOut"), job), "error": _marked(fields.get("StdErr"), job),
        "array": array.split("%")[0] if array else None,
    }


def _marked(path: str | None, job: str) -> str:
    """A file's path with its side's job id as ``{id}`` (in the file's name only)."""
    folder, _, name = (path or "").rpartition("/")
    return f"{folder}/{name.replace(job, '{id}')}"


_KIND = {"ok": "afterok", "any": "afterany", "notok": "afternotok", "started": "after"}


def _our_meaning(job: dict, ids: dict) -> dict:
    names = {str(v): k for k, v in ids.items()}
    array = job.get("array")
    return {
        "minutes": math.ceil(job["time_limit_s"] / 60) if job["time_limit_s"] else None,
        "gpus": job["gpu_count"], "nodes": job["nodes"], "name": job["name"],
        "dependency": sorted({(_KIND[job["after_type"]], names.get(str(i), str(i))) for i in job["after"]}),
        "output": _marked(job.get("output"), str(job["id"])),
        "error": _marked(job.get("error"), str(job["id"])),
        "array": array.split("%")[0] if array else None,
    }


def _scontrol(slurm_lab, job: str) -> dict:
    out = slurm_lab.cluster.run(["scontrol", "show", "job", "-o", job])
    first = out.splitlines()[0]
    return dict(re.findall(r"(\w+)=(\S*)", first))


@pytest.fixture(scope="module")
def sides(slurm_lab, head, tmp_path_factory):
    """A folder both read (Slurm's jobs run as root there), and two held jobs a side."""
    folder = slurm_lab.root / "jobs" / "oracle"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o777)
    (folder / "job.sh").write_text("#!/bin/sh\n" + SCRIPT_BODY)
    env = slurm_lab.cluster.env
    slurm_ids = {k: subprocess.run(["sbatch", "-H", "--parsable", "-G", "1", "job.sh"], cwd=folder, env=env,
                                   capture_output=True, text=True, check=True).stdout.strip()
                 for k in "AB"}
    ours = {k: int(head.run("submit", "--parsable", "--gpu-mem", "4G", "--", "sleep", "600",
                            check=True).stdout) for k in "AB"}
    yield folder, slurm_ids, ours
    subprocess.run(["scancel", *slurm_ids.values()], env=env, capture_output=True)
    for job in ours.values():
        head.run("cancel", str(job))


def test_there_are_at_least_forty_cases_and_some_both_refuse():
    assert len(CASES) >= 40
    assert sum(1 for flags, _ in CASES if "abc" in flags or "x" in flags) >= 2


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[" ".join([*f, *(f"#SBATCH {d}" for d in (s or []))]) for f, s in CASES])
def test_sbatch_and_nebula_understand_the_same(index, sides, slurm_lab, head):
    folder, slurm_ids, our_ids = sides
    flags, directives = CASES[index]
    slurm_script = _script(folder, index, directives, slurm_ids)
    slurm = subprocess.run(["sbatch", "-H", "--parsable", *_flags(flags, directives, slurm_ids), slurm_script],
                           cwd=folder, env=slurm_lab.cluster.env, capture_output=True, text=True, timeout=60)
    our_script = _script(folder, index, directives, {k: str(v) for k, v in our_ids.items()})
    ours = head.run("submit", "--parsable", *_flags(flags, directives, our_ids), our_script, cwd=folder,
                    timeout=60)
    try:
        if slurm.returncode != 0:
            assert ours.returncode == 2, (slurm.stderr, ours.stdout, ours.stderr)
            assert ours.stderr.count("\n") == 1 and "Traceback" not in ours.stderr, ours.stderr
            return
        assert ours.returncode == 0, (slurm.stdout, ours.stderr)
        fields = _scontrol(slurm_lab, slurm.stdout.strip().split(";")[0])
        job = __import__("json").loads(head.run("job", "--json", ours.stdout.strip(), check=True).stdout)
        theirs, mine = _slurm_meaning(fields, slurm_ids), _our_meaning(job, our_ids)
        every = " ".join([*flags, *(directives or [])])
        # sbatch's default file; ours: none (whole options: "--export" holds "-e")
        if not re.search(r"(?:^|\s)(?:-o|-e|--output|--error)(?:[\s=]|$)", every):
            for key in ("output", "error"):
                theirs.pop(key), mine.pop(key)
        assert mine == theirs
    finally:
        if slurm.returncode == 0:
            subprocess.run(["scancel", slurm.stdout.strip().split(";")[0]], env=slurm_lab.cluster.env,
                           capture_output=True)
        if ours.returncode == 0:
            head.run("cancel", ours.stdout.strip())
