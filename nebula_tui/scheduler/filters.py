"""R10/R11 filters: which cards a request may ever use, and the words for "none can".

Architecture and CUDA requests are parsed once per distinct request; a card's compute
capability ("8.9") and driver CUDA version ("12.4") are compared as integer tuples, so
"12.10" is newer than "12.9". AMD's architectures (``gfx90a``, ``gfx942``) are
capabilities of a family of their own — a tuple led by ``GFX_FAMILY`` — so ``>=sm_80``
never selects an AMD card and ``>=gfx90a`` never an NVIDIA one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_ARCH = re.compile(r"^\s*(>=)?\s*sm_?(\d+)[a-z]?\s*$", re.IGNORECASE)
_GFX = re.compile(r"^\s*(>=)?\s*gfx(\d{1,2})([0-9a-f])([0-9a-f])\s*$", re.IGNORECASE)
_VERSION = re.compile(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?\s*$")
#: The first element of an AMD capability: below any CUDA major version.
GFX_FAMILY = -1


def gfx_capability(text: str) -> tuple[int, ...] | None:
    """"gfx90a" -> (GFX_FAMILY, 9, 0, 10) (major, minor, stepping); else None."""
    match = _GFX.match(str(text))
    if not match:
        return None
    return (GFX_FAMILY, int(match.group(2)), int(match.group(3), 16), int(match.group(4), 16))


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """"12.4" -> (12, 4); "12" -> (12, 0); an AMD target "gfx90a" -> its capability
    (see :func:`gfx_capability`); None or junk -> None."""
    if text is None:
        return None
    gfx = gfx_capability(text)
    if gfx is not None:
        return gfx
    match = _VERSION.match(str(text))
    if not match:
        return None
    parts = [int(p) for p in match.groups() if p is not None]
    return tuple(parts + [0] * (2 - len(parts))) if len(parts) < 2 else tuple(parts)


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


@dataclass(frozen=True)
class ArchRequest:
    """``--arch sm_89`` (exactly 8.9), ``--arch '>=sm_80'`` (8.0 or newer), or AMD's
    ``--arch gfx90a`` / ``'>=gfx90a'``."""

    capability: tuple[int, ...]
    minimum: bool

    @property
    def text(self) -> str:
        name = sm_name(self.capability)
        return f"{name} or newer" if self.minimum else name

    def accepts(self, capability: tuple[int, ...] | None) -> bool:
        if capability is None or (capability[0] == GFX_FAMILY) != (self.capability[0] == GFX_FAMILY):
            return False  # another vendor's family is neither older nor newer
        return capability >= self.capability if self.minimum else capability == self.capability


def parse_arch(text: str) -> ArchRequest:
    """``sm_89`` -> 8.9 exact; ``>=sm_80`` -> 8.0 minimum; ``sm_120`` -> 12.0; ``gfx90a``.

    Raises ValueError with a sentence when the text is no architecture.
    """
    gfx = gfx_capability(text.lstrip(">= "))
    if gfx is not None:
        return ArchRequest(gfx, text.strip().startswith(">="))
    match = _ARCH.match(text)
    if not match:
        raise ValueError(f"--arch '{text}' is not an architecture like sm_89, '>=sm_80' or gfx90a")
    number = int(match.group(2))
    return ArchRequest((number // 10, number % 10), match.group(1) is not None)


def sm_name(capability: tuple[int, ...]) -> str:
    """(8, 9) -> "sm_89"; an AMD capability -> its "gfx90a" name."""
    if capability[0] == GFX_FAMILY:
        major, minor, stepping = (list(capability[1:]) + [0, 0])[:3]
        return f"gfx{major}{minor:x}{stepping:x}"
    return f"sm_{capability[0]}{capability[1] if len(capability) > 1 else 0}"


@dataclass(frozen=True)
class Filter:
    """The hardware a request needs, whatever runs on the cards now."""

    vendor: str | None
    arch: ArchRequest | None
    cuda: tuple[int, ...] | None
    #: -w/--nodelist: the only nodes it may run on (None: any); -x/--exclude: never these
    nodes: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()

    def node_ok(self, node: str) -> bool:
        return (self.nodes is None or node in self.nodes) and node not in self.excluded

    def describe(self) -> str:
        """The qualifiers shown after "needs …": "" or " (sm_89, CUDA ≥12.1)"."""
        parts = []
        if self.vendor:
            parts.append(self.vendor)
        if self.arch:
            parts.append(self.arch.text)
        if self.cuda:
            parts.append(f"CUDA ≥{version_text(self.cuda)}")
        if self.nodes is not None:
            parts.append("on " + ",".join(sorted(self.nodes)))
        if self.excluded:
            parts.append("not on " + ",".join(sorted(self.excluded)))
        return f" ({', '.join(parts)})" if parts else ""


def make_filter(vendor: str | None, arch: str | None, cuda: str | None,
                nodes: tuple[str, ...] = (), excluded: tuple[str, ...] = ()) -> Filter:
    """Raises ValueError (a sentence) for an --arch or --cuda that cannot be understood.
    ``nodes`` (-w; empty: any) and ``excluded`` (-x) are node names, expanded already."""
    arch_request = parse_arch(arch) if arch else None
    cuda_version = None
    if cuda:
        cuda_version = parse_version(cuda)
        if cuda_version is None:
            raise ValueError(f"--cuda '{cuda}' is not a version like 12.1")
    return Filter(vendor.lower() if vendor else None, arch_request, cuda_version,
                  frozenset(nodes) if nodes else None, frozenset(excluded))


#: at most this many node names in one -w/-x (a lab's nodes, with room)
MAX_HOSTLIST = 4096
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str, flag: str = "--nodelist") -> tuple[str, ...]:
    """Slurm's hostlist: ``a,b`` and ``node[01-03,07]`` (zero padding kept) -> the names,
    in order, each once. Raises ValueError with a sentence naming what is wrong."""
    if not isinstance(text, str) or not text.strip() or len(text) > 10000:
        raise ValueError(f"{flag} takes node names like gpu1,gpu2 or gpu[01-04]")
    # split on the commas outside brackets
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ValueError(f"{flag} {text[:80]!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{flag} {text[:80]!r}: unbalanced brackets")
    parts.append(text[start:])
    names: dict[str, None] = {}
    for part in (p.strip() for p in parts):
        match = re.fullmatch(r"([^\[\]]*)(?:\[([^\]]*)\]([^\[\]]*))?", part)
        if not part or not match:
            raise ValueError(f"{flag} {text[:80]!r}: {part!r} is no node name or range like gpu[01-04]")
        prefix, ranges, suffix = match.group(1), match.group(2), match.group(3) or ""
        found = [prefix] if ranges is None else []
        for piece in (ranges.split(",") if ranges is not None else ()):
            bounds = _RANGE.match(piece.strip())
            if not bounds:
                raise ValueError(f"{flag} {text[:80]!r}: [{ranges}] is no range like 01-04 or 1,3")
            low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
            if int(high) < int(low) or int(high) - int(low) >= MAX_HOSTLIST:
                raise ValueError(f"{flag} {text[:80]!r}: {piece} is no range (low-high, "
                                 f"at most {MAX_HOSTLIST} names)")
            found += [f"{prefix}{n:0{len(low)}d}{suffix}" for n in range(int(low), int(high) + 1)]
        for name in found:
            if not _HOST.match(name):
                raise ValueError(f"{flag}: {name[:80]!r} is no node name")
            names[name] = None
            if len(names) > MAX_HOSTLIST:
                raise ValueError(f"{flag} names more than {MAX_HOSTLIST} nodes")
    return tuple(names)


#: The first CUDA release that builds for each compute capability, and the driver branch
#: that first serves that CUDA (NVIDIA's CUDA release notes and its driver table).
FIRST_CUDA: dict[tuple[int, int], tuple[tuple[int, int], str]] = {
    (7, 0): ((9, 0), "384"), (7, 2): ((10, 0), "410"), (7, 5): ((10, 0), "410"),
    (8, 0): ((11, 0), "450"), (8, 6): ((11, 1), "455"), (8, 7): ((11, 4), "470"),
    (8, 9): ((11, 8), "520"), (9, 0): ((11, 8), "520"),
    (10, 0): ((12, 8), "570"), (10, 1): ((12, 8), "570"), (12, 0): ((12, 8), "570"),
    (10, 3): ((12, 9), "575"), (12, 1): ((12, 9), "575"),
}


@functools.lru_cache(maxsize=256)  # asked for every card at every probe: a few pairs in a lab
def cuda_gap(compute_cap: str | None, cuda_version: str | None) -> str | None:
    """Why a node's CUDA cannot serve a card of ``compute_cap``, with what to install (a
    sentence), or None when it can or either is unknown: an RTX 5070 (sm_120) on a node
    whose driver serves CUDA 11.8 needs CUDA 12.8, the 570 drivers or newer. The head
    shows it on the node's page; ``nebula doctor`` can say the same."""
    capability, cuda = parse_version(compute_cap), parse_version(cuda_version)
    if not capability or not cuda or capability[0] == GFX_FAMILY:
        return None
    needed = FIRST_CUDA.get((capability[0], capability[1]))  # parse_version gives two at least
    if needed is None or tuple(cuda[:2]) >= needed[0]:
        return None
    return (f"{sm_name(capability)} needs CUDA {version_text(needed[0])} or newer, and this node's "
            f"driver serves CUDA {version_text(cuda[:2])}: install an NVIDIA driver of the "
            f"{needed[1]} series or newer (and a CUDA {version_text(needed[0])} toolkit where jobs "
            "build their own kernels)")
