"""The house's floors: a module may import the floors below it, never one above.

    6  tests (the tests), benchmarks, scripts
    5  testing (the harness: clusters, services, the chaos campaign's faults)
    4  server.cli (the commands)          server.web (the API, console, live logs)
    3  server (the process: runner, drivers, watchdog, settings, clients)
    2  scheduler, resource_center
    1  sql, registry

The CLI may import the web (its live logs and the endpoint ``server run`` serves); the
web never imports the CLI; the process imports neither (``sparkring server run`` hands
the web's ``endpoint.open`` to ``process.Server``). API tokens and the audit trail, which
both use, are ``scheduler``'s (floor 2). Read from the code's own ``import``
statements (every one, including those inside functions), so a new arrow that runs back
up fails here, with the file and line.

Within a floor, the product's modules import one another without a circle: no module
reaches itself through others' imports, type-only ones (under ``if TYPE_CHECKING:``)
included, since a reader follows those arrows too. A circle fails here with its files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Package (by its dotted prefix) -> prefixes it must never import. The longest
# matching prefix decides, so ``server.cli`` is not bound by ``server``'s rules.
# The product never imports the harness or the tests, nor the harness a test.
ABOVE_THE_PRODUCT = ("testing", "tests")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "sql": ("registry", "resource_center", "scheduler", "server", *ABOVE_THE_PRODUCT),
    "registry": ("resource_center", "scheduler", "server", *ABOVE_THE_PRODUCT),
    "resource_center": ("scheduler", "server", *ABOVE_THE_PRODUCT),
    "scheduler": ("server", *ABOVE_THE_PRODUCT),
    "server": ("server.cli", "server.web", *ABOVE_THE_PRODUCT),
    "server.web": ("server.cli", *ABOVE_THE_PRODUCT),
    "server.cli": ABOVE_THE_PRODUCT,
    # ``python -m server``: the program's front door runs the CLI; nothing imports it.
    "server.__main__": ABOVE_THE_PRODUCT,
    "testing": ("tests",),
}
CHECKED = ("sql", "registry", "resource_center", "scheduler", "server", "testing")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``; ``from a import b`` counts as both
    ``a`` and ``a.b`` (``b`` may be a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rules_of(module: str) -> tuple[str, ...]:
    owners = [p for p in FORBIDDEN if _within(module, p)]
    return FORBIDDEN[max(owners, key=len)] if owners else ()


def upward_imports(root: Path = REPO) -> list[str]:
    problems = []
    for package in CHECKED:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(path) if root == REPO else path.stem
            rules = rules_of(module)
            for line, imported in imports(path):
                bad = [p for p in rules if _within(imported, p)]
                if bad:
                    where = path.relative_to(root)
                    problems.append(f"{where}:{line}: {module} imports {imported}")
    return problems


def test_no_floor_imports_one_above_it() -> None:
    problems = upward_imports()
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "source", "upward"),
    [
        ("sql.tables", "from scheduler import states\n", True),
        ("resource_center.cache", "from server import defaults\n", True),
        ("server.process", "from server.web import api\n", True),
        ("server.process", "def f():\n    import server.cli.main\n", True),
        ("server.web.api", "from server.cli import console\n", True),
        ("server.cli.job", "from server.web import livelog\n", False),
        ("server.runner", "from scheduler import distribution\n", False),
        ("scheduler.jobs", "from sql import states\n", False),
        ("server.runner", "from testing import cluster\n", True),
        ("scheduler.jobs", "def f():\n    from tests import conftest\n", True),
        ("testing.cluster", "from tests.conftest import unavailable\n", True),
        ("testing.cluster", "from server.cli import main\n", False),
    ],
)
def test_the_check_sees_an_upward_import(
    tmp_path: Path, module: str, source: str, upward: bool
) -> None:
    path = tmp_path / "probe.py"
    path.write_text(source)
    rules = rules_of(module)
    hits = [name for _, name in imports(path) if any(_within(name, p) for p in rules)]
    assert bool(hits) is upward, (module, hits)


PRODUCT = ("sql", "registry", "resource_center", "scheduler", "server")


def import_graph(root: Path = REPO) -> tuple[dict[str, set[str]], dict[str, Path]]:
    """The product's modules -> the product's modules each imports (every import, those
    under ``if TYPE_CHECKING:`` and inside functions too), and each module's file."""
    files = {module_name(p): p for pkg in PRODUCT for p in sorted((root / pkg).rglob("*.py"))}
    graph = {
        module: {name for name in _targets(path, files) if name != module}
        for module, path in files.items()
    }
    return graph, files


def _targets(path: Path, files: dict[str, Path]) -> set[str]:
    """The product modules ``path`` imports. ``from a import b`` where ``a.b`` is a module
    is an arrow to ``a.b`` alone: a package's modules that import one another are no circle
    with the package's ``__init__`` that gathers them (import-linter reads it so too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            modules = subs & files.keys()
            found |= modules
            if len(modules) < len(subs):
                found.add(node.module)
    return found & files.keys()


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every circle of ``graph``: each largest set of two or more modules that all reach
    one another (a strongly connected component; Tarjan's algorithm, without recursion),
    sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in order:
            continue
        order[start] = low[start] = len(order)
        stack.append(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, arrows = work[-1]
            for target in arrows:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in stack:
                    low[node] = min(low[node], order[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == order[node]:
                    component = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_no_circle_among_the_products_modules() -> None:
    graph, files = import_graph()
    found = circles(graph)
    assert found == [], "\n".join(
        f"a circle of {len(members)} modules: "
        + " ".join(str(files[m].relative_to(REPO)) for m in members)
        for members in found
    )


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        ({"a": "import b\n", "b": "import a\n"}, [["a", "b"]]),
        (
            {
                "a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n",
                "b": "def f():\n    from c import g\n",
                "c": "from a import x\n",
            },
            [["a", "b", "c"]],
        ),
        ({"a": "import b\n", "b": "import c\n", "c": "import os\n"}, []),
        (
            {"a": "import b\n", "b": "import a, c\n", "c": "import d\n", "d": "import c\n"},
            [["a", "b"], ["c", "d"]],
        ),
    ],
    ids=["two", "type-only-and-in-a-function", "none", "two-circles"],
)
def test_the_check_sees_a_circle(
    tmp_path: Path, sources: dict[str, str], expected: list[list[str]]
) -> None:
    graph = {}
    for name, source in sources.items():
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        graph[name] = {imported for _, imported in imports(path) if imported in sources}
    assert circles(graph) == expected


def test_a_packages_modules_importing_one_another_are_no_circle_with_its_init(
    tmp_path: Path,
) -> None:
    """``pkg/__init__.py`` gathers its modules, which import each other by
    ``from pkg import sibling``: arrows to the siblings, not to ``pkg``; an import of a
    name that ``__init__`` defines is an arrow to ``pkg``."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    sources = {
        "__init__": "from pkg.a import f\nfrom pkg.b import g\n",
        "a": "from pkg import b\n",
        "b": "import os\n",
    }
    for name, source in sources.items():
        (pkg / f"{name}.py").write_text(source)
    files = {("pkg" if n == "__init__" else f"pkg.{n}"): pkg / f"{n}.py" for n in sources}
    graph = {m: _targets(path, files) - {m} for m, path in files.items()}
    assert circles(graph) == []
    (pkg / "b.py").write_text("from pkg import f\n")  # a name of __init__'s: the package
    graph = {m: _targets(path, files) - {m} for m, path in files.items()}
    assert circles(graph) == [["pkg", "pkg.a", "pkg.b"]]


def path_edits(source: str) -> list[int]:
    """Lines of ``source`` that change ``sys.path`` (insert, append, assignment...)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        target = (
            node.func.value
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            else node
        )
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t) == "sys.path" for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(target) == "sys.path":
            lines.append(node.lineno)
    return lines


def test_no_benchmark_or_script_touches_sys_path() -> None:
    """The harness (testing/) is imported as a package: benchmarks run as
    ``python -m benchmarks.NAME`` and the demo as ``python -m scripts.demo`` from the
    repository root (benchmarks/README.md)."""
    problems = [
        f"{path.relative_to(REPO)}:{line}"
        for folder in ("benchmarks", "scripts")
        for path in sorted((REPO / folder).rglob("*.py"))
        for line in path_edits(path.read_text())
    ]
    assert problems == [], problems


@pytest.mark.parametrize(
    ("source", "edits"),
    [
        ("import sys\nsys.path.insert(0, 'x')\n", [2]),
        ("import sys\nsys.path.append('x')\n", [2]),
        ("import sys\nsys.path = ['x']\n", [2]),
        ("import sys\nsys.path += ['x']\n", [2]),
        ("import sys\nprint(sys.path)\n", []),
    ],
)
def test_the_check_sees_a_sys_path_edit(source: str, edits: list[int]) -> None:
    assert path_edits(source) == edits
