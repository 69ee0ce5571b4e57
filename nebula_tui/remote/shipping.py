"""What the head sends a node to run: the nodelet and every module it imports, in one payload.

Nodes stay agentless: nothing is installed. The node's ``python3 -c`` reads one compressed
script from stdin. That script first puts an importer in front of ``sys.meta_path`` that
serves the shipped modules under their own names (``nebula_tui.node.backends.reading``,
``nebula_tui.node.hardware``, …, and ``pynvml`` from the head's ``nvidia-ml-py``),
so their relative imports work as on the head and a node's own installed copies never
shadow them; then it runs the nodelet as the main script, which imports what it uses from
them like any module.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import shlex
import zlib
from importlib import resources

#: The modules the nodelet imports, by their names on the head. Each is stdlib only and
#: Python 3.6 syntax (tests/unit/test_hardware.py checks both).
SHIPPED_MODULES = (
    "nebula_tui.node.backends.reading",
    "nebula_tui.node.backends.nvidia_smi",
    "nebula_tui.node.backends.amd",
    "nebula_tui.node.backends.intel",
    "nebula_tui.node.backends.ascend",
    "nebula_tui.node.backends.topo",
    "nebula_tui.node.hardware",
    "nebula_tui.node.vendor_nvidia",
    "nebula_tui.node.vendor_amd",
    "nebula_tui.node.vendor_intel",
    "nebula_tui.node.vendor_ascend",
    "nebula_tui.node.registry",
    "nebula_tui.node.kmsg_cursor",
    "nebula_tui.node.cgroups",
    "nebula_tui.node.node_containers",
    "nebula_tui.node.mount_pins",
    "nebula_tui.node.tmux_control",
    "nebula_tui.node.node_base",
    "nebula_tui.node.job_dirs",
    "nebula_tui.node.attribution",
    "nebula_tui.node.kernel_log",
    "nebula_tui.node.cleaner",
    "nebula_tui.node.watcher",
    "nebula_tui.node.ops",
)
#: Their packages, shipped empty: the head's ``__init__`` files import head-only code.
SHIPPED_PACKAGES = ("nebula_tui", "nebula_tui.node", "nebula_tui.node.backends")
#: Shipped when the head has it (the ``nvidia-ml-py`` distribution's single module).
THIRD_PARTY = ("pynvml",)
#: The main script: the nodelet (it imports the modules above by their names).
MAIN_SCRIPT = "nodelet.py"

_IMPORTER = '''\
import sys as _sys


class _ShippedModules(object):
    """Serves the modules the head shipped with this script (never installed here)."""

    def __init__(self, sources, packages):
        self.sources = sources
        self.packages = packages

    def find_spec(self, name, path=None, target=None):
        if name not in self.sources and name not in self.packages:
            return None
        import importlib.util
        return importlib.util.spec_from_loader(name, self, is_package=name in self.packages)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        code = compile(self.sources.get(name, ""), "<shipped>/" + name.replace(".", "/") + ".py",
                       "exec")
        exec(code, module.__dict__)


_sys.meta_path.insert(0, _ShippedModules(_SHIPPED_SOURCES, _SHIPPED_PACKAGES))
'''


def _source(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        return handle.read()


def script() -> str:
    """The whole script the node runs, uncompressed (tests read it)."""
    sources = {}
    for module in SHIPPED_MODULES:
        text = _source(module)
        if text is None:
            raise RuntimeError(f"cannot ship {module}: its source is not installed with the head")
        sources[module] = text
    for module in THIRD_PARTY:
        text = _source(module)
        if text is not None:  # without it, NVIDIA nodes fall back to nvidia-smi and say why
            sources[module] = text
    node = resources.files("nebula_tui.node")
    main = node.joinpath(MAIN_SCRIPT).read_text(encoding="utf-8")
    return (f"_SHIPPED_SOURCES = {sources!r}\n_SHIPPED_PACKAGES = {SHIPPED_PACKAGES!r}\n"
            + _IMPORTER + "\n\n" + main)


@functools.cache
def payload() -> bytes:
    """:func:`script`, compressed (about a quarter of its size), as sent on stdin. Made once
    per head process: reading and compressing it for each of 100 nodes reconnecting at a
    restart was half of the head's CPU then; and every node gets the nodelet of the head's
    own code, as it was when the head started."""
    return zlib.compress(script().encode("utf-8"), 6)


def boot_command(payload_size: int, settings: dict) -> str:
    """The ``python3 -c`` that reads ``payload_size`` bytes of stdin and runs them; quoted
    for the node's login shell (callers put ``exec`` and the node's env before it)."""
    boot = ("import sys,zlib;exec(compile(zlib.decompress(sys.stdin.buffer.read(%d)),"
            "'nebula-nodelet','exec'))" % payload_size)
    return f"python3 -u -c {shlex.quote(boot)} {shlex.quote(json.dumps(settings))}"
