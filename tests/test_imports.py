"""The package's import structure: no import cycle and no function-local imports (which would
hide one), checked statically over every module; and every module imports in a fresh
interpreter whatever is imported first (all modules in sorted and in reverse order)."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"rec_sdk": os.path.join(ROOT, "python", "rec_sdk"),
            "rec_sdk_graph_rewrite": os.path.join(ROOT, "graph_rewrite")}


def _modules():
    """{module name: file path} of every module of the packages (package __init__s too)."""
    found = {}
    for package, top in PACKAGES.items():
        for directory, _, files in os.walk(top):
            if "__pycache__" in directory:
                continue
            parts = [package] + os.path.relpath(directory, top).split(os.sep)
            parts = [p for p in parts if p != "."]
            for name in files:
                if not name.endswith(".py"):
                    continue
                module = parts if name == "__init__.py" else parts + [name[:-3]]
                found[".".join(module)] = os.path.join(directory, name)
    return found


MODULES = _modules()


def _parents(module):
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(module, path):
    """(modules imported at module level, imports found inside functions or classes)."""
    tree = ast.parse(open(path).read(), path)
    local = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            local += [(module, n.lineno) for n in ast.walk(node)
                      if isinstance(n, (ast.Import, ast.ImportFrom))]
    targets = set()
    for node in tree.body if isinstance(tree, ast.Module) else []:
        for n in ast.walk(node):
            if isinstance(n, ast.Import):
                targets.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                targets.add(n.module)
                targets.update("%s.%s" % (n.module, a.name) for a in n.names)
    # Importing a.b.c first runs packages a and a.b; a module's own packages are already
    # being imported when it runs (a package importing its submodules is no cycle).
    own = set(_parents(module)) | {module}
    edges = set()
    for target in targets:
        if target in MODULES:
            edges.add(target)
            edges.update(p for p in _parents(target) if p in MODULES)
    return edges - own, local


def test_no_function_local_imports():
    local = []
    for module, path in sorted(MODULES.items()):
        local += _imports(module, path)[1]
    assert not local, "imports inside functions or classes: %s" % local


def test_no_import_cycle():
    graph = {m: _imports(m, p)[0] for m, p in MODULES.items()}
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import cycle: %s" % " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_every_module_imports_in_a_fresh_interpreter(order):
    modules = sorted(m for m in MODULES if not m.endswith("__main__"))
    if order == "reversed":
        modules.reverse()
    code = "import importlib\nfor m in %r:\n    importlib.import_module(m)\n" % modules
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]


def test_pyproject_lists_every_package():
    """pyproject.toml names the packages explicitly (the graph passes are installed under
    another name than their folder's): the list must match the source tree."""
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    listed = text.split("packages = [", 1)[1].split("]", 1)[0]
    listed = sorted(p.strip().strip('",') for p in listed.split() if p.strip('",'))
    packages = sorted(m for m, path in MODULES.items() if path.endswith("__init__.py"))
    assert listed == packages
