"""CTR models of the examples and benchmarks: Wide&Deep, DLRM and DCN-v2.

A model sees per-field embeddings (a list of [batch, dim] tensors, one per sparse field),
optional dense features [batch, n] and, for Wide&Deep, per-field wide weights ([batch] each),
and returns logits [batch]. Where the embeddings come from (rec_sdk tables, dense
tf.Variables, TFRA) is the caller's business, so the same model code is measured against every
embedding library. Dense layers are created with tf.compat.v1.AUTO_REUSE under the model's
scope, so a training and an evaluation graph built in one tf.Graph share them.
"""

import tensorflow as tf

MODELS = ("wide_deep", "dlrm", "dcn_v2")


def dense_layer(x, units, name, activation=None):
    """A fully connected layer whose variables are shared by every call with the same name."""
    with tf.compat.v1.variable_scope(name, reuse=tf.compat.v1.AUTO_REUSE):
        w = tf.compat.v1.get_variable(
            "kernel",
            [x.shape[-1], units],
            initializer=tf.compat.v1.glorot_uniform_initializer(seed=7),
        )
        b = tf.compat.v1.get_variable("bias", [units], initializer=tf.zeros_initializer())
    y = tf.matmul(x, w) + b
    return activation(y) if activation else y


def mlp(x, units, name, last_activation=tf.nn.relu):
    for i, n in enumerate(units):
        last = i == len(units) - 1
        x = dense_layer(x, n, "%s_%d" % (name, i), last_activation if last else tf.nn.relu)
    return x


def _logit(x, name):
    return tf.reshape(dense_layer(x, 1, name), [-1])


def wide_deep(embeddings, dense, wide):
    """Wide&Deep: an MLP over the concatenated embeddings (and dense features) plus a linear
    model (a learned weight per key, `wide`, and a linear term of the dense features)."""
    with tf.compat.v1.variable_scope("wide_deep", reuse=tf.compat.v1.AUTO_REUSE):
        deep_in = list(embeddings) + ([dense] if dense is not None else [])
        deep = _logit(mlp(tf.concat(deep_in, axis=1), [256, 128], "deep"), "deep_out")
        linear = tf.add_n(list(wide))
        if dense is not None:
            linear += _logit(dense, "wide_dense")
        return deep + linear


def dlrm(embeddings, dense, dim, top=(256, 128)):
    """DLRM: a bottom MLP maps the dense features to a dim-vector; the pairwise dot products
    of all vectors (embeddings and that one) and the bottom output go through a top MLP
    (hidden widths `top`, then the logit)."""
    with tf.compat.v1.variable_scope("dlrm", reuse=tf.compat.v1.AUTO_REUSE):
        vectors = list(embeddings)
        bottom = None
        if dense is not None:
            bottom = mlp(dense, [64, dim], "bottom")
            vectors = [bottom] + vectors
        stacked = tf.stack(vectors, axis=1)  # [batch, n, dim]
        dots = tf.matmul(stacked, stacked, transpose_b=True)  # [batch, n, n]
        n = len(vectors)
        rows, cols = zip(*[(i, j) for i in range(n) for j in range(i)])
        index = tf.constant([i * n + j for i, j in zip(rows, cols)], tf.int32)
        pairs = tf.gather(tf.reshape(dots, [-1, n * n]), index, axis=1)
        top_in = [pairs, bottom if bottom is not None else tf.concat(list(embeddings), axis=1)]
        return _logit(mlp(tf.concat(top_in, axis=1), list(top), "top"), "top_out")


def dcn_v2(embeddings, dense, cross_layers=2):
    """DCN-v2: full-rank cross layers x_{l+1} = x_0 * (W x_l + b) + x_l beside a deep MLP
    over x_0 = the concatenated embeddings and dense features."""
    with tf.compat.v1.variable_scope("dcn_v2", reuse=tf.compat.v1.AUTO_REUSE):
        x0 = tf.concat(list(embeddings) + ([dense] if dense is not None else []), axis=1)
        width = x0.shape[-1]
        x = x0
        for layer in range(cross_layers):
            x = x0 * dense_layer(x, width, "cross_%d" % layer) + x
        deep = mlp(x0, [256, 128], "deep")
        return _logit(tf.concat([x, deep], axis=1), "out")


def logits(model, embeddings, dense, wide=None, dim=None, dlrm_top=(256, 128)):
    """Logits [batch] of `model` (one of MODELS); dlrm_top: DLRM's top MLP widths."""
    if model == "wide_deep":
        if wide is None:
            raise ValueError("wide_deep needs the per-field wide weights")
        return wide_deep(embeddings, dense, wide)
    if model == "dlrm":
        return dlrm(embeddings, dense, dim or int(embeddings[0].shape[-1]), dlrm_top)
    if model == "dcn_v2":
        return dcn_v2(embeddings, dense)
    raise ValueError("model must be one of %s, got %r" % (", ".join(MODELS), model))
