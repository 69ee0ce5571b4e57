"""``squeue --json`` read as it comes, a job record at a time, with bounds of its own.

22.05 lists the whole cluster's queue whatever ``-u`` says, and any cluster user may queue
thousands of jobs with kilobyte names; the pool's poll must neither hold all of that nor
count it against its own bound. Pure (bytes in, dicts out); ``slurm_parse`` turns the
records kept into jobs.
"""

from __future__ import annotations

import codecs
import json
import re

#: one job's record in squeue --json (22.05 writes about 4 KiB; Slurm keeps a name or
#: comment to 1,024 characters and a path to 4,096): a longer one is not Slurm's
MAX_JOB_JSON = 256 << 10
#: how deep squeue --json nests (its jobs 9 deep): deeper is not Slurm's
MAX_JSON_DEPTH = 64
_STRUCTURE = re.compile(r'["{}\[\]]')
_IN_STRING = re.compile(r'["\\]')
#: after one record of the jobs list, the next one's start
_NEXT_RECORD = re.compile(r'\s*,\s*(?=\{)')


class SqueueJsonStream:
    """``squeue --json`` read as it comes, one job record at a time: the records Slurm lists
    under ``user`` kept, every other user's dropped as soon as it is read. 22.05 lists the
    whole cluster's queue whatever -u says, and anyone may queue thousands of jobs with
    kilobyte names: their records are Slurm's business, not a bound of ours. The document
    around the records is scanned (its nesting at most MAX_JSON_DEPTH); each record is read
    by json's own reader (at most MAX_JOB_JSON, nested no deeper than that reader goes).
    ``own`` counts what is not another user's record (the document, ``user``'s own
    records), which the caller bounds. ``feed`` and ``close`` raise ValueError for what
    Slurm never writes."""

    def __init__(self, user: str):
        self.user = user
        self.items: list[dict] = []
        self.total = 0  # bytes fed
        self.others = 0  # of them (as characters), other users' records
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._json = json.JSONDecoder()
        self._depth = 0
        self._string = self._escape = False
        self._key = ""  # the string being read at depth 1 (a key of the document)
        self._last_key = ""
        self._in_jobs = self._saw_jobs = False
        self._pending: str | None = None  # a record not whole yet, and what follows it

    @property
    def own(self) -> int:
        """What was fed that is not another user's record (a record not whole yet aside)."""
        return self.total - self.others - len(self._pending or "")

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        text = self._decoder.decode(data)
        at = 0
        if self._pending is not None:
            text, self._pending = self._pending + text, None
            at = self._records(text, 0)
        if self._pending is None:
            self._scan(text, at)

    def _scan(self, text: str, at: int) -> None:
        end = len(text)
        while at < end:
            if self._escape:
                self._escape, at = False, at + 1
                continue
            if self._string:
                found = _IN_STRING.search(text, at)
                stop = found.start() if found else end
                if self._depth == 1 and len(self._key) < 64:
                    self._key += text[at:stop][:64]
                if found is None:
                    return
                at = stop + 1
                if text[stop] == "\\":  # the next character is the string's
                    self._escape = True
                else:
                    self._string = False
                    if self._depth == 1:
                        self._last_key = self._key
                continue
            found = _STRUCTURE.search(text, at)
            if found is None:
                return
            char, at = found.group(), found.end()
            if char == '"':
                self._string = True
                if self._depth == 1:
                    self._key = ""
            elif char == "{" and self._depth == 2 and self._in_jobs:
                at = self._records(text, found.start())
                if self._pending is not None:
                    return
            elif char in "{[":
                self._depth += 1
                if self._depth > MAX_JSON_DEPTH:
                    raise ValueError("squeue --json nests deeper than any Slurm answer")
                if self._depth == 2 and char == "[":
                    self._in_jobs = self._last_key == "jobs"
                    self._saw_jobs = self._saw_jobs or self._in_jobs
            else:  # } ]
                if self._depth == 2:
                    self._in_jobs = False
                self._depth -= 1
                if self._depth < 0:
                    raise ValueError("squeue --json gave no jobs list")

    def _records(self, text: str, at: int) -> int:
        """The records of the jobs list from ``text[at]`` (a ``{``), while they follow one
        another; where the scan goes on. One not whole yet waits in ``_pending``."""
        while True:
            try:
                item, stop = self._json.raw_decode(text, at)
            except RecursionError:
                raise ValueError("squeue --json nests deeper than any Slurm answer") from None
            except ValueError:  # not whole yet (or never: bounded, and refused at the end)
                if len(text) - at > MAX_JOB_JSON:
                    raise ValueError(f"squeue --json listed a job of more than "
                                     f"{MAX_JOB_JSON >> 10} KiB") from None
                self._pending = text[at:]
                return len(text)
            if stop - at > MAX_JOB_JSON:
                raise ValueError(f"squeue --json listed a job of more than {MAX_JOB_JSON >> 10} KiB")
            if isinstance(item, dict) and "job_id" in item and str(item.get("user_name") or "") == self.user:
                self.items.append(item)
            else:
                self.others += stop - at
            follows = _NEXT_RECORD.match(text, stop)
            if follows is None:
                return stop
            at = follows.end()

    def close(self) -> list[dict]:
        """The records listed under ``user``; ValueError for an answer that ended early, or
        had no jobs list."""
        self.feed(b"")
        if not self._saw_jobs or self._depth != 0 or self._string or self._pending is not None:
            raise ValueError("squeue --json gave no jobs list")
        return self.items
