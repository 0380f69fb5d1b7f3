"""The embedding backends of rec_sdk.examples.train (one interface, `Embeddings`): the SDK's
tables (`RecSdkEmbeddings`: create_table and sparse_lookup, optionally by FeatureSpec) and
TFRA's API (`DynamicEmbeddings`: de.Variables, on ps tasks when given devices);
`make_embeddings` picks one from the command line's arguments."""

import collections

import tensorflow as tf  # noqa: E402

from rec_sdk import dynamic_embedding as rec_sdk_de  # noqa: E402
from rec_sdk.core.embedding import create_table, sparse_lookup  # noqa: E402
from rec_sdk.optimizers import lazy_adam  # noqa: E402
from rec_sdk.util.variable import get_dense_and_sparse_variable  # noqa: E402

# A sparse field: ids = batch[key] (or its column `column`); multi: [batch, k] ids padded
# with -1, mean-pooled.
Field = collections.namedtuple("Field", ["name", "table", "key", "column", "multi"])
WIDE_SHIFT = 56  # wide-table keys: the field number above the keys' own field bits


class Embeddings:
    """Per-field embeddings of a batch. Subclasses (an embedding library each) implement
    lookup(field, ids, is_train, name) -> ids.shape + [dim], and for Wide&Deep
    lookup_wide(keys, is_train, name) -> keys.shape + [1]; embed() does the rest (field
    columns, pooling of multi-valued fields, wide keys) the same way for every library."""

    source = None
    has_wide = False

    def embed(self, batch, is_train):
        """(per-field embeddings [batch, dim], per-field wide weights [batch] or None)."""
        suffix = "train" if is_train else "eval"
        embeddings, wide = [], []
        for index, field in enumerate(self.source.fields):
            ids = batch[field.key] if field.column is None else batch[field.key][:, field.column]
            emb = self.lookup(field, ids, is_train, "%s_%s" % (field.name, suffix))
            mask = None
            if field.multi:
                mask = tf.cast(ids >= 0, tf.float32)[..., tf.newaxis]
                emb = tf.reduce_sum(emb * mask, axis=1) / tf.maximum(
                    tf.reduce_sum(mask, axis=1), 1.0
                )
            embeddings.append(emb)
            if self.has_wide:
                keys = ids + tf.constant((index + 1) << WIDE_SHIFT, tf.int64)
                w = self.lookup_wide(keys, is_train, "wide_%s_%s" % (field.name, suffix))
                w = w * mask if mask is not None else w
                wide.append(tf.reshape(tf.reduce_sum(w, axis=list(range(1, w.shape.rank))), [-1]))
        return embeddings, (wide if self.has_wide else None)

    def lookup(self, field, ids, is_train, name):
        raise NotImplementedError

    def lookup_wide(self, keys, is_train, name):
        raise NotImplementedError

    def gradient_targets(self):
        """What the loss is differentiated against for the embeddings' update."""
        raise NotImplementedError

    def apply_gradients(self, grads, targets):
        """The embeddings' own update from the gradients of gradient_targets()."""
        raise NotImplementedError

    def train_op(self, loss, dense_variables, dense_optimizer, global_step=None, reduce_dense=None):
        """One backward pass for the dense layers and the embeddings: the dense layers
        are updated by dense_optimizer (on their gradients as the list reduce_dense makes of
        them, when given), the embeddings by their own update. (Two minimize() calls would build,
        and run, the model's backward pass twice.)"""
        dense_variables = list(dense_variables)
        targets = self.gradient_targets()
        grads = tf.gradients(loss, dense_variables + targets)
        n = len(dense_variables)
        dense_grads = grads[:n] if reduce_dense is None else reduce_dense(grads[:n])
        return tf.group(
            dense_optimizer.apply_gradients(
                zip(dense_grads, dense_variables), global_step=global_step
            ),
            self.apply_gradients(grads[n:], targets),
        )


class RecSdkEmbeddings(Embeddings):
    """The model's embeddings from rec_sdk tables: one table per table name of the source
    (dim `dim`), plus a dim-1 "wide" table for Wide&Deep; trained by LazyAdam. emb_dtype,
    slot_dtype: the tables' row and slot dtypes (create_table's)."""

    def __init__(
        self,
        source,
        dim,
        learning_rate,
        wide,
        access_threshold=None,
        seed=0,
        emb_dtype="float32",
        slot_dtype="float32",
    ):
        initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=seed + 1)
        self.source = source
        self.has_wide = wide
        self.learning_rate = learning_rate
        self.config = (
            {"access_threshold": access_threshold} if access_threshold is not None else None
        )
        # Over several ranks each key's gradient is averaged over them, as the dense ones are.
        mean = {"all2all_gradients_op": "sum_gradients_and_div_by_ranksize"}
        self.tables = {
            name: create_table(
                tf.int64,
                dim,
                name,
                initializer,
                device_vocabulary_size=_capacity(source, name),
                emb_dtype=emb_dtype,
                slot_dtype=slot_dtype,
                **mean,
            )
            for name in source.tables
        }
        if wide:
            rows = sum(_capacity(source, name) for name in source.tables)
            self.tables["wide"] = create_table(
                tf.int64,
                1,
                "wide",
                tf.compat.v1.zeros_initializer(),
                device_vocabulary_size=rows,
                emb_dtype=emb_dtype,
                slot_dtype=slot_dtype,
                **mean,
            )

    def lookup(self, field, ids, is_train, name):
        return sparse_lookup(
            self.tables[field.table],
            ids,
            is_train=is_train,
            name=name,
            access_and_evict_config=self.config,
        )

    def lookup_wide(self, keys, is_train, name):
        return sparse_lookup(self.tables["wide"], keys, is_train=is_train, name=name)

    def gradient_targets(self):
        return list(get_dense_and_sparse_variable()[1])

    def apply_gradients(self, grads, targets):
        return lazy_adam.create_hash_optimizer(learning_rate=self.learning_rate).apply_gradients(
            zip(grads, targets)
        )


class DynamicEmbeddings(Embeddings):
    """The model's embeddings from dynamic_embedding variables (rec_sdk.dynamic_embedding, or
    TFRA's module with the same API, for comparisons): one variable per table name of the
    source (plus a dim-1 "wide" one for Wide&Deep), trained by
    DynamicEmbeddingOptimizer(AdamOptimizer)."""

    def __init__(
        self,
        source,
        dim,
        learning_rate,
        wide,
        de=None,
        seed=0,
        devices=None,
        emb_dtype="float32",
        slot_dtype="float32",
    ):
        de = rec_sdk_de if de is None else de
        # Half-precision rows and slots of float32 variables: rec_sdk creator options (TFRA
        # has none).
        creator = (
            None
            if (emb_dtype, slot_dtype) == ("float32", "float32")
            else de.CuckooHashTableCreator(emb_dtype=emb_dtype, slot_dtype=slot_dtype)
        )
        self.de = de
        self.source = source
        self.has_wide = wide
        self.learning_rate = learning_rate
        initializer = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=seed + 1)
        names = list(source.tables) + (["wide"] if wide else [])
        self.variables = {
            name: de.get_variable(
                "de_" + name,
                key_dtype=tf.int64,
                value_dtype=tf.float32,
                dim=1 if name == "wide" else dim,
                devices=devices,
                initializer=0.0 if name == "wide" else initializer,
                kv_creator=creator,
            )
            for name in names
        }
        self.trainables = []

    @property
    def tables(self):
        """{name: rec_sdk table} of every shard (rec_sdk's module only)."""
        return {
            "%s_%d" % (name, i): t
            for name, v in self.variables.items()
            for i, t in enumerate(getattr(v, "tables", []))
        }

    def _lookup(self, var, ids, is_train, name):
        emb, trainable = self.de.embedding_lookup(var, ids, name=name, return_trainable=True)
        if is_train and trainable is not None:
            self.trainables.append(trainable)
        return emb

    def lookup(self, field, ids, is_train, name):
        return self._lookup(self.variables[field.table], ids, is_train, name)

    def lookup_wide(self, keys, is_train, name):
        return self._lookup(self.variables["wide"], keys, is_train, name)

    def gradient_targets(self):
        return list(self.trainables)

    def apply_gradients(self, grads, targets):
        opt = self.de.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.AdamOptimizer(self.learning_rate)
        )
        return opt.apply_gradients(zip(grads, targets))

    def keys(self, sess):
        return int(sum(sess.run([v.size() for v in self.variables.values()])))


def make_embeddings(args, source, devices=None):
    """The embeddings the command line asks for (--api); devices: the shards' (a cluster's
    ps tasks)."""
    if args.api == "dynamic_embedding":
        return DynamicEmbeddings(
            source,
            args.dim,
            args.learning_rate,
            args.model == "wide_deep",
            seed=args.seed,
            devices=devices,
            emb_dtype=args.emb_dtype,
            slot_dtype=args.slot_dtype,
        )
    return RecSdkEmbeddings(
        source,
        args.dim,
        args.learning_rate,
        args.model == "wide_deep",
        args.access_threshold,
        args.seed,
        args.emb_dtype,
        args.slot_dtype,
    )


def _capacity(source, table):
    """Rows for a table: its keys (all fields that use it) with room to spare."""
    fields = [f for f in source.fields if f.table == table]
    return int(min(10**9, max(1024, source.vocabulary.get(table, 1 << 20) * 1.25 + len(fields))))
