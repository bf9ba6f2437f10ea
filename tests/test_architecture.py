"""The package's structure as rules that fail when broken, read from the source (no import runs):

- the PostgreSQL store (recall/pg/) reaches no module of the files store's, nor they it, even
  through a third module: what both need is recall/domain/ (what a conversation is, the
  forgetting rules, the errors, the answers) or recall/indexing/ (the pieces, the workers);
- recall/domain/ reaches neither store, and does no file I/O and no SQL;
- no import circle among recall/, benchmark/, devtools/ and recall_server.py;
- the wheel ships no test or demo helper, and every package under recall/.

Every import counts, at the top of a module or inside a function or an ``if TYPE_CHECKING:``: a
lazy import is still a dependency. Importing ``a.b.c`` also runs ``a`` and ``a.b``.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What reads or writes files, or speaks SQL: never in the domain.
IO_MODULES = {"fcntl", "io", "os", "pathlib", "psycopg", "psycopg_pool", "pgvector", "shutil"}
IO_MODULES |= {"socket", "sqlite3", "subprocess", "tempfile"}
IO_CALLS = {"open", "connect"}  # a builtin's or a driver's, called by name
IO_METHODS = {"mkdir", "read_bytes", "read_text", "rename", "rmdir", "touch", "unlink"}
IO_METHODS |= {"write_bytes", "write_text", "connect", "cursor", "execute", "executemany"}


def sources() -> dict[str, Path]:
    """Every module of ours by its dotted name (a package by its own name)."""
    found = {"recall_server": ROOT / "recall_server.py"}
    for top in ("recall", "benchmark", "devtools"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


MODULES = sources()

# The files store: recall/files/ (its layout and lifecycle, its scheduler and backfill, its audit
# file, FilesStore) and recall/files/engines/ (funes; the embedded engine's SQLite store, seam and
# worker), which search its sources. What both stores use lives in recall/ranking/,
# recall/indexing/ and recall/domain/.
FILES_STORE = {name for name in MODULES if name.startswith("recall.files")}


def _parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for end in range(1, len(parts) + 1):
        yield ".".join(parts[:end])


def imports(name: str) -> set[str]:
    """The modules of ours that importing ``name`` runs directly, its parents' packages too."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b`: b is a module when there is one by that name, else a name in a
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            found.update(p for p in _parents(target) if p in MODULES and p != name)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def reached(start: str) -> dict[str, str]:
    """Every module importing ``start`` runs, transitively, each with the one it was met from."""
    seen = {start: ""}
    todo = [start]
    while todo:
        name = todo.pop()
        for target in GRAPH[name]:
            if target not in seen:
                seen[target] = name
                todo.append(target)
    return seen


def chain(seen: dict[str, str], end: str) -> str:
    names = [end]
    while seen[names[-1]]:
        names.append(seen[names[-1]])
    return " -> ".join(reversed(names))


def crossings(starts: set[str], forbidden: set[str]) -> list[str]:
    """The import chains from a module of ``starts`` to one of ``forbidden``."""
    found = []
    for start in sorted(starts):
        seen = reached(start)
        found += [chain(seen, end) for end in sorted(forbidden & seen.keys())]
    return found


PG = {name for name in MODULES if name.startswith("recall.pg")}
DOMAIN = {name for name in MODULES if name.startswith("recall.domain")}


def test_the_files_store_modules_named_here_exist() -> None:
    assert MODULES.keys() >= FILES_STORE, FILES_STORE - MODULES.keys()
    files = {"store", "layout", "lifecycle", "audit_file", "scheduler", "backfill"}
    assert {f"recall.files.{name}" for name in files} <= FILES_STORE
    assert PG and DOMAIN


def test_the_postgresql_store_reaches_no_module_of_the_files_store() -> None:
    assert not crossings(PG, FILES_STORE)


def test_the_files_store_reaches_no_module_of_the_postgresql_store() -> None:
    assert not crossings(FILES_STORE & MODULES.keys(), PG)


def test_the_domain_reaches_neither_store() -> None:
    assert DOMAIN, "recall/domain/ is missing"
    assert not crossings(DOMAIN, FILES_STORE | PG | {"recall.store"})


def test_the_domain_does_no_file_io_and_no_sql() -> None:
    assert DOMAIN, "recall/domain/ is missing"
    found = []
    for name in sorted(DOMAIN):
        path = MODULES[name]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module or ""]
            else:
                modules = []
            found += [f"{name} imports {m}" for m in modules if m.split(".")[0] in IO_MODULES]
            if isinstance(node, ast.Call):
                func = node.func
                named = isinstance(func, ast.Name) and func.id in IO_CALLS
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if named or (isinstance(func, ast.Attribute) and called in IO_METHODS):
                    found.append(f"{name}:{node.lineno} calls {called}()")
    assert not found


def cycles() -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target in sorted(GRAPH[name]):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    return found


def test_no_import_circle() -> None:
    assert not cycles()


def package_of(name: str) -> str:
    """The package of recall a module belongs to: ``recall.pg`` for ``recall.pg.search``,
    ``recall.auth`` for a module directly under recall/."""
    return ".".join(name.split(".")[:2])


def test_no_two_packages_of_recall_import_each_other() -> None:
    """The package map reads one way: the app above the stores, the stores above ranking,
    indexing and the domain; no package reaches back into one that reaches it."""
    ours = [name for name in MODULES if name.startswith("recall.")]
    reaches: dict[str, set[str]] = {package_of(name): set() for name in ours}
    for name in ours:
        reaches[package_of(name)] |= {package_of(t) for t in GRAPH[name]} - {package_of(name)}
    both_ways = sorted(
        f"{a} <-> {b}" for a in reaches for b in reaches[a] if a < b and a in reaches.get(b, ())
    )
    assert not both_ways


def test_ranking_indexing_and_the_domain_import_neither_store() -> None:
    shared = {n for n in MODULES if package_of(n) in ("recall.ranking", "recall.indexing")}
    assert not crossings(shared | DOMAIN, FILES_STORE | PG)


def test_the_wheel_ships_every_package_of_recall_and_no_test_or_demo_helper() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(config["packages"])
    inits = (ROOT / "recall").rglob("__init__.py")
    on_disk = {".".join(init.parent.relative_to(ROOT).parts) for init in inits}
    assert packages == on_disk
    assert config["py-modules"] == ["recall_server"]
    shipped = {
        path.stem
        for package in packages
        for path in (ROOT / package.replace(".", "/")).glob("*.py")
    }
    assert not shipped & {"testing", "demo"}
