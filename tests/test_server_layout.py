"""The shape of ``agentwake/server``: imports between its modules form no cycle (``TYPE_CHECKING`` and
function-level imports included), and every module says what it is for in a docstring and stays
small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import agentwake.server

PACKAGE = "agentwake.server"
ROOT = Path(agentwake.server.__file__).parent
MAX_LINES = 700


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules of the package that ``name`` (at ``path``) imports, wherever the import is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` names a module; `from pkg import thing` names pkg itself.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            # `import a.b.c` or `from a.b.c import x` depends on the deepest module of ours it names.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(path, name, known) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as the path that closes it (first module repeated at the end), or None."""
    done: set[str] = set()
    trail: list[str] = []
    on_trail: set[str] = set()

    def visit(node: str) -> list[str] | None:
        trail.append(node)
        on_trail.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_trail:
                return [*trail[trail.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle is not None:
                    return cycle
        trail.pop()
        on_trail.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_the_cycle_finder_names_the_modules_of_a_cycle_and_accepts_a_tree() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_sees_type_checking_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "_probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from agentwake.server._extension import EventsExtension\n"
        "def later():\n"
        "    from . import _stream\n"
        "    import agentwake.server._read\n"
    )
    known = set(modules())
    found = imported(source, f"{PACKAGE}._probe", known)
    assert found == {f"{PACKAGE}._extension", f"{PACKAGE}._stream", f"{PACKAGE}._read"}


def test_the_server_package_imports_form_no_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in agentwake/server: " + " -> ".join(cycle or ())


def test_push_and_webhook_delivery_never_import_the_extension() -> None:
    graph = import_graph()
    for name in graph:
        if name.startswith((f"{PACKAGE}._stream", f"{PACKAGE}._webhook")):
            assert f"{PACKAGE}._extension" not in graph[name], name


def test_every_server_module_has_a_docstring_and_at_most_700_lines() -> None:
    for name, path in modules().items():
        text = path.read_text()
        assert ast.get_docstring(ast.parse(text)), f"{name} has no module docstring"
        assert len(text.splitlines()) <= MAX_LINES, f"{name} is over {MAX_LINES} lines"
