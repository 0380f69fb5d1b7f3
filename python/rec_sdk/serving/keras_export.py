"""export_keras_serving_model: a TF2 Keras model served with stock ops and updated in place.

The TF2 counterpart of export_serving_model (export.py): each de.keras embedding layer's
de.Variable (created with servable=True) is served from a ServedTable (mutable.py) whose
hash tables fill themselves at load from the SavedModel's assets; the model's other
variables stay variables. Signatures: "serving_default" (the model, training=False),
"apply_update" (update_dir -> version) and "version" (request -> version, chain). A request
runs the whole model as apply.ModelLock.read does (Keras layers read their variables as they
compute, so unlike the graph-mode export the model's arithmetic is inside it: a request that
overlapped an update's writes runs the model again holding the lock). The export starts the
update chain in push_dir that a Pusher(push_dir, model=model) or a PushCallback continues.
"""

import shutil
import tempfile
import uuid

import numpy as np
import tensorflow as tf

from rec_sdk.dynamic_embedding.keras import layers as de_layers
from rec_sdk.ops.serving_ops import Changes
from rec_sdk.serving import update_files
from rec_sdk.serving.apply import ModelLock, apply_update_op
from rec_sdk.serving.export import (
    APPLY_SIGNATURE,
    VERSION_INPUT,
    VERSION_SIGNATURE,
    check_new_chain_dir,
)
from rec_sdk.serving.indexed import served_table
from rec_sdk.serving.push import merge_shards
from rec_sdk.serving.static import (
    default_row,
    dense_variables,
    keras_input_signature,
    serving_layers,
)


def _check_servable(params):
    if not params.servable:
        raise ValueError(
            "de.Variable %r is not servable: create it (or its de.keras layer) "
            "with servable=True so that its changes can be pushed" % params.name
        )
    if params.value_dtype != tf.float32 or params.key_dtype not in (tf.int32, tf.int64):
        raise ValueError(
            "de.Variable %r has %s keys and %s values: served tables take int32 "
            "or int64 keys and float32 values"
            % (params.name, params.key_dtype.name, params.value_dtype.name)
        )


def export_keras_serving_model(model, export_dir, push_dir, input_signature=None):
    """Writes a SavedModel (stock ops only) of a TF2 Keras model with de.keras embeddings
    that serves it and applies the updates of push_dir's chain (which this starts).

    input_signature: the model's inputs as tf.TensorSpecs (default: model.inputs).
    Returns {"rows": rows exported, "chain": the chain id}.
    """
    input_signature = keras_input_signature(
        model, input_signature, "export_keras_serving_model", "export_serving_model"
    )
    check_new_chain_dir(push_dir)
    layers = serving_layers(model)
    for layer in layers:
        _check_servable(layer.params)
    chain = uuid.uuid4().hex
    staged = tempfile.mkdtemp(prefix="rec_sdk_export_")
    try:
        module = tf.Module()
        served, push_ids, table_rows, lookups, rows = [], [], [], {}, 0
        for i, layer in enumerate(layers):
            params = layer.params
            whole = merge_shards(
                params.name,
                [
                    Changes(*[np.asarray(x) for x in t.take_changes(full=True)])
                    for t in params.shards
                ],
            )
            keys, values, ids = whole.keys, whole.values, whole.push_ids
            table = served_table(
                params.name, params.dim, keys, values, staged, i, default_row(params)
            )
            served.append(table)
            push_ids.append(ids)
            table_rows.append(len(keys))
            rows += len(keys)
            lookups[layer] = lambda ids, table=table: table.lookup(tf.cast(ids, tf.int64))
        module.tables = [t for table in served for t in table.tables]
        module.served_variables = [v for table in served for v in table.variables]
        module.lock = ModelLock("rec_sdk_serving_" + chain)
        module.updates_lock = ModelLock("rec_sdk_serving_updates_" + chain, sequence=False)
        module.dense = dense_variables(model, layers)
        module.version = tf.Variable(np.int64(0), trainable=False, name="rec_sdk_serving_version")
        dense = [(v.name, v) for v in module.dense]

        @tf.function(input_signature=input_signature)
        def serve(*inputs):
            return module.lock.read(
                lambda: model(list(inputs) if len(inputs) > 1 else inputs[0], training=False)
            )

        @tf.function(input_signature=[tf.TensorSpec([], tf.string, name="update_dir")])
        def apply_update(update_dir):
            return {
                "version": apply_update_op(
                    update_dir,
                    served,
                    dense,
                    module.version,
                    tf.constant(chain),
                    module.lock,
                    module.updates_lock,
                )
            }

        @tf.function(input_signature=[tf.TensorSpec([], tf.int64, name=VERSION_INPUT)])
        def version(request):
            del request  # TensorFlow Serving's Predict needs an input
            return {"version": module.version.read_value(), "chain": tf.constant(chain)}

        with de_layers.serving_lookups(lookups):
            concrete = serve.get_concrete_function()
        signatures = {
            "serving_default": concrete,
            APPLY_SIGNATURE: apply_update.get_concrete_function(),
            VERSION_SIGNATURE: version.get_concrete_function(),
        }
        # An empty namespace whitelist: saving fails if any rec_sdk op were left in the graph.
        tf.saved_model.save(
            module,
            export_dir,
            signatures=signatures,
            options=tf.saved_model.SaveOptions(namespace_whitelist=[]),
        )
        update_files.write_base(
            push_dir,
            chain,
            [ln.params.name for ln in layers],
            push_ids,
            [name for name, _ in dense],
            table_rows,
        )
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return {"rows": rows, "chain": chain}
