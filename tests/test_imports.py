"""The package's import structure: each folder of the packages is one layer (the list in
docs/ARCHITECTURE.md, "Layers"), modules import only their own layer and the layers below, no
import cycle and no function-local imports (which would hide one), checked statically over
every module; and every module imports in a fresh interpreter whatever is imported first (all
modules in sorted and in reverse order)."""

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {
    "rec_sdk": os.path.join(ROOT, "python", "rec_sdk"),
    "rec_sdk_graph_rewrite": os.path.join(ROOT, "graph_rewrite"),
}


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
            local += [
                (module, n.lineno)
                for n in ast.walk(node)
                if isinstance(n, (ast.Import, ast.ImportFrom))
            ]
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


def _direct_imports(module, path):
    """The modules `module` names in its module-level imports (from X import Y: X.Y when it
    is a module, else X), without the packages Python runs on the way."""
    tree = ast.parse(open(path).read(), path)
    targets = set()
    for node in tree.body:
        for n in ast.walk(node):
            if isinstance(n, ast.Import):
                targets.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names = ["%s.%s" % (n.module, a.name) for a in n.names]
                targets.update(name for name in names if name in MODULES)
                if any(name not in MODULES for name in names):
                    targets.add(n.module)
    return {t for t in targets if t in MODULES and t != module}


def _folder(module):
    """The folder of a module, as the layer table names it: `rec_sdk/tables` for
    rec_sdk.tables.table and for the package rec_sdk.tables itself."""
    path = MODULES[module]
    for package, top in PACKAGES.items():
        if path.startswith(top + os.sep):
            relative = os.path.relpath(os.path.dirname(path), top)
            return package if relative == "." else package + "/" + relative.replace(os.sep, "/")
    raise AssertionError(path)


FOLDERS = sorted({_folder(m) for m in MODULES})


def _layers():
    """[(layer name, [folders])], bottom first, from docs/ARCHITECTURE.md."""
    text = open(os.path.join(ROOT, "docs", "ARCHITECTURE.md")).read()
    block = text.split("<!-- layers: read by tests/test_imports.py -->", 1)[1]
    block = block.split("<!-- end layers -->", 1)[0]
    layers = []
    for line in block.strip().splitlines()[2:]:
        name, folders = [c.strip() for c in line.strip().strip("|").split("|")]
        layers.append((name, re.findall(r"`([^`]+)`", folders)))
    return layers


def test_each_folder_is_in_exactly_one_layer():
    """Folders are layers: the table lists every folder of the packages once, and nothing
    else."""
    listed = [folder for _, folders in _layers() for folder in folders]
    twice = sorted({f for f in listed if listed.count(f) > 1})
    assert not twice, "folders listed in more than one layer: %s" % twice
    assert sorted(listed) == FOLDERS, (
        "folders missing from the layer table: %s; listed but not folders of the packages: %s"
        % (sorted(set(FOLDERS) - set(listed)), sorted(set(listed) - set(FOLDERS)))
    )


def _layer_of(module, layers):
    folder = _folder(module)
    found = [i for i, (_, folders) in enumerate(layers) if folder in folders]
    assert len(found) == 1, (
        "%s (folder %s) is in %s of ARCHITECTURE's layers (needs exactly "
        "one)" % (module, folder, [layers[i][0] for i in found] or "none")
    )
    return found[0]


def test_modules_import_only_their_layer_and_below():
    layers = _layers()
    assert len(layers) >= 5, layers
    upward = []
    for module, path in sorted(MODULES.items()):
        mine = _layer_of(module, layers)
        for target in sorted(_direct_imports(module, path)):
            theirs = _layer_of(target, layers)
            if theirs > mine:
                upward.append(
                    "%s (%s) imports %s (%s)" % (module, layers[mine][0], target, layers[theirs][0])
                )
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    """The check itself: a bottom-layer module importing the SDK API is found."""
    fake = tmp_path / "log.py"
    fake.write_text("from rec_sdk.core import embedding\n")
    layers = _layers()
    assert _direct_imports("rec_sdk.base.log", str(fake)) == {"rec_sdk.core.embedding"}
    assert _layer_of("rec_sdk.core.embedding", layers) > _layer_of("rec_sdk.base.log", layers)
    assert _folder("rec_sdk.base.log") == "rec_sdk/base"
    assert _folder("rec_sdk.tables") == "rec_sdk/tables"
    assert _folder("rec_sdk") == "rec_sdk"


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
                cycle = stack[stack.index(target) :] + [target]
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
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_setup_lists_every_package():
    """setup.py names the packages explicitly (the graph passes are installed under another
    name than their folder's): the list must match the source tree."""
    text = open(os.path.join(ROOT, "setup.py")).read()
    listed = text.split("PACKAGES = [", 1)[1].split("]", 1)[0]
    listed = sorted(p.strip().strip('",') for p in listed.split() if p.strip('",'))
    packages = sorted(m for m, path in MODULES.items() if path.endswith("__init__.py"))
    assert listed == packages
