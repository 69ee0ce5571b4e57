"""Whether a request could ever run on this cluster's hardware, whatever runs on it now.

Two callers: each pass (a job that cannot run *now* because every fitting card is drained
still waits; one that no card could ever serve waits with the sentence that says so), and
the head at submit, which refuses such a job at once (:func:`refusal`) against every GPU it
knows — drained, unknown and unreachable nodes' cards included — naming the best there is
("the largest card here has 80 GB").

The judgement looks at hardware classes — (vendor, compute capability, driver CUDA, memory)
— not at cards: a cluster of 1,000 GPUs has a handful of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..model import DEFAULT_VENDOR, GpuView, format_mb
from ..units import duration_flag
from .cards import Hardware, Shape
from .filters import Filter, make_filter, parse_version, sm_name, version_text
from .reasons import needs
from .slices import fit
from .snapshot import PendingJob, SchedulerConfig


def hardware(vendor: str | None, compute_cap: str | None, cuda_version: str | None,
             memory_total_mb: int | None) -> Hardware:
    """The class of a card with these facts (its reading's, and its node's CUDA)."""
    return ((vendor or DEFAULT_VENDOR).lower(), parse_version(compute_cap), parse_version(cuda_version),
            memory_total_mb)


def hardware_of(view: GpuView) -> Hardware:
    reading = view.reading
    return hardware(reading.vendor, reading.compute_cap, view.cuda_version, reading.memory_total_mb)


def node_hardware(gpus: Sequence[GpuView]) -> dict[str, dict[Hardware, int]]:
    """Node -> how many cards of each hardware class it has, in the order of ``gpus``."""
    node_hw: dict[str, dict[Hardware, int]] = {}
    for view in gpus:
        counts = node_hw.setdefault(view.node, {})
        hw = hardware_of(view)
        counts[hw] = counts.get(hw, 0) + 1
    return node_hw


def judge_hardware(f: Filter, classes: Iterable[Hardware]) -> tuple[str, str] | frozenset[Hardware]:
    """The classes filter ``f`` accepts, or ("what" | "plain", the sentence's end) when it
    accepts none ("what": the end follows "needs …; ", "plain": it is the whole sentence)."""
    pool = list(classes)
    if not pool:
        return ("what", "no GPU is registered yet (no node has answered)")
    if f.vendor:
        pool = [c for c in pool if c[0] == f.vendor]
        if not pool:
            return ("what", f"no {f.vendor} GPU in the cluster")
    if f.arch:
        kept = [c for c in pool if f.arch.accepts(c[1])]
        if not kept:
            here = sorted({c[1] for c in pool if c[1]})
            listed = f" (here: {', '.join(sm_name(c) for c in here)})" if here else ""
            return ("what", f"no GPU with {f.arch.text} in the cluster{listed}")
        pool = kept
    if f.cuda:
        kept = [c for c in pool if c[2] is not None and c[2] >= f.cuda]
        if not kept:
            known = [c[2] for c in pool if c[2] is not None]
            if not known:
                return ("plain", f"needs CUDA ≥{version_text(f.cuda)}; no driver here reported "
                                 "its CUDA version")
            return ("plain", f"needs CUDA ≥{version_text(f.cuda)}; drivers here support up to "
                             f"{version_text(max(known))}")
        pool = kept
    return frozenset(pool)


def judge_size(shape: Shape, classes: frozenset[Hardware], spare_mb: int) -> tuple[str, str] | frozenset[Hardware]:
    """Of ``classes``, those whose empty card could hold one share of ``shape`` (a service
    keeps ``spare_mb`` beside it), or ("what", the sentence's end) when none could."""
    spare = spare_mb if shape.service else 0
    kept = frozenset(c for c in classes if fit(c[3], 0, 0, 0, False, shape.gpu_mem_mb, spare) is not None)
    if kept:
        return kept
    largest = max((c[3] or 0 for c in classes), default=0)
    extra = f" (a service keeps {format_mb(spare)} spare)" if spare else ""
    return ("what", f"the largest card here has {format_mb(largest)}{extra}")


def judge_count(shape: Shape, counts: Sequence[int]) -> str | None:
    """Why no ``max_nodes`` nodes together hold ``gpu_count`` such cards (``counts``: each
    node's number of them, most first), or None when some do."""
    k, span = shape.gpu_count, shape.max_nodes
    if sum(counts[:span]) >= k:
        return None
    what = needs(shape)
    if span <= 1:
        most = counts[0] if counts else 0
        return (f"needs {what}; the largest node has {most} such GPU{'s' * (most != 1)}"
                + (" (--nodes lets a job span nodes)" if sum(counts) >= k else ""))
    return f"needs {what}; {span} nodes have at most {sum(counts[:span])} such GPUs together"


def never_fits(shape: Shape, node_hw: Mapping[str, Mapping[Hardware, int]],
               config: SchedulerConfig) -> str | None:
    """Why no card of the cluster, however idle, could ever serve ``shape`` (None: some
    could). ``node_hw``: per node, how many cards of each hardware class it has."""
    f = shape.filter
    if f.nodes is not None or f.excluded:  # -w/-x: the other nodes' cards never count
        node_hw = {node: counts for node, counts in node_hw.items() if f.node_ok(node)}
        if not node_hw:
            return "-w/-x leave no node with GPUs"
    classes = judge_hardware(shape.filter, {hw for counts in node_hw.values() for hw in counts})
    if isinstance(classes, frozenset):
        classes = judge_size(shape, classes, config.service_spare_mb)
    if isinstance(classes, tuple):
        kind, text = classes
        return text if kind == "plain" else f"needs {needs(shape)}; {text}"
    counts = sorted((n for counts in node_hw.values()
                     if (n := sum(c for hw, c in counts.items() if hw in classes))), reverse=True)
    return judge_count(shape, counts)


def shape_of(job: PendingJob) -> Shape | str:
    """The request as placement sees it, or the sentence saying why it is no request."""
    if job.gpu_count < 1:
        return f"asks for {job.gpu_count} GPUs; a job needs at least 1"
    if job.gpu_mem_mb is not None and job.gpu_mem_mb < 1:
        return f"asks for {job.gpu_mem_mb} MiB per GPU"
    try:
        return Shape(job.gpu_count, job.gpu_mem_mb, job.service, max(1, job.max_nodes),
                     make_filter(job.vendor, job.arch, job.cuda, job.nodelist, job.exclude))
    except ValueError as err:
        return str(err)


def refusal(job: PendingJob, gpus: Sequence[GpuView], config: SchedulerConfig = SchedulerConfig(),
            *, partial: bool = False) -> str | None:
    """The sentence refusing ``job`` at submit because it could never run, or None.

    ``gpus``: every GPU the head knows, whatever its node's state. ``partial``: some
    configured node never reported its GPUs, so what it has is unknown and nothing is
    refused for want of hardware (the pass explains the wait instead).
    """
    return refusal_on(job, node_hardware(gpus), config, partial=partial)


def refusal_on(job: PendingJob, node_hw: Mapping[str, Mapping[Hardware, int]],
               config: SchedulerConfig = SchedulerConfig(), *, partial: bool = False) -> str | None:
    """:func:`refusal` from the cards' classes per node (``node_hardware``), which the head
    counts without building a view of every card."""
    shape = shape_of(job)
    if isinstance(shape, str):
        return shape
    if partial or not node_hw:
        return None
    why = never_fits(shape, node_hw, config)
    return None if why is None else f"this job could never start here: {why}"


def time_limit(asked_s: float | None, default_s: float | None, max_s: float | None
               ) -> tuple[float | None, str | None]:
    """(the job's time limit, or the sentence refusing it): ``--time`` if given, else the
    cluster's ``default_time``; never longer than its ``max_time``."""
    limit = default_s if asked_s is None else asked_s
    if max_s is not None:
        if limit is None:
            limit = max_s
        elif limit > max_s:
            return None, (f"--time {duration_flag(limit)} is longer than this cluster allows "
                          f"(max_time {duration_flag(max_s)}); ask for at most that")
    return limit, None
