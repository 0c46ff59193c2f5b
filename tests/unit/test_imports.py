"""The shape of the imports: a pure core, and no circle.

* ``proxy.decision`` and ``proxy.protocol`` import nothing beyond the standard library,
  ``proxy`` itself, pydantic (with its own dependencies) and orjson: checked in a fresh
  interpreter whose import system refuses every other top-level module, which is what an
  environment holding only pydantic and orjson would do.
* The repository's Python modules (``proxy``, ``semif_tools``, ``scripts``, ``bench``,
  ``deploy``, ``tests``: every ``.py`` file outside hidden folders and virtual environments)
  import each other without a circle, counting the imports that run inside functions (a
  circle broken only by a deferred import is still a circle), and across the folders: one
  graph holds them all. Imports under ``if TYPE_CHECKING:`` never run and are not counted.
  A script folder without ``__init__.py`` (``bench/``) puts its own folder on ``sys.path``
  and may put its parent's there too: ``import overhead`` in ``bench/investigations/`` is
  ``bench/overhead.py``, the same file as ``bench.overhead``.
* ``proxy`` imports no module of ``semif_tools``, not even inside a function: the tools are
  clients of the server, with a command of their own.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "proxy"
TOOLS = ROOT / "semif_tools"
PURE = ("decision", "protocol")
# what the pure core may import besides the standard library: pydantic and what pydantic
# itself needs (its wheel's requirements), and orjson
ALLOWED = (
    "proxy",
    "pydantic",
    "pydantic_core",
    "typing_extensions",
    "annotated_types",
    "typing_inspection",
    "orjson",
)

# Run in a fresh interpreter: argv[1] is the allowance, argv[2:] the modules to import.
# Non-allowed modules that site-packages' start-up hooks (.pth files) already loaded are
# forgotten first, so that importing them again goes through the refusing finder. A module
# that is not installed at all is left to fail as usual (the standard library probes a few
# optional ones, such as copy's ``org``), and sysconfig's build-time data module, whose
# name carries the platform, counts as the standard library it is.
_REFUSE = """
import importlib, importlib.machinery, sys

allowed = set(sys.stdlib_module_names) | set(sys.argv[1].split(","))
refused = []

def importer():
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != "__main__":
            return name
        frame = frame.f_back
    return "?"

class Refuse:
    @staticmethod
    def find_spec(name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or top.startswith("_sysconfigdata_"):
            return None
        if path is None and importlib.machinery.PathFinder.find_spec(name) is None:
            return None
        refused.append(f"{name} (imported by {importer()})")
        raise ModuleNotFoundError(f"{name} is not available to the pure core", name=name)

for name in list(sys.modules):
    if name.partition(".")[0] not in allowed:
        del sys.modules[name]
sys.meta_path.insert(0, Refuse)
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        refused.append(f"{module} failed: {exc}")
if refused:
    sys.exit("refused: " + "; ".join(refused))
"""


def _modules(package: str) -> list[str]:
    """Every module of ``proxy.<package>``, from the files (importing would be the test)."""
    return [_module_name(path, ROOT) for path in sorted((PROXY / package).rglob("*.py"))]


def _import_alone(modules: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _REFUSE, ",".join(ALLOWED), *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_pure_core_imports_only_pydantic_and_orjson() -> None:
    modules = ["proxy.protocol.semif", *(m for p in PURE for m in _modules(p))]
    result = _import_alone(modules)
    assert result.returncode == 0, result.stderr


def test_the_pure_core_check_names_a_refused_import() -> None:
    """The check itself: the middleware needs aiohttp, and the refusal says who asked."""
    result = _import_alone(["proxy.decision", "proxy.middleware"])
    assert result.returncode != 0
    assert "aiohttp (imported by proxy.middleware)" in result.stderr


# -- the import graph ------------------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _ancestors(module: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages whose ``__init__`` runs before it."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at module level or in a function."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for otherwise in node.orelse:
                visit(otherwise)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolved(name: str, module: str, known: set[str]) -> str:
    """An absolute import's module: ``name`` itself when the repository has it, else, as a
    script's ``sys.path`` finds it, a module of that name in the importer's folder or one
    above it (``import overhead`` in ``bench.investigations.x``: ``bench.overhead``)."""
    if name in known:
        return name
    folders = module.split(".")[:-1]
    for depth in range(len(folders), 0, -1):
        beside = ".".join([*folders[:depth], name])
        if beside in known:
            return beside
    return name


def _targets(
    module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]
) -> set[str]:
    """The repository's modules that ``node`` (in ``module``) names, relative imports
    resolved.

    ``from .pkg import name`` names ``pkg.name`` when that is a module, ``pkg`` otherwise.
    """
    if isinstance(node, ast.Import):
        named = {_resolved(alias.name, module, known) for alias in node.names}
    else:
        if node.level:
            base_parts = module.split(".")
            if not is_package:
                base_parts = base_parts[:-1]
            base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join([*base_parts, *([node.module] if node.module else [])])
        else:
            base = node.module or ""
        named = set()
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if not node.level:
                sub, base = _resolved(sub, module, known), _resolved(base, module, known)
            named.add(sub if sub in known else base)
    return {name for name in named if name in known}


def _python_files(root: Path) -> list[Path]:
    """Every ``.py`` file under ``root``, outside hidden folders (``.git``, ``.venv``),
    caches and virtual environments (a folder with ``pyvenv.cfg``)."""
    found: list[Path] = []
    for path in sorted(root.iterdir()):
        if path.is_dir():
            if (
                not path.name.startswith((".", "__pycache__"))
                and not (path / "pyvenv.cfg").exists()
            ):
                found += _python_files(path)
        elif path.suffix == ".py":
            found.append(path)
    return found


def _graph(*folders: Path) -> dict[str, set[str]]:
    """Module -> the modules under ``folders`` that its execution may import; each folder's
    modules are named from its parent (``proxy/app.py``: ``proxy.app``).

    Importing ``proxy.routes.meta`` runs ``proxy/routes/__init__.py`` first, so an import
    also leads to the target's packages, except those that enclose the importer (they
    started before it and are already in ``sys.modules``). A package importing its own
    submodules is thus an edge down, never a circle with the submodule's implied way up.
    """
    files = {
        _module_name(path, folder.parent): path
        for folder in folders
        for path in _python_files(folder)
    }
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        own = {module, *_ancestors(module)}
        edges: set[str] = set()
        for node in _imports(tree):
            for target in _targets(module, path.name == "__init__.py", node, known):
                edges |= {t for t in (*_ancestors(target), target) if t not in own}
        graph[module] = edges & known
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle as ``[a, b, ..., a]``, or None (depth-first, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def _folders() -> list[Path]:
    """The repository's top-level folders that hold Python, every one of them."""
    tops = {ROOT / path.relative_to(ROOT).parts[0] for path in _python_files(ROOT)}
    assert all(top.is_dir() for top in tops), "a module at the root is not in the graph"
    return sorted(tops)


def test_the_repository_has_no_import_circle() -> None:
    graph = _graph(*_folders())
    assert {m.partition(".")[0] for m in graph} >= {
        "proxy",
        "semif_tools",
        "scripts",
        "bench",
        "deploy",
        "tests",
    }
    cycle = _find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_server_never_imports_the_tools() -> None:
    """The tools are clients of the server: ``proxy`` imports no module of ``semif_tools``, at
    module level or in a function (each package has its own command, pyproject.toml)."""
    graph = _graph(PROXY, TOOLS)
    upward = {
        module: sorted(t for t in targets if t.partition(".")[0] == TOOLS.name)
        for module, targets in graph.items()
        if module.partition(".")[0] == PROXY.name
    }
    assert not {module: targets for module, targets in upward.items() if targets}


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"a"}}, ["a", "a"]),
        ({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c"}}, ["c", "d", "c"]),
    ],
)
def test_find_cycle(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert _find_cycle(graph) == expected


def test_the_graph_reads_relative_deferred_and_package_imports(tmp_path: Path) -> None:
    files = {
        "__init__.py": "from . import a\n",
        "a.py": "def later():\n    from .sub.c import name\n",
        "b.py": "import pkg.sub\nfrom pkg import a as _a, missing\n",
        "sub/__init__.py": "from .c import name\n",
        "sub/c.py": (
            "from typing import TYPE_CHECKING\nfrom .. import b\nname = 1\n"
            "if TYPE_CHECKING:\n    from ..a import later\n"
        ),
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    assert _graph(tmp_path / "pkg") == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub", "pkg.sub.c"},  # deferred, and the package runs first
        "pkg.b": {"pkg.sub", "pkg.a"},  # an absolute import; a missing name is the package's
        "pkg.sub": {"pkg.sub.c"},  # down to a submodule, and no way back up
        "pkg.sub.c": {"pkg.b"},  # the TYPE_CHECKING import does not run
    }
    assert _find_cycle(_graph(tmp_path / "pkg")) == [
        "pkg.a",
        "pkg.sub",
        "pkg.sub.c",
        "pkg.b",
        "pkg.a",
    ]


def test_the_graph_finds_a_script_folders_modules_by_their_path(tmp_path: Path) -> None:
    """A folder without ``__init__.py`` whose scripts import each other by bare name, from
    their own folder or one above it, deferred too; hidden folders and virtual
    environments are not read."""
    files = {
        "tools/a.py": "import b\n",
        "tools/b.py": "def later():\n    from sub import c\n",
        "tools/sub/c.py": "import a, json\n",
        "tools/.hidden/d.py": "import a\n",
        "tools/env/pyvenv.cfg": "",
        "tools/env/e.py": "import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = _graph(tmp_path / "tools")
    assert graph == {
        "tools.a": {"tools.b"},
        "tools.b": {"tools.sub.c"},
        "tools.sub.c": {"tools.a"},  # its own folder has no a.py: the one above has
    }
    assert _find_cycle(graph) == ["tools.a", "tools.b", "tools.sub.c", "tools.a"]
