"""The layout's rules, read from the source with ``ast`` (nothing is imported).

Every ``.py`` file under ``orchestration/``, ``workers/`` and ``duet/`` found on disk is
parsed, and every import in it counts: at module level, inside functions, under
``if TYPE_CHECKING:``, relative ones (resolved against the file's package), and
``importlib.import_module("literal")``. ``from pkg import mod`` is an edge to ``pkg.mod``
when ``mod`` is a module on disk, else an edge to ``pkg``. The implicit import of a parent
package's ``__init__`` is not an edge.

The rules:

- **No circle** in the module import graph. Imports under ``if TYPE_CHECKING:`` are left
  out of *this* test: they never run, so they cannot make an import-time circle, and two
  types that name each other in annotations (``Agent(architecture: ActorCritic)`` and
  ``ActorCritic(actor: Agent)``) are one idea split over two files of one layer, not a
  tangle. They still count for the layering test, so a type-only import cannot point up.
- **Layers point down only**: core -> nothing of ours but core; state -> core and
  ``orchestration.settings``; ``orchestration.prices`` -> core; services and client ->
  core, state, settings, prices; workers ->
  ``orchestration.*``; nothing in ``orchestration/`` or ``workers/`` imports ``duet``.
- **The core is pure**: no file under ``orchestration/core/`` imports celery, kombu, redis,
  a vendor SDK, an HTTP or socket library, reads the environment or the clock.
- **No private names across modules**: no ``from x import _y`` and no ``x._y`` on an
  imported module ``x`` of ours, nor ``obj._y`` where ``_y`` is private to another of our
  modules (a method or attribute that only another file defines).

Each failure names the file and line. Violations on ``main`` when these tests were written
are listed in :data:`KNOWN_TODAY`; the suite stays green with them, and fails both on a new
violation and on a listed one that is gone (delete its line then), so the list is always
exactly what is left to fix.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestration", "workers", "duet")

#: What ``main`` still does wrong; emptied as the layout work lands. Each entry is
#: ``(rule, file, what)``: ``what`` is the imported module for "layer", the private name
#: (``module.name``) for "private", and the import edge ``a -> b`` that closes a circle
#: for "circle" (the circle test ignores these edges and expects no other circle).
KNOWN_TODAY: frozenset[tuple[str, str, str]] = frozenset()


# --- reading the tree -----------------------------------------------------------------
@dataclass(frozen=True)
class Edge:
    """``src`` imports ``dst`` at ``file:line``."""

    src: str
    dst: str
    file: str
    line: int
    type_only: bool = False

    def __str__(self) -> str:
        how = " (TYPE_CHECKING)" if self.type_only else ""
        return f"{self.file}:{self.line}: {self.src} -> {self.dst}{how}"


@dataclass(frozen=True)
class Finding:
    """One broken rule: ``(rule, file, what)`` is its identity, ``line`` says where."""

    rule: str
    file: str
    line: int
    what: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.rule, self.file, self.what)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


@dataclass
class Module:
    name: str
    path: Path
    root: Path
    is_package: bool
    tree: ast.Module
    edges: list[Edge] = field(default_factory=list)
    #: local name -> the dotted thing an import bound it to (a module or module.attr).
    aliases: dict[str, str] = field(default_factory=dict)
    #: every dotted thing an import bound, with the line of the import.
    bound: list[tuple[str, int]] = field(default_factory=list)

    @property
    def file(self) -> str:
        return self.path.relative_to(self.root).as_posix()

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]


def discover(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Module]:
    """Every module of ``packages`` under ``root``, parsed, with its imports resolved."""
    modules: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            modules[".".join(parts)] = Module(".".join(parts), path, root, is_package, tree)
    for module in modules.values():
        _Imports(module, modules).visit(module.tree)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Imports(ast.NodeVisitor):
    """Records a module's import edges and the names its imports bind."""

    def __init__(self, module: Module, modules: dict[str, Module]) -> None:
        self.module = module
        self.modules = modules
        self.type_only = False

    def _edge(self, dst: str, node: ast.AST) -> None:
        self.module.edges.append(
            Edge(self.module.name, dst, self.module.file, node.lineno, self.type_only)  # type: ignore[attr-defined]
        )

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.visit(node.test)
        outer, self.type_only = self.type_only, True
        for child in node.body:
            self.visit(child)
        self.type_only = outer
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._edge(alias.name, node)
            self.module.bound.append((alias.name, node.lineno))
            if alias.asname:
                self.module.aliases[alias.asname] = alias.name
            else:
                top = alias.name.partition(".")[0]
                self.module.aliases[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node.module, node.level)
        for alias in node.names:
            if alias.name == "*":
                self._edge(base, node)
                continue
            target = f"{base}.{alias.name}"
            self._edge(target if target in self.modules else base, node)
            self.module.aliases[alias.asname or alias.name] = target
            self.module.bound.append((target, node.lineno))

    def visit_Call(self, node: ast.Call) -> None:
        func = qualify(self.module, node.func)
        if (
            func in ("importlib.import_module", "__import__")
            or (isinstance(node.func, ast.Name) and node.func.id == "__import__")
        ) and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                if name.value.startswith("."):
                    package = next((k.value for k in node.keywords if k.arg == "package"), None)
                    if isinstance(package, ast.Constant) and isinstance(package.value, str):
                        self._edge(_resolve_relative(name.value, package.value), node)
                else:
                    self._edge(name.value, node)
        self.generic_visit(node)

    def _absolute(self, name: str | None, level: int) -> str:
        if level == 0:
            return name or ""
        package = self.module.package.split(".")
        if level > 1:
            package = package[: len(package) - (level - 1)]
        return ".".join([*package, name] if name else package)


def _resolve_relative(name: str, package: str) -> str:
    level = len(name) - len(name.lstrip("."))
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    rest = name[level:]
    return ".".join([*parts, rest] if rest else parts)


def qualify(module: Module, node: ast.expr) -> str | None:
    """``os.environ.get`` -> ``"os.environ.get"`` when ``os`` was bound by an import."""
    if isinstance(node, ast.Name):
        return module.aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = qualify(module, node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


@cache
def tree() -> dict[str, Module]:
    return discover()


def first_party(name: str) -> bool:
    return name.partition(".")[0] in PACKAGES


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# --- the rules ------------------------------------------------------------------------
def runtime_graph(
    modules: dict[str, Module], ignore: Iterable[str] = ()
) -> dict[str, dict[str, Edge]]:
    """Module -> the modules it imports when it runs (first edge of each pair).

    Type-only edges and those in ``ignore`` (written ``"a -> b"``) are left out.
    """
    skip = set(ignore)
    graph: dict[str, dict[str, Edge]] = defaultdict(dict)
    for module in modules.values():
        for edge in module.edges:
            if edge.type_only or edge.dst not in modules or f"{edge.src} -> {edge.dst}" in skip:
                continue
            graph[edge.src].setdefault(edge.dst, edge)
    return graph


def circles(modules: dict[str, Module], ignore: Iterable[str] = ()) -> list[list[Edge]]:
    """One circle (as its edges) per strongly connected group of modules."""
    graph = runtime_graph(modules, ignore)
    found = []
    for group in _strongly_connected(graph, sorted(modules)):
        start = min(group)
        if len(group) == 1 and start not in graph[start]:
            continue
        found.append(_cycle_through(graph, group, start))
    return found


def closes_a_circle(graph: dict[str, dict[str, Edge]], src: str, dst: str) -> bool:
    """Whether the edge ``src -> dst`` exists and ``dst`` leads back to ``src``."""
    if dst not in graph.get(src, {}):
        return False
    seen, todo = {dst}, [dst]
    while todo:
        for child in graph.get(todo.pop(), {}):
            if child == src:
                return True
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return False


def _strongly_connected(graph: dict[str, dict[str, Edge]], nodes: list[str]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in nodes:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def _cycle_through(graph: dict[str, dict[str, Edge]], group: set[str], start: str) -> list[Edge]:
    """The shortest path from ``start`` back to itself inside ``group``, as edges."""
    came_from: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child, edge in sorted(graph[node].items()):
                if child not in group:
                    continue
                if child == start:
                    path = [edge]
                    while path[0].src != start:
                        path.insert(0, came_from[path[0].src])
                    return path
                if child not in came_from:
                    came_from[child] = edge
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"no circle through {start}")  # pragma: no cover


#: Layer of each module (longest prefix wins) and the layers it may import from.
LAYERS = {
    "orchestration.core": "core",
    "orchestration.state": "state",
    "orchestration.services": "services",
    "orchestration.client": "client",
    "orchestration.settings": "settings",
    "orchestration.prices": "prices",
    "orchestration.logjson": "logjson",
    "orchestration.backoff": "backoff",
    "orchestration.defaults": "defaults",
    "orchestration": "orchestration",  # the package's public face (re-exports)
    "workers": "workers",
    "duet": "duet",
}
ORCHESTRATION = {
    "core",
    "state",
    "services",
    "client",
    "settings",
    "prices",
    "logjson",
    "backoff",
    "defaults",
    "orchestration",
}
MAY_IMPORT = {
    "core": {"core"},
    "state": {"core", "state", "settings", "backoff", "defaults"},
    # The environment's defaults (finished TTL, step lease) live with the keys.
    "settings": {"core", "state", "defaults"},
    # The price database, read into core Price values (a package the core may not import).
    "prices": {"core"},
    # The JSON log line format, shared by workers and the command line: imports none of ours.
    "logjson": set(),
    # The one backoff policy (tenacity's loop): imports none of ours.
    "backoff": set(),
    # The tunables that are not settings, with their units: imports none of ours.
    "defaults": set(),
    "services": {"core", "state", "settings", "prices", "services", "backoff", "defaults"},
    "client": {"core", "state", "settings", "prices", "client", "defaults"},
    "orchestration": ORCHESTRATION,
    "workers": ORCHESTRATION | {"workers"},
    "duet": ORCHESTRATION | {"workers", "duet"},
}


def layer_of(module: str) -> str | None:
    """The layer ``module`` belongs to, or None when the layout does not place it."""
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or (module.startswith(prefix + ".") and prefix != "orchestration"):
            return LAYERS[prefix]
    return None


def layer_findings(modules: dict[str, Module]) -> list[Finding]:
    found = []
    for module in modules.values():
        mine = layer_of(module.name)
        for edge in module.edges:
            if not first_party(edge.dst):
                continue
            theirs = layer_of(edge.dst)
            if mine is None or theirs is None or theirs not in MAY_IMPORT[mine]:
                found.append(
                    Finding(
                        "layer",
                        module.file,
                        edge.line,
                        edge.dst,
                    )
                )
    return found


#: Imports the core may not make: a module and everything under it.
IMPURE_MODULES = (
    "celery",
    "kombu",
    "redis",
    "openai",
    "anthropic",
    "httpx",
    "requests",
    "aiohttp",
    "socket",
    "ssl",
    "http",
    "urllib.request",
    "subprocess",
    "threading",
    "asyncio",
)
#: Names the core may not touch: the environment and the clock.
IMPURE_NAMES = (
    "os.environ",
    "os.environb",
    "os.getenv",
    "os.getenvb",
    "os.putenv",
    "os.unsetenv",
    "time.time",
    "time.time_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.process_time",
    "time.sleep",
    "time.localtime",
    "time.gmtime",
    "time.ctime",
    "time.asctime",
    "time.strftime",
    "datetime.datetime.now",
    "datetime.datetime.utcnow",
    "datetime.datetime.today",
    "datetime.date.today",
)


def _matches(name: str, prefixes: Iterable[str]) -> str | None:
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def purity_findings(
    modules: dict[str, Module], folder: str = "orchestration.core"
) -> list[Finding]:
    found: set[Finding] = set()
    for module in modules.values():
        if not (module.name == folder or module.name.startswith(folder + ".")):
            continue
        imported = [(e.dst, e.line) for e in module.edges] + module.bound
        for target, line in imported:
            if _matches(target, IMPURE_MODULES + IMPURE_NAMES):
                found.add(Finding("pure", module.file, line, f"imports {target}"))
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Name | ast.Attribute):
                name = qualify(module, node)
                bad = _matches(name, IMPURE_NAMES) if name else None
                if bad:
                    found.add(Finding("pure", module.file, node.lineno, f"uses {bad}"))
    return sorted(found, key=lambda f: (f.file, f.line, f.what))


def _private_definitions(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Private name -> where it is defined: ``module`` or ``module.Class`` (a method, or an
    attribute a method assigns on ``self``)."""
    defined: dict[str, set[str]] = defaultdict(set)

    def record(name: str, owner: str) -> None:
        if _is_private(name):
            defined[name].add(owner)

    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                owner = f"{module.name}.{node.name}"
                for item in ast.walk(node):
                    if (
                        isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                        and item is not node
                    ):
                        record(item.name, owner)
                    elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        record(item.attr, owner)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        record(item.target.id, owner)
                record(node.name, module.name)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                record(node.name, module.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                record(node.id, module.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _is_self(node.value)
            ):
                # (a store on another object, ``app._pool = None``, defines nothing here)
                record(node.attr, module.name)
    return defined


def _defined_in(owner: str, module: str) -> bool:
    return owner == module or owner.startswith(module + ".")


def private_findings(modules: dict[str, Module]) -> list[Finding]:
    defined = _private_definitions(modules)
    found: set[Finding] = set()
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    source = module.aliases.get(alias.asname or alias.name, "")
                    owner = source.rpartition(".")[0]
                    if _is_private(alias.name) and first_party(owner) and owner != module.name:
                        found.add(Finding("private", module.file, node.lineno, source))
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                owner = qualify(module, node.value)
                if owner in modules and owner != module.name:
                    found.add(Finding("private", module.file, node.lineno, f"{owner}.{node.attr}"))
                elif owner is None and not _is_self(node.value):
                    # obj._name: private to another of our modules, unknown to this one.
                    owners = defined.get(node.attr, set())
                    if owners and not any(_defined_in(o, module.name) for o in owners):
                        # name the class when one defines it (the walk also sees it as
                        # the module's): the longest owner is the most precise
                        where = f"{max(sorted(owners), key=len)}.{node.attr}"
                        found.add(Finding("private", module.file, node.lineno, where))
    return sorted(found, key=lambda f: (f.file, f.line, f.what))


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


# --- the tests ------------------------------------------------------------------------
def _fail(title: str, lines: Iterable[object]) -> None:
    lines = [str(line) for line in lines]
    if lines:
        pytest.fail(title + ":\n" + "\n".join(f"  {line}" for line in lines), pytrace=False)


def _new(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.key not in KNOWN_TODAY]


def test_every_module_is_found_and_placed_in_a_layer() -> None:
    modules = tree()
    for package in PACKAGES:
        assert package in modules, f"{package}/__init__.py not found under {ROOT}"
    assert "orchestration.core.loop" in modules
    assert any(m.edges for m in modules.values())
    _fail(
        "modules in no layer (add them to LAYERS)",
        [m.file for m in modules.values() if layer_of(m.name) is None],
    )


def test_no_import_circle() -> None:
    known = [what for rule, _, what in KNOWN_TODAY if rule == "circle"]
    found = circles(tree(), ignore=known)
    _fail("import circles", ["\n  ".join(map(str, circle)) + "\n" for circle in found])


def test_layers_point_down_only() -> None:
    _fail("imports that point up or sideways", _new(layer_findings(tree())))


def test_core_is_pure() -> None:
    _fail("the core touches I/O, the environment or the clock", purity_findings(tree()))


def test_no_private_names_across_modules() -> None:
    _fail("another module's private names used", _new(private_findings(tree())))


def test_known_today_is_still_true() -> None:
    """Each entry of KNOWN_TODAY still happens; a fixed one must leave the list."""
    modules = tree()
    present = {f.key for f in layer_findings(modules) + private_findings(modules)}
    graph = runtime_graph(modules)
    for rule, _, what in KNOWN_TODAY:
        src, _, dst = what.partition(" -> ")
        if rule == "circle" and closes_a_circle(graph, src, dst):
            present.add((rule, modules[src].file, what))
    _fail("fixed, so remove from KNOWN_TODAY", sorted(set(KNOWN_TODAY) - present))


# --- the checker itself, on a small planted tree ---------------------------------------
def plant(root: Path, files: dict[str, str]) -> dict[str, Module]:
    """Write a tiny tree of our three packages (plus ``files``) and read it."""
    base = {
        f"{p}/__init__.py": "" for p in (*PACKAGES, "orchestration/core", "orchestration/state")
    }
    for name, text in {**base, **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return discover(root)


def test_checker_sees_a_circle_closed_inside_a_function(tmp_path: Path) -> None:
    modules = plant(
        tmp_path,
        {
            "orchestration/core/a.py": "from orchestration.core import b\n",
            "orchestration/core/b.py": "def f():\n    from . import a\n",
        },
    )
    [circle] = circles(modules)
    assert [str(e) for e in circle] == [
        "orchestration/core/a.py:1: orchestration.core.a -> orchestration.core.b",
        "orchestration/core/b.py:2: orchestration.core.b -> orchestration.core.a",
    ]
    assert circles(modules, ignore=["orchestration.core.b -> orchestration.core.a"]) == []


def test_checker_leaves_type_only_circles_to_the_layer_rule(tmp_path: Path) -> None:
    modules = plant(
        tmp_path,
        {
            "orchestration/core/a.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..state.s import S\n"
                "else:\n    import json\n"
            ),
            "orchestration/state/s.py": "from orchestration.core.a import A\n",
        },
    )
    assert circles(modules) == []
    assert [str(f) for f in layer_findings(modules)] == [
        "orchestration/core/a.py:3: orchestration.state.s"
    ]
    assert not modules["orchestration.core.a"].edges[-1].type_only  # the else branch runs


def test_checker_sees_upward_imports_of_every_form(tmp_path: Path) -> None:
    modules = plant(
        tmp_path,
        {
            "orchestration/core/a.py": (
                "import importlib\n"
                "def f():\n"
                "    importlib.import_module('orchestration.state.s')\n"
                "    import orchestration.settings\n"
            ),
            "orchestration/settings.py": "",
            "orchestration/state/s.py": "from orchestration import settings\n",
            "workers/w.py": "def f():\n    from duet import d\n",
            "duet/d.py": "import workers.w\nfrom orchestration.state import s\n",
        },
    )
    assert sorted(str(f) for f in layer_findings(modules)) == [
        "orchestration/core/a.py:3: orchestration.state.s",
        "orchestration/core/a.py:4: orchestration.settings",
        "workers/w.py:2: duet.d",
    ]


def test_checker_sees_io_environment_and_clock_in_any_core_file(tmp_path: Path) -> None:
    modules = plant(
        tmp_path,
        {
            "orchestration/core/new/__init__.py": "",
            "orchestration/core/new/deep.py": (
                "import datetime, os\n"
                "from time import monotonic\n"
                "from urllib import parse, request\n"
                "def f():\n"
                "    import redis.client\n"
                "    return datetime.datetime.now(), os.environ.get('X'), monotonic()\n"
            ),
            "orchestration/state/s.py": "import os, redis\nos.getenv('X')\n",
        },
    )
    assert sorted(str(f) for f in purity_findings(modules)) == [
        "orchestration/core/new/deep.py:2: imports time.monotonic",
        "orchestration/core/new/deep.py:3: imports urllib.request",
        "orchestration/core/new/deep.py:5: imports redis.client",
        "orchestration/core/new/deep.py:6: uses datetime.datetime.now",
        "orchestration/core/new/deep.py:6: uses os.environ",
        "orchestration/core/new/deep.py:6: uses time.monotonic",
    ]


def test_checker_sees_private_names_taken_from_another_module(tmp_path: Path) -> None:
    modules = plant(
        tmp_path,
        {
            "orchestration/state/s.py": (
                "_TABLE = {}\n"
                "class Ledger:\n"
                "    def __init__(self):\n        self._script = None\n"
                "    def _settle(self):\n        return self._script, _TABLE\n"
            ),
            "workers/w.py": (
                "from orchestration.state import s\n"
                "from orchestration.state.s import _TABLE, Ledger\n"
                "def f(ledger: Ledger):\n"
                "    return s._TABLE, ledger._settle(), ledger._script, s.__name__\n"
            ),
        },
    )
    assert sorted(str(f) for f in private_findings(modules)) == [
        "workers/w.py:2: orchestration.state.s._TABLE",
        "workers/w.py:4: orchestration.state.s.Ledger._script",
        "workers/w.py:4: orchestration.state.s.Ledger._settle",
        "workers/w.py:4: orchestration.state.s._TABLE",
    ]


def test_test_files_have_names_of_their_own() -> None:
    """The test folders are not packages, so pytest imports each file by its base name: two
    files of one name in two folders cannot run in one session."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
