"""The chief of a TF2 ParameterServerStrategy cluster (TF_CONFIG: chief, 2 workers, ps
tasks), as TFRA's movielens-1m-keras-ps demo trains: a Keras model whose
de.keras.layers.SquashedEmbedding keeps its tables on the ps tasks, model.fit through the
ClusterCoordinator. Writes JSON results to argv[1]: the epochs' losses, the keys the tables
hold and the keys the data has."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from rec_sdk.base.tf_compat import keras

OUT = sys.argv[1]
NESTED = sys.argv[2:] == ["nested"]  # the model's call is itself a tf.function (as TFRA's demo)
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
)
strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
ps = ["/job:ps/replica:0/task:%d/CPU:0" % i for i in range(len(cluster["ps"]))]

rng = np.random.RandomState(0)
users = rng.randint(0, 40, 2048).astype(np.int64)
items = rng.randint(1000, 1030, 2048).astype(np.int64)
labels = ((users % 2) == 0).astype(np.float32)  # learnable only from the user ids


def dataset_fn(context):
    del context
    features = {"user": users, "item": items}
    return (
        tf.data.Dataset.from_tensor_slices((features, labels))
        .shuffle(2048, seed=1)
        .repeat()
        .batch(64)
    )


with strategy.scope():

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = de.keras.layers.SquashedEmbedding(
                8, initializer=keras.initializers.RandomNormal(0.0, 0.1), devices=ps, name="emb"
            )
            self.dense = keras.layers.Dense(1, activation="sigmoid")

        def call(self, features):
            ids = tf.stack([features["user"], features["item"]], axis=1)
            return tf.reshape(self.dense(self.emb(ids)), [-1])

        if NESTED:
            call = tf.function(call)

    model = Model()
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05))
    model.compile(optimizer=optimizer, loss="binary_crossentropy")

history = model.fit(
    keras.utils.experimental.DatasetCreator(dataset_fn), epochs=4, steps_per_epoch=16, verbose=0
)
stored = int(model.emb.params.size())
with open(OUT, "w") as f:
    json.dump(
        {
            "losses": [float(v) for v in history.history["loss"]],
            "stored": stored,
            "distinct": len(set(users.tolist()) | set(items.tolist())),
            "table_devices": sorted({t.handle.device for t in model.emb.params.tables}),
        },
        f,
    )
