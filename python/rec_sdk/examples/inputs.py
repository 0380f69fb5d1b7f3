"""Streaming tf.data input pipelines for the examples: Criteo-format TSV, Avazu-format CSV,
the synthetic generator's TFRecords, and in-memory arrays. Files are read line by line (or
record by record) and parsed in batches by TensorFlow ops, so data sets larger than memory
train at full speed.

Every pipeline yields batch dicts with the same layout:
  label        float32 [batch]
  dense        float32 [batch, n_dense] (log1p of the integer fields; absent for Avazu)
  categorical  int64 [batch, n_fields]: field f's value with (f + 1) << FIELD_SHIFT added,
               so fields never share keys; an empty field gets its field's own key.
Criteo's categorical values are hex hashes: a value h becomes int(h, 16) + 1 (as in
rec_sdk.examples.data.read_criteo_tsv). Avazu's are strings, hashed to 40 bits.
"""

import tensorflow as tf

FIELD_SHIFT = 40
CRITEO_DENSE, CRITEO_CATEGORICAL = 13, 26
# Avazu CTR data: id, click, hour, then 21 categorical columns.
AVAZU_COLUMNS = (
    "id",
    "click",
    "hour",
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    "C14",
    "C15",
    "C16",
    "C17",
    "C18",
    "C19",
    "C20",
    "C21",
)
AVAZU_CATEGORICAL = AVAZU_COLUMNS[2:]  # the hour too (as a category)


def _field_offsets(n):
    return tf.constant([(f + 1) << FIELD_SHIFT for f in range(n)], tf.int64)


def _hex_values(tokens):
    """int(h, 16) + 1 for 1-8 hex digit strings, 0 for empty ones; any shape."""
    flat = tf.reshape(tokens, [-1])
    codes = tf.strings.unicode_decode(flat, "UTF-8")  # ragged [n, len]
    digits = tf.where(codes >= 97, codes - 87, tf.where(codes >= 65, codes - 55, codes - 48))
    bad = tf.reduce_any((digits < 0) | (digits > 15)) | tf.reduce_any(codes.row_lengths() > 8)
    check = tf.debugging.Assert(
        tf.logical_not(bad), ["a categorical field is not 1-8 hex digits"], name="check_hex"
    )
    lengths = codes.row_lengths()
    positions = tf.ragged.range(lengths)
    powers = tf.cast(lengths, tf.int64)[:, None] - 1 - tf.cast(positions, tf.int64)
    value = tf.reduce_sum(
        tf.cast(digits, tf.int64) * tf.bitwise.left_shift(tf.constant(1, tf.int64), 4 * powers),
        axis=1,
    )
    with tf.control_dependencies([check]):
        value = tf.where(lengths > 0, value + 1, tf.zeros_like(value))
    return tf.reshape(value, tf.shape(tokens, out_type=tf.int64))


def _files(paths):
    if isinstance(paths, str):
        paths = [paths]
    return tf.data.Dataset.from_tensor_slices(list(paths))


def criteo_tsv_dataset(paths, batch_size, shuffle_buffer=0, seed=0, repeat=False):
    """Batches of Criteo-format TSV lines (label, I1..I13, C1..C26), parsed by TF ops."""
    dataset = _files(paths).flat_map(tf.data.TextLineDataset)
    if repeat:
        dataset = dataset.repeat()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    defaults = [[0.0]] + [[0]] * CRITEO_DENSE + [[""]] * CRITEO_CATEGORICAL
    offsets = _field_offsets(CRITEO_CATEGORICAL)

    def parse(lines):
        cols = tf.io.decode_csv(lines, defaults, field_delim="\t", na_value="")
        dense = tf.stack([tf.cast(c, tf.float32) for c in cols[1 : 1 + CRITEO_DENSE]], axis=1)
        categorical = _hex_values(tf.stack(cols[1 + CRITEO_DENSE :], axis=1))
        return {
            "label": cols[0],
            "dense": tf.math.log1p(tf.maximum(dense, 0.0)),
            "categorical": categorical + offsets,
        }

    return dataset.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def avazu_csv_dataset(paths, batch_size, shuffle_buffer=0, seed=0, repeat=False, header=True):
    """Batches of Avazu-format CSV lines (id, click, hour, 21 categorical columns); every
    column but id and click is a categorical field (hashed to 40 bits)."""
    dataset = _files(paths).flat_map(lambda p: tf.data.TextLineDataset(p).skip(1 if header else 0))
    if repeat:
        dataset = dataset.repeat()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    defaults = [[""], [0.0]] + [[""]] * len(AVAZU_CATEGORICAL)
    offsets = _field_offsets(len(AVAZU_CATEGORICAL))

    def parse(lines):
        cols = tf.io.decode_csv(lines, defaults, field_delim=",")
        values = tf.strings.to_hash_bucket_fast(tf.stack(cols[2:], axis=1), 1 << FIELD_SHIFT)
        return {"label": cols[1], "categorical": values + offsets}

    return dataset.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def tfrecord_dataset(paths, batch_size, shuffle_buffer=0, seed=0, repeat=False):
    """Batches of the synthetic generator's tf.train.Examples
    (rec_sdk.examples.synthetic.write_tfrecord)."""
    dataset = _files(paths).flat_map(tf.data.TFRecordDataset)
    if repeat:
        dataset = dataset.repeat()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed)
    spec = {
        "label": tf.io.FixedLenFeature([], tf.float32),
        "dense": tf.io.FixedLenFeature([CRITEO_DENSE], tf.int64),
        "categorical": tf.io.FixedLenFeature([CRITEO_CATEGORICAL], tf.int64),
    }
    offsets = _field_offsets(CRITEO_CATEGORICAL)

    def parse(records):
        parsed = tf.io.parse_example(records, spec)
        return {
            "label": parsed["label"],
            "dense": tf.math.log1p(tf.cast(parsed["dense"], tf.float32)),
            "categorical": parsed["categorical"] + offsets,
        }

    return dataset.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def array_dataset(arrays, batch_size, shuffle=False, seed=0, repeat=False):
    """Batches of in-memory arrays (a dict of NumPy arrays with a common first dimension)."""
    dataset = tf.data.Dataset.from_tensor_slices(arrays)
    if shuffle:
        dataset = dataset.shuffle(
            len(next(iter(arrays.values()))), seed=seed, reshuffle_each_iteration=True
        )
    if repeat:
        dataset = dataset.repeat()
    return dataset.batch(batch_size)
