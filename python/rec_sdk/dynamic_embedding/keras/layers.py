"""de.keras.layers: Keras embedding layers whose weights are a de.Variable (TFRA's names and
arguments).

Each layer creates its de.Variable (`params`, named "<layer name>-parameter") and the
ShadowVariable of its lookups (`shadow`) in __init__, so Keras tracks the shadow as the layer's
trainable weight and `model.fit` with a DynamicEmbeddingOptimizer trains the table's rows.
A call looks up each distinct id once; with training=False (evaluate, predict) or in
de.enable_inference_mode() it only reads.
"""

import contextlib

import tensorflow as tf

from rec_sdk.base.tf_compat import keras
from rec_sdk.dynamic_embedding import mode
from rec_sdk.dynamic_embedding.shadow_ops import ShadowVariable, unique_lookup
from rec_sdk.dynamic_embedding.variable import Variable, default_partition_fn

_SERVING = {}  # id(layer) -> ids -> embeddings of that layer (see serving_lookups)


@contextlib.contextmanager
def serving_lookups(lookups):
    """Within: each layer of `lookups` ({layer: function of ids -> their embeddings}) looks
    ids up through its function instead of its de.Variable (rec_sdk.serving traces a Keras
    model this way into a SavedModel of stock ops)."""
    _SERVING.update({id(layer): fn for layer, fn in lookups.items()})
    try:
        yield
    finally:
        for layer in lookups:
            _SERVING.pop(id(layer), None)


_REDUCERS = {
    "sum": tf.math.reduce_sum,
    "mean": tf.math.reduce_mean,
    "min": tf.math.reduce_min,
    "max": tf.math.reduce_max,
    "prod": tf.math.reduce_prod,
    "std": tf.math.reduce_std,
}


def _reducer(combiner):
    if callable(combiner):
        return combiner
    if combiner not in _REDUCERS:
        raise ValueError(
            "combiner must be one of %s or a function, got %r"
            % (", ".join(sorted(_REDUCERS)), combiner)
        )
    return _REDUCERS[combiner]


class Embedding(keras.layers.Layer):
    """tf.keras.layers.Embedding without a vocabulary size: ids of any shape ->
    ids.shape + [embedding_size].

    Arguments as TFRA's: embedding_size, key_dtype, value_dtype, combiner (unused here; see
    SquashedEmbedding), initializer (default RandomNormal), devices, name, with_unique
    (rec_sdk always looks up each distinct id once), and in kwargs trainable, bp_v2,
    restrict_policy, init_capacity, partitioner, kv_creator, max_norm,
    distribute_strategy, keep_distribution; beyond TFRA, servable (the de.Variable's
    servable: its changes can be pushed to a served model, rec_sdk.serving).
    """

    def __init__(
        self,
        embedding_size,
        key_dtype=tf.int64,
        value_dtype=tf.float32,
        combiner=None,
        initializer=None,
        devices=None,
        name="DynamicEmbeddingLayer",
        with_unique=True,
        **kwargs,
    ):
        del with_unique
        trainable = kwargs.pop("trainable", True)
        bp_v2 = kwargs.pop("bp_v2", False)
        restrict_policy = kwargs.pop("restrict_policy", None)
        init_capacity = kwargs.pop("init_capacity", 0)
        partitioner = kwargs.pop("partitioner", default_partition_fn)
        kv_creator = kwargs.pop("kv_creator", None)
        max_norm = kwargs.pop("max_norm", None)
        distribute_strategy = kwargs.pop("distribute_strategy", None)
        kwargs.pop("keep_distribution", None)
        servable = kwargs.pop("servable", False)
        self.combiner = combiner
        super().__init__(name=name, trainable=trainable, **kwargs)
        self.embedding_size = int(embedding_size)
        self.key_dtype = tf.as_dtype(key_dtype)
        self.value_dtype = tf.as_dtype(value_dtype)
        self.max_norm = max_norm
        self.params = Variable(
            key_dtype=self.key_dtype,
            value_dtype=self.value_dtype,
            dim=self.embedding_size,
            devices=devices,
            partitioner=partitioner,
            name=name + "-parameter",
            initializer=initializer
            if initializer is not None
            else keras.initializers.RandomNormal(),
            trainable=trainable,
            init_size=init_capacity,
            kv_creator=kv_creator,
            restrict_policy=restrict_policy,
            bp_v2=bp_v2,
            servable=servable,
        )
        self.shadow = ShadowVariable(
            self.params,
            name=name + "-shadow",
            max_norm=max_norm,
            trainable=trainable,
            distribute_strategy=distribute_strategy,
        )

    def _embeddings(self, ids, training):
        ids = tf.convert_to_tensor(ids)
        if ids.dtype != self.key_dtype:
            if not (ids.dtype.is_integer and self.key_dtype.is_integer):
                raise TypeError(
                    "ids of layer %r must be %s, got %s"
                    % (self.name, self.key_dtype.name, ids.dtype.name)
                )
            ids = tf.cast(ids, self.key_dtype)
        serving = _SERVING.get(id(self))
        if serving is not None:
            emb = serving(ids)
            return emb if self.max_norm is None else tf.clip_by_norm(emb, self.max_norm, axes=[-1])
        writes = training is not False and mode.training() and self.trainable
        return unique_lookup(
            self.params,
            self.params.table_keys(ids, record=writes),
            self.shadow if writes else None,
            self.max_norm,
        )

    def call(self, ids, training=None):  # pylint: disable=arguments-differ
        return self._embeddings(ids, training)

    def get_config(self):
        config = super().get_config()
        config.update(
            embedding_size=self.embedding_size,
            key_dtype=self.key_dtype.name,
            value_dtype=self.value_dtype.name,
            combiner=self.combiner if not callable(self.combiner) else None,
        )
        return config


BasicEmbedding = Embedding


class SquashedEmbedding(Embedding):
    """Embeddings of ids [batch, ...] combined over all but the first axis (a rank-1 ids:
    over all ids) -> [batch, embedding_size] ([embedding_size])."""

    def __init__(
        self,
        embedding_size,
        key_dtype=tf.int64,
        value_dtype=tf.float32,
        combiner="sum",
        initializer=None,
        devices=None,
        name="SquashedEmbedding",
        **kwargs,
    ):
        _reducer(combiner)
        super().__init__(
            embedding_size, key_dtype, value_dtype, combiner, initializer, devices, name, **kwargs
        )

    def call(self, ids, training=None):  # pylint: disable=arguments-differ
        emb = self._embeddings(ids, training)
        reduce = _reducer(self.combiner)
        if emb.shape.rank == 2:
            return reduce(emb, axis=0)
        emb = tf.reshape(emb, tf.stack([tf.shape(emb)[0], -1, self.embedding_size]))
        return reduce(emb, axis=1)


class FieldWiseEmbedding(Embedding):
    """Embeddings of ids [batch, n] combined per field: slot_map_fn(ids) gives each id's field
    in [0, nslots) -> [batch, nslots, embedding_size] (fields without ids: zeros)."""

    def __init__(
        self,
        embedding_size,
        nslots,
        slot_map_fn=None,
        combiner="sum",
        key_dtype=tf.int64,
        value_dtype=tf.float32,
        initializer=None,
        devices=None,
        name="FieldWiseEmbedding",
        **kwargs,
    ):
        if combiner not in ("sum", "mean"):
            raise ValueError(
                "combiner of FieldWiseEmbedding must be 'sum' or 'mean', got %r" % (combiner,)
            )
        if int(nslots) < 1:
            raise ValueError("nslots must be >= 1, got %r" % (nslots,))
        super().__init__(
            embedding_size, key_dtype, value_dtype, combiner, initializer, devices, name, **kwargs
        )
        self.nslots = int(nslots)
        self.slot_map_fn = (
            slot_map_fn if slot_map_fn is not None else (lambda x: tf.math.floormod(x, self.nslots))
        )

    def call(self, ids, training=None):  # pylint: disable=arguments-differ
        ids = tf.convert_to_tensor(ids)
        emb = self._embeddings(ids, training)  # [batch, n, dim]
        fields = tf.cast(self.slot_map_fn(ids), tf.int32)
        onehot = tf.one_hot(
            tf.reshape(fields, tf.shape(ids)[:2]), self.nslots, dtype=emb.dtype
        )  # [batch, n, nslots]
        out = tf.einsum("bnd,bns->bsd", emb, onehot)
        if self.combiner == "mean":
            out = tf.math.divide_no_nan(out, tf.reduce_sum(onehot, axis=1)[:, :, None])
        return out

    def get_config(self):
        config = super().get_config()
        config.update(nslots=self.nslots)
        return config
