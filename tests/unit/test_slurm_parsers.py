"""Slurm's outputs read by the pool (nebula_tui/pools/slurm_parse.py), against real ones
captured from Debian's slurm-wlm 22.05.8 (tests/data/slurm/SOURCES-core.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula_tui.model import JobState
from nebula_tui.pools import slurm_parse as parse
from nebula_tui.pools.squeue_stream import MAX_JOB_JSON, SqueueJsonStream

DATA = Path(__file__).parents[1] / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def by_comment(jobs):
    return {job.comment: job for job in jobs}


def test_squeue_json_gives_each_state_and_end():
    jobs = by_comment(parse.parse_squeue_json(read("core-squeue-all.json")))
    assert parse.end_of(jobs["tok123"], "hpc") == (JobState.SUCCEEDED, "")
    assert jobs["tok2"].nodes == ("n2", "n3")
    assert jobs["fail"].exit_code == 3  # the wait status 768 read as the code
    assert parse.end_of(jobs["fail"], "hpc") == (JobState.FAILED, "failed in pool hpc: exit code 3")
    assert jobs["sig"].signal == 9 and jobs["sig"].exit_code is None
    state, reason = parse.end_of(jobs["tmo"], "hpc")
    assert state == JobState.TIMEOUT and "TIMEOUT" in reason
    assert parse.end_of(jobs["canc"], "hpc")[0] == JobState.CANCELLED
    assert jobs["tok123"].start is not None and jobs["tok123"].end - jobs["tok123"].start == 30


def test_squeue_text_fallback_reads_the_same_jobs():
    text = {j.comment: j for j in parse.parse_squeue_text(read("core-squeue-all.txt"))}
    json_jobs = by_comment(parse.parse_squeue_json(read("core-squeue-all.json")))
    assert set(text) == set(json_jobs)
    for comment, job in text.items():
        assert (job.slurm_id, job.state, job.nodes) == (json_jobs[comment].slurm_id,
                                                        json_jobs[comment].state,
                                                        json_jobs[comment].nodes)


def test_sinfo_text_counts_the_gpus():
    text = parse.parse_sinfo_text(read("core-sinfo.txt"))
    assert [(n.name, n.gpus) for n in text] == [(f"n{i}", 4) for i in range(1, 5)]
    assert all(n.partitions == ("gpu",) for n in text)
    assert all(n.gpus_used is None for n in text)  # -o says nothing of the GPUs in use


def test_version_and_its_json():
    version = parse.parse_version(read("core-sinfo-version.txt"))
    assert version == (22, 5, 8) and parse.version_text(version) == "22.05.8"
    assert parse.has_json(version) and not parse.has_json((20, 11, 9))
    with pytest.raises(ValueError):
        parse.parse_version("bash: sinfo: command not found")


def test_sacct_lines_and_cancelled_by_uid():
    found = parse.parse_sacct("2|FAILED|3:0|00:00:00|billing=1,cpu=1,gres/gpu=1,node=1\n"
                              "5|CANCELLED by 1000|0:15|01:02:03|cpu=1\n"
                              "7|TIMEOUT|0:0|1-00:00:10|cpu=1\n")
    assert found["2"].exit_code == 3 and found["2"].state == "FAILED"
    assert found["5"].state == "CANCELLED" and found["5"].signal == 15
    assert found["5"].elapsed_s == 3723
    assert "CANCELLED by 1000" in parse.end_of(found["5"], "hpc")[1]
    assert found["7"].elapsed_s == 86410


@pytest.mark.parametrize("text, names", [
    ("n[1-3,5]", ("n1", "n2", "n3", "n5")),
    ("gpu-[08-10],login", ("gpu-08", "gpu-09", "gpu-10", "login")),
    ("", ()),
    ("a[1-2]b[1-2]", ("a1b1", "a1b2", "a2b1", "a2b2")),
])
def test_host_lists(text, names):
    assert parse.expand_hostlist(text) == names


@pytest.mark.parametrize("text", ["n[a-b]", "n[1-", "{\"jobs\": 3}"])
def test_bad_output_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse.expand_hostlist(text) if text.startswith("n") else parse.parse_squeue_json(text)


def test_sbatch_answer_and_gres():
    assert parse.parse_sbatch("17\n") == "17" and parse.parse_sbatch("18;cluster2\n") == "18"
    with pytest.raises(ValueError):
        parse.parse_sbatch("sbatch: error: Batch job submission failed\n")
    assert parse.gres_gpus("gpu:a100:2(S:0-1),shard:8") == 2
    assert parse.gres_gpus("gres:gpu:4") == 4 and parse.gres_gpus("(null)") == 0


def test_each_job_carries_the_user_slurm_lists_it_under():
    """A pool believes a line only under its owner's name (22.05's --json ignores -u)."""
    jobs = by_comment(parse.parse_squeue_json(read("core-squeue-all.json")))
    assert jobs["tok123"].user == "root"
    line = "7|COMPLETED|0:0|00:01:40|billing=1,cpu=1,gres/gpu=4,node=1|||alice|scavenger|gpu\n"
    found = parse.parse_sacct(line)["7"]
    assert (found.user, found.gpus, found.qos, found.elapsed_s) == ("alice", 4, "scavenger", 100.0)
    assert parse.tres_gpus("billing=1,cpu=1,node=1") is None


def test_a_deep_json_answer_is_a_value_error_not_a_recursion_error():
    with pytest.raises(ValueError, match="nests deeper"):
        parse.parse_squeue_json('{"jobs":' + "[" * 200_000)


def _streamed(text: str, user: str, size: int) -> SqueueJsonStream:
    stream = SqueueJsonStream(user)
    data = text.encode()
    for at in range(0, len(data), size):
        stream.feed(data[at:at + size])
    return stream


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
def test_squeue_json_read_as_it_comes_keeps_the_users_own_jobs_exactly(size):
    """22.05's squeue --json lists the whole cluster's queue whatever -u says, so the poll
    reads it a record at a time (in chunks cut anywhere, inside a string, after a
    backslash), keeping its user's records, the same jobs parse_squeue_json reads."""
    text = read("core-squeue-all.json").replace('"comment": "tok2"', '"comment": "tok2\\\" }]"')
    whole = parse.parse_squeue_json(text)
    assert any(job.comment == 'tok2" }]' for job in whole)
    for user in ("root", "nobody"):
        kept = parse.squeue_json_jobs(_streamed(text, user, size).close())
        assert kept == [job for job in whole if job.user == user]
        assert kept or user == "nobody"


def test_other_users_long_queue_counts_against_no_bound_of_ours():
    """An outsider queues a thousand records as long as Slurm allows: they are read and
    dropped as each ends; what counts against MAX_OUTPUT is the document and our own."""
    document = json.loads(read("core-squeue-all.json"))
    theirs = dict(document["jobs"][0], user_name="outsider", comment="c" * 1024, name="n" * 1024)
    document["jobs"] += [theirs] * 1000
    text = json.dumps(document, indent=2)
    stream = _streamed(text, "root", 65536)
    assert len(parse.squeue_json_jobs(stream.close())) == len(read("core-squeue-all.json").split('"job_id"')) - 1
    assert stream.others > 4_000_000 and stream.own < 100_000, (stream.own, stream.others)
    # A name of bytes that are no UTF-8 (Slurm keeps what sbatch was given) is not an
    # answer Slurm never writes: the record is read (and dropped) all the same.
    raw = text.encode().replace(b'"nnnn', b'"\xff\xfe', 1)
    stream = SqueueJsonStream("root")
    for at in range(0, len(raw), 1000):
        stream.feed(raw[at:at + 1000])
    assert len(stream.close()) == len(read("core-squeue-all.json").split('"job_id"')) - 1


@pytest.mark.parametrize("text, says", [
    ("not json", "no jobs list"), ('{"jobs": [{"job_id": 1, "user_name": "root"', "no jobs list"),
    ('{"jobs":' + "[" * 200_000, "nests deeper"),
    ('{"jobs": [{"job_id": 1, "name": "' + "x" * (MAX_JOB_JSON + 1) + '"}]}', "more than"),
], ids=["not-json", "cut-short", "deep", "one-huge-record"])
def test_squeue_json_read_as_it_comes_refuses_what_slurm_never_writes(text, says):
    with pytest.raises(ValueError, match=says):
        _streamed(text, "root", 4096).close()


def test_a_sacct_line_with_a_duration_or_allocation_slurm_never_writes_is_not_believed():
    """A member's own key line may answer sacct with anything: "nan" seconds (the end of her
    job NaN, stored as no end: never in the history, its cards never released in the
    reports), a sign or an exponent, a GPU count past any allocation. Such a line is not
    Slurm's: skipped (her job's end comes from squeue), its GPUs not believed."""
    real = read("sacct_ended.txt").splitlines()[0]  # 1|COMPLETED|0:0|00:00:00|…gres/gpu=1…
    for elapsed in ("00:00:nan", "00:00:1e12", "-1-00:00:00", "00:00:inf", "+5"):
        forged = real.replace("|00:00:00|", f"|{elapsed}|")
        assert parse.parse_sacct(forged) == {}, elapsed
    assert parse.parse_sacct(real)["1"].elapsed_s == 0
    huge = real.replace("gres/gpu=1,", "gres/gpu=99999999999999999999,")
    assert parse.parse_sacct(huge)["1"].gpus is None
    assert parse.parse_elapsed("1-02:03:04.5") == 93784.5


def test_sacct_d_gives_a_requeued_jobs_last_run_and_the_runs_before_it():
    runs = parse.parse_sacct(read("sacct_requeued.txt"))
    assert runs["6"].state == "PENDING" and runs["6"].earlier == ((15.0, 1, None),)
    assert runs["5"].state == "NODE_FAIL" and runs["5"].earlier == ()


def test_a_job_name_in_sacct_submitline_is_neither_a_line_nor_the_comment():
    """Real SubmitLines of jobs whose names hold \\r, \\x1e, `|` and ` --comment=FAKE`
    (issue 41, third round): Python's splitlines cuts at \\r and \\x1e, so a name could
    write a line of its own into what a restore reads; and the name comes before the
    comment our sbatch gives. Each line is one job, and the comment is the last one."""
    text = (DATA / "sacct_submitline_names.txt").read_bytes().decode()  # read_text makes \r a line
    assert sorted(parse.parse_sacct(text)) == ["1", "2", "3", "4", "5", "6"]
    comments = [parse.submit_line_comment("|".join(line.split("|")[10:]))
                for line in parse.lines(text) if line]
    assert comments == ["REAL"] * 5 + ["REAL2"]
    assert parse.submit_line_comment("sbatch --parsable --wrap true") is None


def test_squeue_json_gives_what_a_job_asks_for_now():
    """A waiting job's request (``tres_req_str``, else its per-node gres times its nodes):
    its owner may grow it there (``scontrol update gres=gpu:4``)."""
    jobs = parse.parse_squeue_json(read("core-squeue-all.json"))
    assert [(job.requested_gpus, job.requested_nodes) for job in jobs][:3] == [(2, 1), (8, 2), (16, 4)]


def test_an_allocation_with_typed_gpus_alone_is_counted_not_charged_as_asked():
    """A cluster whose AccountingStorageTRES names typed GPUs only (``gres/gpu:a100``, as
    slurm.conf(5) allows) writes AllocTRES without an untyped count. Before, such a job
    had no GPUs in its allocation and was charged what it asked for, so a request its
    owner grew there (``scontrol update gres=gpu:a100:4``) was charged as sent. The typed
    counts are summed; an untyped count, where there is one, is the total."""
    assert parse.tres_gpus("billing=4,cpu=4,gres/gpu:a100=4,mem=16000M,node=1") == 4
    assert parse.tres_gpus("cpu=8,gres/gpu:a100=2,gres/gpu:v100=3,node=2") == 5
    assert parse.tres_gpus("cpu=8,gres/gpu=5,gres/gpu:a100=2,gres/gpu:v100=3,node=2") == 5
    assert parse.tres_gpus("cpu=1,gres/gpumem=80G,node=1") is None
    assert parse.tres_gpus(f"gres/gpu:a100={parse.MAX_JOB_GPUS + 1}") is None
