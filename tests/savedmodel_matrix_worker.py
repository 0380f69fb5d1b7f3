"""The SavedModel matrix of tests/test_savedmodel_matrix.py: de tables written by each way a
program saves a SavedModel, read back by each loader, each in a process of its own.

    savedmodel_matrix_worker.py write KIND DIR   # KIND: builder, estimator, module, keras
    savedmodel_matrix_worker.py load LOADER DIR  # LOADER: v1 (the TF1 loader), v2

`write` saves one SavedModel per case of KIND into DIR/<case> (a table upserted with known
rows, looked up by the serving signature `serving_default` from input "ids" to output "e")
and DIR/<case>.json: the probe keys and what the writing process served for them. `load`
prints one line "CASES <json>": {case: the served rows, or "error: ..."} for every case in
DIR. A case is KIND-KEYS-D-S-N-R: key dtype; a dense variable in the model; the table under
a scope; 2 shards; a restrict policy (each 0/1).
"""

import importlib.util
import itertools
import json
import os
import sys
import traceback

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if (
    sys.argv[1:2] == ["write"]
    and sys.argv[2:3] in (["module"], ["keras"])
    or sys.argv[1:3] == ["load", "v2"]
):
    if importlib.util.find_spec("tf_keras") is not None:  # TF >= 2.16: tf.keras is tf_keras
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    GRAPH_MODE = False
else:
    GRAPH_MODE = True

import tensorflow as tf  # noqa: E402  (after the environment above)

import rec_sdk.dynamic_embedding as de  # noqa: E402

if GRAPH_MODE:
    tf.compat.v1.disable_eager_execution()

DIM = 3
KEYS = {"int64": [3, 7, -(2**40)], "int32": [3, 7, -5], "string": ["a", "bb", ""]}
UNKNOWN = {"int64": 11, "int32": 11, "string": "zz"}
DTYPES = {"int64": tf.int64, "int32": tf.int32, "string": tf.string}
INITIAL = 0.5  # what a key never stored reads
DENSE = 2.0  # the dense variable the output is multiplied by (1.0 without one)
# Pairs of the four 0/1 options (dense, scoped, two shards, restrict) all covered by 5 cases.
OPTIONS = [(0, 0, 0, 0), (0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 0, 1), (1, 1, 1, 0)]
KINDS = ("builder", "estimator", "module", "keras")


def rows_of(keys):
    """The rows each case stores for its keys: row i is (i + 1) * [1, 10, -1]."""
    return np.array([[i + 1, 10 * (i + 1), -(i + 1)] for i in range(len(keys))], np.float32)


def cases(kind):
    return [
        "%s-%s-%d%d%d%d" % ((kind, keys) + opts) for keys, opts in itertools.product(KEYS, OPTIONS)
    ]


def parse(case):
    kind, keys, opts = case.split("-")
    dense, scoped, shards, restrict = (int(c) for c in opts)
    return (
        kind,
        keys,
        dict(
            dense=bool(dense),
            scoped=bool(scoped),
            shards=2 if shards else 1,
            restrict=bool(restrict),
        ),
    )


def probe(keys):
    return KEYS[keys] + [UNKNOWN[keys]]


def _feed(keys, values):
    return np.array(values, dtype=object if keys == "string" else keys)


def _variable_args(keys, opts):
    return dict(
        key_dtype=DTYPES[keys],
        dim=DIM,
        initializer=tf.keras.initializers.Constant(INITIAL),
        devices=["/CPU:0"] * opts["shards"],
        restrict_policy=de.TimestampRestrictPolicy if opts["restrict"] else None,
    )


# --- TF1 graphs: SavedModelBuilder and Estimator ------------------------------------------


def _graph_model(keys, opts, ids):
    """A de variable of the case and its looked-up rows (times the dense variable)."""
    scope = tf.compat.v1.variable_scope("outer") if opts["scoped"] else _nothing()
    with scope:
        var = de.get_variable("emb", **_variable_args(keys, opts))
        out = de.embedding_lookup(var, ids, name="lookup")
        if opts["dense"]:
            out = out * tf.compat.v1.get_variable(
                "w", [], initializer=tf.compat.v1.constant_initializer(DENSE)
            )
    return var, out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def write_builder(case, path):
    _, keys, opts = parse(case)
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(DTYPES[keys], [None], name="ids")
        var, out = _graph_model(keys, opts, ids)
        stored = KEYS[keys]
        upsert = var.upsert(tf.constant(stored, DTYPES[keys]), rows_of(stored))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(upsert)
            served = sess.run(out, {ids: _feed(keys, probe(keys))})
            builder = tf.compat.v1.saved_model.Builder(path)
            signature = tf.compat.v1.saved_model.predict_signature_def({"ids": ids}, {"e": out})
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map={"serving_default": signature}
            )
            builder.save()
    return served


def write_estimator(case, path):
    _, keys, opts = parse(case)
    stored = KEYS[keys]

    def model_fn(features, labels, mode):
        del labels
        var, out = _graph_model(keys, opts, features["ids"])
        step = tf.compat.v1.train.get_or_create_global_step()
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"e": out})
        upsert = var.upsert(tf.constant(stored, DTYPES[keys]), rows_of(stored))
        return tf.estimator.EstimatorSpec(
            mode, loss=tf.constant(0.0), train_op=tf.group(upsert, step.assign_add(1))
        )

    def input_fn():
        return {"ids": tf.constant(_feed(keys, stored), DTYPES[keys])}, tf.constant([0.0])

    def serving_input_fn():
        ids = tf.compat.v1.placeholder(DTYPES[keys], [None], name="ids")
        return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})

    estimator = tf.estimator.Estimator(model_fn, model_dir=path + ".train")
    estimator.train(input_fn, steps=1)
    exported = estimator.export_saved_model(path + ".export", serving_input_fn)
    os.rename(exported, path)
    served = estimator.predict(
        lambda: {"ids": tf.constant(_feed(keys, probe(keys)), DTYPES[keys])},
        yield_single_examples=False,
    )
    return next(served)["e"]


# --- TF2: tf.saved_model.save of a tf.Module, Keras model.save ----------------------------


class _Module(tf.Module):
    def __init__(self, keys, opts):
        super().__init__()
        self.keys = keys
        with tf.name_scope("outer") if opts["scoped"] else _nothing():
            self.var = de.Variable(name="emb", **_variable_args(keys, opts))
        self.w = tf.Variable(DENSE, name="w") if opts["dense"] else None

    @tf.function
    def serve(self, ids):
        out = de.embedding_lookup(self.var, ids, name="lookup")
        return {"e": out * self.w if self.w is not None else out}


def write_module(case, path):
    _, keys, opts = parse(case)
    module = _Module(keys, opts)
    stored = KEYS[keys]
    module.var.upsert(tf.constant(stored, DTYPES[keys]), rows_of(stored))
    served = module.serve(tf.constant(_feed(keys, probe(keys)), DTYPES[keys]))["e"]
    signature = module.serve.get_concrete_function(tf.TensorSpec([None], DTYPES[keys], "ids"))
    tf.saved_model.save(module, path, signatures={"serving_default": signature})
    return served.numpy()


def write_keras(case, path):
    _, keys, opts = parse(case)
    args = _variable_args(keys, opts)
    ids = tf.keras.Input((), dtype=DTYPES[keys], name="ids")
    layer = de.keras.layers.Embedding(
        DIM,
        key_dtype=args["key_dtype"],
        initializer=args["initializer"],
        devices=args["devices"],
        restrict_policy=args["restrict_policy"],
        name="outer_emb" if opts["scoped"] else "emb",
    )
    out = layer(ids)
    if opts["dense"]:
        out = tf.keras.layers.Dense(
            DIM, use_bias=False, name="w", kernel_initializer=tf.keras.initializers.Identity(DENSE)
        )(out)
    model = tf.keras.Model(ids, {"e": out})
    stored = KEYS[keys]
    layer.params.upsert(tf.constant(stored, DTYPES[keys]), rows_of(stored))
    served = model(tf.constant(_feed(keys, probe(keys)), DTYPES[keys]))["e"]
    model.save(path)
    return served.numpy()


# --- loading -------------------------------------------------------------------------------


def load_v1(path, keys):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
        signature = meta.signature_def["serving_default"]
        (output,) = signature.outputs.values()  # "e" (Keras names it by its layer)
        return sess.run(output.name, {signature.inputs["ids"].name: _feed(keys, probe(keys))})


def load_v2(path, keys):
    served = tf.saved_model.load(path).signatures["serving_default"]
    (output,) = served(ids=tf.constant(_feed(keys, probe(keys)), DTYPES[keys])).values()
    return output.numpy()


def main():
    verb, what, root = sys.argv[1:4]
    os.makedirs(root, exist_ok=True)
    if verb == "write":
        for case in cases(what):
            path = os.path.join(root, case)
            try:
                served = globals()["write_" + what](case, path)
                record = {"served": np.asarray(served, np.float32).tolist()}
            except Exception as error:  # pylint: disable=broad-except
                record = {
                    "error": "%s: %s" % (type(error).__name__, error),
                    "trace": traceback.format_exc()[-3000:],
                }
            with open(path + ".json", "w") as f:
                json.dump(record, f)
        return
    load = globals()["load_" + what]
    results = {}
    for case in sorted(n[:-5] for n in os.listdir(root) if n.endswith(".json")):
        try:
            results[case] = np.asarray(
                load(os.path.join(root, case), parse(case)[1]), np.float32
            ).tolist()
        except Exception as error:  # pylint: disable=broad-except
            results[case] = "error: %s: %s" % (type(error).__name__, str(error)[:800])
    print("CASES " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
