"""What the import contracts cannot see, read from the source with ``ast``.

Layers, import circles and the core's imports are import-linter contracts
(``[tool.importlinter]`` in pyproject.toml, run by ``test_import_contracts.py``). Two rules
are about names, not imports, and stay here:

- **The core reads no environment and no clock**: no ``os.environ``, ``os.getenv``,
  ``time.time``, ``datetime.now`` ... under ``orchestration/core/``, imported or used.
- **No private names across modules**: no ``from x import _y`` and no ``x._y`` on an
  imported module ``x`` of ours, nor ``obj._y`` where ``_y`` is private to another of our
  modules (a method or attribute that only another file defines).

Each failure names the file and line.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestration", "workers", "duet")


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
            if _matches(target, IMPURE_NAMES):
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


def test_core_is_pure() -> None:
    _fail("the core touches I/O, the environment or the clock", purity_findings(tree()))


def test_no_private_names_across_modules() -> None:
    _fail("another module's private names used", private_findings(tree()))


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
