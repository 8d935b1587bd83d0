"""hvdlite's modules import each other without cycles, counting the imports
inside functions: a cycle hidden in a function is still two modules that
each need the other, and the first call decides which half-initialised one
it sees."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("hvdlite", "launcher")


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _modules():
    found = {}
    for package in PACKAGES:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, package)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    found[_module_name(path)] = path
    return found


def _resolve(module, is_package, node):
    """Absolute names an ImportFrom may refer to (the module, and each
    imported name as a submodule)."""
    if node.level:
        parts = module.split(".")
        base = parts if is_package else parts[:-1]
        base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def imports_of(name, is_package, source, modules):
    """hvdlite's modules that module ``name`` imports, at any depth of its
    code. Importing a.b.c also imports the packages a and a.b; a module's
    own parent packages are left out (Python imports them first anyway)."""
    targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            targets.update(_resolve(name, is_package, node))
    edges = set()
    for t in targets:
        parts = t.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                edges.add(candidate)
    return edges


def import_graph():
    """{module: {module it imports}}, over the packages' own modules."""
    modules = _modules()
    return {name: imports_of(name, path.endswith("__init__.py"), open(path).read(), modules)
            for name, path in modules.items()}


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_function_level_imports_count():
    modules = {"p", "p.a", "p.b", "p.c"}
    source = "from . import a\n\ndef f():\n    from .b import g\n    import p.c\n"
    assert imports_of("p.d", False, source, modules) == {"p.a", "p.b", "p.c"}
    assert imports_of("p", True, "from .a import x\n", modules) == {"p.a"}


def test_find_cycle_names_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    graph = import_graph()
    sub = {m: {t for t in e if t.split(".")[0] == package} for m, e in graph.items()
           if m.split(".")[0] == package}
    cycle = find_cycle(sub)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
