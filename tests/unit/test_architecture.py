"""The house's shape, computed from the source: imports go one way, rooms keep their
private members to themselves, every module says its one job, and a long one says why it
is one (no room is shaped by a line count).

Everything is read with ``ast`` (nothing is imported), so a lazy import inside a function
counts like any other, and so does one under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nebula_tui"
HEAD = "nebula_tui.head"
#: The head's rooms, lowest first: each may import only rooms before it.
ROOMS = ("forecast", "state", "access", "accounting", "stream", "shares", "launches", "jobs", "stops",
         "limits", "bookings", "scheduling", "why", "health", "reconcile", "nodes", "attach", "pool_books",
         "pools", "smoke", "doctor", "metrics", "notify", "engine", "requests", "ops.base", "ops.jobs",
         "ops.accounting", "ops.cluster", "ops", "server", "serve", "replay")


def package_sources(root: Path = PACKAGE) -> dict[str, tuple[str, bool]]:
    """module name -> (source, is a package's __init__)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules of ``sources`` it imports (``from . import x`` names module x
    when there is one, else the package)."""
    graph: dict[str, set[str]] = {}
    for name, (source, is_package) in sources.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in sources else target)
        graph[name] = {d for d in deps if d in sources and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other, directly or around a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def private_names(source: str) -> set[str]:
    """The private names a module defines: top-level and class-level ``_x`` (functions,
    classes, assignments) and every ``self._x = …``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    names.add(target.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def foreign_private_uses(sources: dict[str, tuple[str, bool]], owners: set[str]) -> list[str]:
    """``module:line: _name`` for each use of a private member that a module of ``owners``
    defines, made by another module: ``obj._name`` (any object but ``self``/``cls``, and
    those too when neither the module itself nor one it imports, where its base classes come
    from, defines ``_name``) and ``from m import _name``."""
    defined = {name: private_names(src) for name, (src, _) in sources.items()}
    graph = import_graph(sources)
    uses = []
    for name, (source, _) in sources.items():
        foreign = {n for m in owners if m != name for n in defined[m]}
        # a class's own members, also those a base class (from a module it imports) defines
        inherited = defined[name].union(*(defined[m] for m in graph[name]))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.attr in foreign:
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") \
                    and node.attr in inherited
                if not own:
                    uses.append(f"{name}:{node.lineno}: {node.attr}")
            elif isinstance(node, ast.ImportFrom):
                uses += [f"{name}:{node.lineno}: {a.name}" for a in node.names if a.name in foreign]
    return sorted(uses)


def head_modules(sources) -> set[str]:
    return {m for m in sources if m.startswith(HEAD + ".")}


# --------------------------------------------------------------------------- the checks
def test_the_checks_can_fail():
    """Each check finds what it looks for in a made-up package."""
    made_up = {
        "nebula_tui.a": ("from . import b\n", False),
        "nebula_tui.b": ("def f():\n    from .a import x\n", False),
        "nebula_tui.head": ("", True),
        "nebula_tui.head.state": ("class S:\n    def __init__(self):\n        self._tasks = set()\n", False),
        "nebula_tui.head.health": ("class H:\n    def __init__(self, state):\n"
                                   "        self._tasks = {}\n        state._tasks.add(1)\n", False),
        "nebula_tui.c": ("from .head.state import _hidden\n", False),
        # a class's own private members, also those its base class (imported) defines
        "nebula_tui.e": ("class E:\n    def _tasks(self):\n        pass\n", False),
        "nebula_tui.d": ("from .e import E\nclass D(E):\n    def f(self):\n        self._tasks()\n", False),
        "nebula_tui.f": ("class F:\n    def f(self):\n        self._tasks()\n", False),
    }
    assert cycles(import_graph(made_up)) == [["nebula_tui.a", "nebula_tui.b"]]
    made_up["nebula_tui.head.state"] = ("_hidden = 1\n" + made_up["nebula_tui.head.state"][0], False)
    assert foreign_private_uses(made_up, head_modules(made_up)) == [
        "nebula_tui.c:1: _hidden", "nebula_tui.f:3: _tasks", "nebula_tui.head.health:4: _tasks"]


def test_no_module_of_the_package_imports_in_a_circle():
    assert cycles(import_graph(package_sources())) == []


def test_the_heads_rooms_import_only_rooms_below_them():
    sources = package_sources()
    graph = import_graph(sources)
    assert {m.removeprefix(HEAD + ".") for m in head_modules(sources)} == set(ROOMS)
    for number, room in enumerate(ROOMS):
        above = {f"{HEAD}.{r}" for r in ROOMS[number:]}
        assert not graph[f"{HEAD}.{room}"] & above, f"{room} imports a room above it"


def test_no_module_outside_the_heads_rooms_imports_them_but_the_cli_entry():
    """Clients (CLI, TUI, sim) talk to the head over its socket; only `nebula serve`
    (lazily, in cli/local.py) and the head's own rooms import it."""
    graph = import_graph(package_sources())
    importers = {m for m, deps in graph.items() if any(d.startswith(HEAD) for d in deps)}
    assert {m for m in importers if not m.startswith(HEAD)} == {"nebula_tui.cli.local"}


#: The floors above the head's rooms, which import one way: (the modules under a name, the
#: names they may import nothing under, the names below those that they still may).
ONE_WAY = (
    # The head serves every client and imports none (the home's layout is homedir.py's).
    ("nebula_tui.head", ("nebula_tui.client", "nebula_tui.cli", "nebula_tui.screens"), ()),
    # What both clients use to reach the head, and the TUI's model of the cluster, are below both.
    ("nebula_tui.client", ("nebula_tui.cli", "nebula_tui.screens", "nebula_tui.head"), ()),
    # The TUI: screens -> widgets -> model. A widget knows no screen, nor the service.
    ("nebula_tui.screens.widgets", ("nebula_tui.screens", "nebula_tui.client", "nebula_tui.cli", "nebula_tui.head"),
     ("nebula_tui.screens.widgets", "nebula_tui.client.cluster")),
)
#: The client side below the TUI draws nothing: the model is plain data, its look is the screens'.
NO_UI_UNDER = "nebula_tui.client"
UI_LIBRARIES = frozenset({"textual", "rich"})


def under(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def against_the_flow(graph: dict[str, set[str]], rules=ONE_WAY) -> list[str]:
    """``importer -> imported`` for each import that a rule of ``rules`` forbids."""
    found = []
    for floor, forbidden, allowed in rules:
        for module in sorted(m for m in graph if under(m, floor)):
            found += [f"{module} -> {dep}" for dep in sorted(graph[module])
                      if any(under(dep, f) for f in forbidden) and not any(under(dep, a) for a in allowed)]
    return found


def test_the_one_way_check_can_fail():
    graph = {"nebula_tui.head.serve": {"nebula_tui.homedir", "nebula_tui.client.service"},
             "nebula_tui.client.service": {"nebula_tui.api"}, "nebula_tui.homedir": set(),
             "nebula_tui.api": set()}
    assert against_the_flow(graph) == ["nebula_tui.head.serve -> nebula_tui.client.service"]
    assert against_the_flow(graph, (("nebula_tui", ("nebula_tui",), ("nebula_tui.api",)),)) == [
        "nebula_tui.head.serve -> nebula_tui.client.service", "nebula_tui.head.serve -> nebula_tui.homedir"]


def test_the_clients_floors_import_one_way():
    assert against_the_flow(import_graph(package_sources())) == []


def libraries(source: str) -> set[str]:
    """The top-level names of what a module imports from outside (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_client_side_imports_no_ui_library():
    assert libraries("import json\nfrom textual.widgets import Static\nfrom . import x\n") == {"json", "textual"}
    drawing = {name: sorted(libraries(source) & UI_LIBRARIES)
               for name, (source, _) in package_sources().items() if under(name, NO_UI_UNDER)}
    assert "nebula_tui.client.cluster" in drawing
    assert {name: found for name, found in drawing.items() if found} == {}


def test_no_module_uses_a_private_member_of_a_room_it_is_not():
    sources = package_sources()
    assert foreign_private_uses(sources, head_modules(sources)) == []


CONFIG = "nebula_tui.config"
#: The config package's modules, lowest first: each may import only those before it.
CONFIG_MODULES = ("reader", "settings", "notify", "nodes", "pools", "cluster")
#: All the config package may import from the rest: plain data and the pure core.
CONFIG_MAY_IMPORT = ("nebula_tui.model", "nebula_tui.units", "nebula_tui.environments",
                     "nebula_tui.scheduler")


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def against_the_parts(sources: dict[str, tuple[str, bool]], package: str, parts: tuple[str, ...],
                      may_import: tuple[str, ...]) -> list[str]:
    """What breaks a package's order of ``parts`` (its modules, lowest first): a module not
    listed or listed but missing, a part importing one not before it, or importing a module
    outside the package and ``may_import``."""
    graph = import_graph(sources)
    modules = {m.removeprefix(package + ".") for m in sources if inside(m, package) and m != package}
    found = [f"{package}.{m} is not listed" for m in sorted(modules - set(parts))]
    found += [f"{package}.{m} is missing" for m in parts if m not in modules]
    for name in (p for p in parts if p in modules):
        module, above = f"{package}.{name}", {f"{package}.{m}" for m in parts[parts.index(name):]}
        for dep in sorted(graph[module]):
            if dep in above:
                found.append(f"{module} imports {dep}, above it")
            elif not inside(dep, package) and not any(inside(dep, a) for a in may_import):
                found.append(f"{module} imports {dep}")
    return found


def test_the_parts_check_can_fail():
    made_up = {
        "nebula_tui.model": ("", False),
        "nebula_tui.head.state": ("", False),
        "nebula_tui.p": ("", True),
        "nebula_tui.p.low": ("from .high import x\nfrom ..model import y\n", False),
        "nebula_tui.p.high": ("from .low import x\nfrom ..head.state import z\n", False),
        "nebula_tui.p.stray": ("", False),
    }
    assert against_the_parts(made_up, "nebula_tui.p", ("low", "high", "gone"), ("nebula_tui.model",)) == [
        "nebula_tui.p.stray is not listed", "nebula_tui.p.gone is missing",
        "nebula_tui.p.low imports nebula_tui.p.high, above it",
        "nebula_tui.p.high imports nebula_tui.head.state"]


def test_the_config_package_imports_one_way_and_nothing_above_plain_data():
    """nodes.yaml's reading serves the head, the replay and the CLI alike: it imports none
    of them, and its own modules import one way (the package re-exports nothing)."""
    sources = package_sources()
    assert import_graph(sources)[CONFIG] == set()
    assert against_the_parts(sources, CONFIG, CONFIG_MODULES, CONFIG_MAY_IMPORT) == []


STORE = "nebula_tui.store"
#: The store's parts, lowest first: each may import only those before it (the package's
#: ``__init__`` composes them into ``Store``).
STORE_PARTS = ("ids", "schema", "base", "telemetry", "events", "nodes", "bookings", "pools", "accounting",
               "jobs")
#: All the store may import from the rest of the package: plain data.
#: (release.py: the running version, which the database notes; wire.py: the shape of an
#: events-log line, which the store reads out; neither imports anything of ours)
STORE_MAY_IMPORT = ("nebula_tui.model", "nebula_tui.release", "nebula_tui.wire")
#: The libraries that speak SQL, which only the store imports.
SQL_LIBRARIES = ("sqlite3", "sqlite_utils")


def speakers_of_sql(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """The modules outside the store that import a library of :data:`SQL_LIBRARIES`."""
    return sorted(m for m, (source, _) in sources.items()
                  if not inside(m, STORE) and libraries(source) & set(SQL_LIBRARIES))


def test_the_sql_check_can_fail():
    made_up = {
        "nebula_tui.store.base": ("import sqlite3\nimport sqlite_utils\n", False),
        "nebula_tui.a": ("def f():\n    import sqlite3.dbapi2\n", False),
        "nebula_tui.b": ("from sqlite_utils import Database\n", False),
        "nebula_tui.c": ("from .store import Store\nimport json\n", False),
    }
    assert speakers_of_sql(made_up) == ["nebula_tui.a", "nebula_tui.b"]


def test_only_the_store_speaks_sql():
    assert speakers_of_sql(package_sources()) == []


def test_the_stores_parts_import_one_way_and_nothing_above_plain_data():
    """Every query of the project is the store's; its parts build one on another, lowest
    first, and none reaches above plain data (the head uses the store, never the reverse)."""
    sources = package_sources()
    assert against_the_parts(sources, STORE, STORE_PARTS, STORE_MAY_IMPORT) == []
    assert {d for d in import_graph(sources)[STORE] if not inside(d, STORE)} == set()


def modules_without_a_job(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """The modules whose docstring does not open with a sentence saying their one job (an
    empty package ``__init__`` says nothing and needs nothing)."""
    missing = []
    for name, (source, is_package) in sorted(sources.items()):
        if is_package and not source.strip():
            continue
        first = (ast.get_docstring(ast.parse(source)) or "").strip().split("\n\n")[0]
        if len(first.split()) < 4:
            missing.append(name)
    return missing


def test_the_job_check_can_fail():
    made_up = {
        "nebula_tui.p": ("", True),
        "nebula_tui.bare": ("import sys\n", False),
        "nebula_tui.terse": ('"""Helpers."""\n', False),
        "nebula_tui.said": ('"""Sizes and durations as people write them."""\n', False),
    }
    assert modules_without_a_job(made_up) == ["nebula_tui.bare", "nebula_tui.terse"]


def test_every_module_says_its_one_job():
    """A module is split where its job ends, not where a line count says: its docstring
    opens with that job (docs/ARCHITECTURE.md keeps the floors, not a second copy of it)."""
    assert modules_without_a_job(package_sources()) == []


#: Past this many lines a module must say, in its docstring, why it is one module.
LONG_MODULE_LINES = 550
#: How a module's docstring says it: a line that starts with this.
WHY_ONE_MODULE = "Why one module:"


def long_modules_without_a_reason(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``module (N lines)`` for each module over :data:`LONG_MODULE_LINES` lines whose
    docstring has no line starting with :data:`WHY_ONE_MODULE` (and a reason after it)."""
    missing = []
    for name, (source, _) in sorted(sources.items()):
        lines = len(source.splitlines())
        if lines <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(source)) or ""
        said = [line.strip()[len(WHY_ONE_MODULE):].strip() for line in doc.splitlines()
                if line.strip().startswith(WHY_ONE_MODULE)]
        if not any(said):
            missing.append(f"{name} ({lines} lines)")
    return missing


def test_the_long_module_check_can_fail():
    long_body = "x = 1\n" * (LONG_MODULE_LINES + 1)
    made_up = {
        "nebula_tui.short": ('"""Short."""\n', False),
        "nebula_tui.silent": ('"""Long, and says nothing of it."""\n' + long_body, False),
        "nebula_tui.empty": (f'"""Long.\n\n{WHY_ONE_MODULE}\n"""\n' + long_body, False),
        "nebula_tui.said": (f'"""Long.\n\n{WHY_ONE_MODULE} one parser, one grammar.\n"""\n'
                            + long_body, False),
    }
    assert long_modules_without_a_reason(made_up) == [
        f"nebula_tui.empty ({LONG_MODULE_LINES + 5} lines)",
        f"nebula_tui.silent ({LONG_MODULE_LINES + 2} lines)"]


def test_every_long_module_says_why_it_is_one():
    """A module grows past ~500 lines only where one cohesive thing needs it, and says so."""
    assert long_modules_without_a_reason(package_sources()) == []


#: Past this many lines a class outside ``scheduler/`` needs its module's reason too.
LONG_CLASS_LINES = 500


def long_classes_without_a_reason(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``module.Class (N lines)`` for each class over :data:`LONG_CLASS_LINES` lines outside
    the scheduler whose module's docstring does not say why it is one module."""
    missing = []
    for name, (source, _) in sorted(sources.items()):
        if name.startswith("nebula_tui.scheduler."):
            continue  # the scheduler's passes are long by design, each module says why
        tree = ast.parse(source)
        doc = ast.get_docstring(tree) or ""
        said = any(line.strip()[len(WHY_ONE_MODULE):].strip() for line in doc.splitlines()
                   if line.strip().startswith(WHY_ONE_MODULE))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not said:
                lines = node.end_lineno - node.lineno + 1
                if lines > LONG_CLASS_LINES:
                    missing.append(f"{name}.{node.name} ({lines} lines)")
    return missing


def test_the_long_class_check_can_fail():
    body = "class Big:\n" + "    x = 1\n" * LONG_CLASS_LINES
    made_up = {
        "nebula_tui.silent": ('"""A long class, and nothing said."""\n' + body, False),
        "nebula_tui.said": (f'"""A long class.\n\n{WHY_ONE_MODULE} one table.\n"""\n' + body, False),
        "nebula_tui.scheduler.passes": ('"""Left to the scheduler."""\n' + body, False),
    }
    assert long_classes_without_a_reason(made_up) == [f"nebula_tui.silent.Big ({LONG_CLASS_LINES + 1} lines)"]


def test_every_long_class_says_why_its_module_is_one():
    assert long_classes_without_a_reason(package_sources()) == []


# --------------------------------------------------------------------------- the node side
#: The folder of the code shipped to the nodes.
NODE = "nebula_tui.node"
#: The node side's main script: run on the node, never imported by the head.
NODELET = "nebula_tui.node.nodelet"
#: Node-side modules that are run on their own (by a job's wrapper), not imported there.
RUN_ALONE = {"nebula_tui.node.warmup"}


def shipped_modules() -> set[str]:
    """``remote/shipping.py``'s ``SHIPPED_MODULES``, read from its source."""
    tree = ast.parse((PACKAGE / "remote" / "shipping.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["SHIPPED_MODULES"]:
            return set(ast.literal_eval(node.value))
    raise AssertionError("remote/shipping.py has no SHIPPED_MODULES")


def unshipped_imports(graph: dict[str, set[str]], shipped: set[str]) -> list[str]:
    """``module -> dependency`` for each import of the nodelet or a shipped module that is
    not shipped with it (on a node it would not be there)."""
    return sorted(f"{m} -> {d}" for m in sorted(shipped | {NODELET}) for d in graph.get(m, ())
                  if d not in shipped)


def test_the_node_side_check_can_fail():
    made_up = {
        NODELET: ("from nebula_tui.node import ops\nfrom nebula_tui.model import X\n", False),
        "nebula_tui.model": ("", False),
        "nebula_tui.node.ops": ("from .job_dirs import job_id\n", False),
        "nebula_tui.node.job_dirs": ("", False),
    }
    graph = import_graph(made_up)
    assert unshipped_imports(graph, {"nebula_tui.node.ops"}) == [
        f"{NODELET} -> nebula_tui.model",
        "nebula_tui.node.ops -> nebula_tui.node.job_dirs"]


def test_the_nodelet_imports_only_modules_shipped_with_it():
    """The nodelet and its modules run on a node with nothing of ours installed: what they
    import must travel in the payload, as a module of its own."""
    sources = package_sources()
    shipped = shipped_modules()
    assert shipped <= set(sources)
    assert unshipped_imports(import_graph(sources), shipped) == []


def leaving_the_folder(graph: dict[str, set[str]], folder: str) -> list[str]:
    """``module -> dependency`` for each import, by a module under ``folder``, of one outside it."""
    return sorted(f"{m} -> {d}" for m in graph if under(m, folder) for d in graph[m] if not under(d, folder))


def test_the_folder_check_can_fail():
    graph = {f"{NODE}.ops": {f"{NODE}.job_dirs", "nebula_tui.model"}, f"{NODE}.job_dirs": set(),
             "nebula_tui.model": set(), "nebula_tui.remote.ssh": {f"{NODE}.ops"}}
    assert leaving_the_folder(graph, NODE) == [f"{NODE}.ops -> nebula_tui.model"]


def test_the_node_folder_is_what_is_shipped_and_imports_nothing_outside_it():
    """The code that runs on a node is one folder (stdlib only, Python 3.6:
    tests/unit/test_hardware.py): every module in it is shipped (or is the main script, or
    run alone by a job's wrapper), nothing outside it is, and none of it imports outside it."""
    sources = package_sources()
    in_folder = {m for m, (_, is_package) in sources.items() if under(m, NODE) and not is_package}
    assert in_folder == shipped_modules() | RUN_ALONE | {NODELET}
    assert leaving_the_folder(import_graph(sources), NODE) == []


def wait_for_users(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """module:line of each ``asyncio.wait_for`` (called or imported): on Python 3.11 it
    swallows a cancel that meets what it awaited just done; ``waits.within`` keeps it."""
    found = []
    for name, (source, _) in sources.items():
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.Attribute) and node.attr == "wait_for"
                    and isinstance(node.value, ast.Name) and node.value.id == "asyncio") or (
                    isinstance(node, ast.ImportFrom) and node.module == "asyncio"
                    and any(a.name == "wait_for" for a in node.names)):
                found.append(f"{name}:{node.lineno}")
    return sorted(found)


def test_the_wait_for_check_can_fail():
    made_up = {
        "nebula_tui.a": ("import asyncio\nasync def f(r):\n    await asyncio.wait_for(r.read(), 1)\n", False),
        "nebula_tui.b": ("from asyncio import wait_for\n", False),
        "nebula_tui.c": ("from .waits import within\nasync def f(r):\n    await within(1, r.read())\n", False),
    }
    assert wait_for_users(made_up) == ["nebula_tui.a:3", "nebula_tui.b:1"]


def test_every_bounded_wait_keeps_its_cancel():
    assert wait_for_users(package_sources()) == []



# --------------------------------------------------------------------------- one default vendor
def vendor_defaults(sources: dict[str, tuple[str, bool]], vendor: str = "nvidia") -> list[str]:
    """module:line of each place that writes ``vendor`` as a default: ``x or "nvidia"``,
    ``d.get(k, "nvidia")``, a field or parameter ``= "nvidia"`` (``model.DEFAULT_VENDOR``
    is the one). The node side's backends name their own vendor and are left out."""
    found = []
    for name, (source, _) in sources.items():
        if name == "nebula_tui.model" or under(name, "nebula_tui.node") \
                or under(name, "nebula_tui.remote.backends"):
            continue
        for node in ast.walk(ast.parse(source)):
            defaults: list[ast.expr] = []
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
                defaults = node.values[1:]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and len(node.args) == 2:
                defaults = [node.args[1]]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                defaults = [node.value]
            elif isinstance(node, ast.arguments):
                defaults = [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
            found += [f"{name}:{d.lineno}" for d in defaults
                      if isinstance(d, ast.Constant) and d.value == vendor]
    return sorted(found)


def test_the_vendor_default_check_can_fail():
    made_up = {
        "nebula_tui.a": ('x = v or "nvidia"\ny = d.get("vendor", "nvidia")\n', False),
        "nebula_tui.b": ('class C:\n    vendor: str = "nvidia"\ndef f(v="nvidia"):\n    pass\n', False),
        "nebula_tui.c": ('ok = v == "nvidia"\nz = v or DEFAULT_VENDOR\n', False),
        "nebula_tui.node.backends.nvidia_smi": ('x = v or "nvidia"\n', False),
    }
    assert vendor_defaults(made_up) == ["nebula_tui.a:1", "nebula_tui.a:2", "nebula_tui.b:2", "nebula_tui.b:3"]


def test_one_default_vendor():
    """A card, reading or row that names no vendor is ``model.DEFAULT_VENDOR``'s, said once."""
    assert vendor_defaults(package_sources()) == []


# --------------------------------------------------------------------------- the tests' own imports
TESTS = PACKAGE.parent / "tests"


def suite_sources(root: Path = TESTS) -> dict[str, str]:
    """path under tests/ -> source, for every Python file of the suite (support/ included)."""
    return {str(path.relative_to(root)): path.read_text() for path in sorted(root.rglob("*.py"))}


def imports_of_test_modules(sources: dict[str, str]) -> list[str]:
    """path:line of each import of a test module (``test_*``) or of ``conftest``: what two test
    modules share lives in ``tests/support/`` and its fixtures in ``support.plugin``."""
    found = []
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            if any(n.split(".")[-1].startswith("test_") or n.split(".")[0] == "conftest" for n in names):
                found.append(f"{path}:{node.lineno}")
    return sorted(found)


def test_the_test_import_check_can_fail():
    made_up = {
        "lab/test_a.py": "from test_b import helper\nimport test_c\nfrom support.head import submit\n",
        "unit/test_d.py": "def f():\n    from conftest import until\n\nimport os, support.tui\n",
        "support/x.py": "from unit.test_store import store\n",
    }
    assert imports_of_test_modules(made_up) == ["lab/test_a.py:1", "lab/test_a.py:2", "support/x.py:1",
                                                "unit/test_d.py:2"]


def test_no_test_module_imports_another_test_module():
    assert imports_of_test_modules(suite_sources()) == []


def test_the_suite_puts_nothing_on_the_import_path_by_hand():
    """``tests/`` reaches the import path through pyproject's pytest ``pythonpath`` alone."""
    assert [path for path, source in suite_sources().items() if "sys.path" in source
            and path != "unit/test_architecture.py"] == []
