"""No module of rec_sdk reads or calls another class's private members (a name with one
leading underscore) except where it says so: TensorFlow's privates only through
rec_sdk/base/tf_patches.py (one accessor each) or the stock optimizers' documented reader,
rec_sdk/dynamic_embedding/optimizer_kinds.py (private_state, private_call). Checked statically
over python/rec_sdk and graph_rewrite: attribute access on anything but self and cls,
getattr/setattr/hasattr with a private name, and imports of private names."""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPS = ("python/rec_sdk", "graph_rewrite")
# The two modules that name TensorFlow's privates.
READERS = {
    "python/rec_sdk/base/tf_patches.py",
    "python/rec_sdk/dynamic_embedding/optimizer_kinds.py",
}
# A class's own members reached through another name than self (each: file, expression).
OWN_CLASS = {
    # ConfigInitializer's singleton, in its own class methods.
    ("python/rec_sdk/util/initialize.py", "ConfigInitializer._single_instance"),
    # A namedtuple's public method.
    ("python/rec_sdk/tables/tier.py", "tier._replace"),
    # The table a shard on another rank follows (same class).
    ("python/rec_sdk/tables/admission.py", "self._admission_owner._admission"),
    # Equality of two TfraTables (same class).
    ("python/rec_sdk/dynamic_embedding/tfra_table.py", "other._shard"),
    # The copies a SavedModel export makes of the object itself (same class).
    ("python/rec_sdk/dynamic_embedding/string_values.py", "exported._tables_of_values"),
    ("python/rec_sdk/dynamic_embedding/variable_checkpoint.py", "exported._shards"),
    # Served tables made by their own classmethods (cls.__new__, then _make).
    ("python/rec_sdk/serving/mutable.py", "table._make"),
    ("python/rec_sdk/serving/indexed.py", "table._make"),
    # Python's documented API, not a class's private members: a namedtuple's fields (a
    # fetch structure rebuilt as TensorFlow's session does), and the exit of a rank that
    # cannot end its step otherwise.
    ("python/rec_sdk/distribute/ranks/input_end.py", "hasattr(fetches, '_fields')"),
    ("python/rec_sdk/distribute/ranks/watchdog.py", "os._exit"),
}


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def private_uses(path, rel):
    """(line, expression) of every private use in one file, as described above."""
    out = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            # super()._method(): a subclass calling its base's implementation of the method
            # it overrides (TensorFlow's extension points, e.g. _serialize_to_tensors).
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
                continue
            out.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and any(_private(a.name) for a in node.names):
            out.append((node.lineno, ast.unparse(node)))
    return [(line, expr) for line, expr in out if (rel, expr) not in OWN_CLASS]


def test_private_members_are_read_only_through_the_two_readers():
    found = []
    for top in TOPS:
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, ROOT)
                if name.endswith(".py") and rel not in READERS:
                    found += ["%s:%d %s" % (rel, line, e) for line, e in private_uses(path, rel)]
    assert not found, "private members read outside tf_patches.py / optimizer_kinds.py:\n" + (
        "\n".join(found)
    )


def test_the_check_finds_each_kind_of_private_use(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from x import _hidden\n"
        "a = op._set_attr\n"
        "b = getattr(saver, '_last_checkpoints', [])\n"
        "c = self._own\n"
        "d = super()._base_impl()\n"
    )
    assert [e for _, e in private_uses(str(module), "m.py")] == [
        "from x import _hidden",
        "op._set_attr",
        "getattr(saver, '_last_checkpoints', [])",
    ]
