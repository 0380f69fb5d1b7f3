"""Half-precision rows and slots (create_table(emb_dtype=..., slot_dtype=...), de value_dtype /
kv_creator emb_dtype and slot_dtype): every sparse optimizer against its NumPy reference
followed by stochastic rounding with the same random bits (recomputed here from their definition in
tf_ops/core/row_precision.h), checkpoints across dtypes (Saver and TF2), the SSD tier, and bad
dtypes refused by name."""

import os

import numpy as np
import pytest
import tensorflow as tf

import rec_sdk.dynamic_embedding as de
from helpers import new_session, sorted_export
from rec_sdk.core.embedding import create_table, sparse_lookup
from rec_sdk.saver import restore_tables, save_tables
from rec_sdk.util.initialize import init
from test_optimizers import DIM, OPTIMIZERS

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
HALF = {"bfloat16": tf.bfloat16, "float16": tf.float16}


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def rounding_bits(seed, key, step, n):
    """The 16 random bits of each of n elements of a row update (RoundingBits)."""
    state = _mix(_mix((seed ^ key) & MASK) ^ ((step * GOLDEN) & MASK))
    out = []
    for j in range(n):
        word = _mix((state + (j // 4 + 1) * GOLDEN) & MASK)
        out.append((word >> (16 * (j % 4))) & 0xFFFF)
    return out


def stochastic_round(values, dtype, bits):
    """float32 values rounded to `dtype`'s lower or upper neighbour (towards or away from
    zero): up when remainder + random >= one ulp, the remainder and the random number both
    counted in units of 2^-16 ulp (bfloat16) or 2^-13 ulp (float16: its 16 bits shifted)."""
    out = np.empty(len(values), np.float32)
    for j, x in enumerate(np.asarray(values, np.float32)):
        if dtype == "bfloat16":
            b = int(x.view(np.uint32))
            toward_zero = np.uint32(b & 0xFFFF0000).view(np.float32)
            remainder, random, scale = b & 0xFFFF, bits[j], 65536
        else:
            toward_zero = np.float16(x)
            if float(toward_zero) == float(x):  # representable (FTRL's zeros): kept
                out[j] = x
                continue
            if abs(float(toward_zero)) > abs(float(x)):
                toward_zero = np.nextafter(toward_zero, np.float16(0))
            ulp = abs(
                float(np.nextafter(toward_zero, np.float16(np.copysign(np.inf, x))))
                - float(toward_zero)
            )
            assert abs(float(toward_zero)) >= 2.0**-14, "the test keeps to float16 normals"
            remainder = (abs(float(x)) - abs(float(toward_zero))) / ulp * 8192
            assert remainder == int(remainder)
            random, scale = bits[j] >> 3, 8192
        away = remainder + random >= scale
        if away:
            if dtype == "bfloat16":
                b = int(x.view(np.uint32))
                toward_zero = np.uint32((b & 0xFFFF0000) + 0x10000).view(np.float32)
            else:
                toward_zero = np.nextafter(toward_zero, np.float16(np.copysign(np.inf, x)))
        out[j] = np.float32(toward_zero)
    return out


def _ulp(x, dtype):
    return np.abs(
        np.spacing(np.asarray(x, {"bfloat16": np.float32, "float16": np.float16}[dtype]))
    ).astype(np.float64) * (65536 if dtype == "bfloat16" else 1)


def nearest_bfloat16(values):
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    b = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


STEPS = [[1, 2, 3, 2], [2, 4, 5], [1, 5, 6, 6, 6], [3, 4]]
# (emb_dtype, slot_dtype) pairs: half rows with float32 slots, bfloat16 slots with either rows.
DTYPES = [
    ("bfloat16", "float32"),
    ("float16", "float32"),
    ("bfloat16", "bfloat16"),
    ("float32", "bfloat16"),
]


class _Rounding:
    """Compares a kernel's row or slot with the reference's float32 result rounded
    stochastically with the row update's bits from element `first` on (or, in float32,
    closely), counting the elements that landed on the other neighbour."""

    def __init__(self):
        self.mismatches = self.total = 0

    def check(self, got, wanted, dtype, bits, first, what):
        got = np.atleast_1d(got)
        if dtype == "float32":
            np.testing.assert_allclose(got, wanted, rtol=1e-5, atol=1e-6, err_msg=what)
            return
        rounded = stochastic_round(np.atleast_1d(wanted), dtype, bits[first : first + got.size])
        self.total += got.size
        self.mismatches += int((rounded != got).sum())
        # float32 arithmetic in the kernel may put a value one float32 ulp across a rounding
        # threshold: then it lands on the other neighbour, one ulp away.
        assert np.all(np.abs(rounded - got) <= _ulp(rounded, dtype) * 1.01), (what, rounded, got)


@pytest.mark.parametrize("dtype,slot_dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizers_match_reference_with_stochastic_rounding(name, dtype, slot_dtype):
    """Each step: the kernel's rows equal the reference update of the rows it started from,
    rounded with RoundingBits(seed, key, step) (elements 0 .. DIM-1); bfloat16 slots of DIM
    values likewise (slot s: elements (s + 1) * DIM on), one float per row stays float32."""
    init(use_dynamic_expansion=True)
    _, by_addr, make_ref = OPTIMIZERS[name]
    ref = make_ref()
    table = create_table(
        tf.int64,
        DIM,
        "half_" + name,
        tf.compat.v1.truncated_normal_initializer(stddev=0.5, seed=7),
        device_vocabulary_size=64,
        emb_dtype=dtype,
        slot_dtype=slot_dtype,
    )
    assert table.spec.slot_dtype == slot_dtype
    seed = table.spec.initializer["seed"]
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    weights = tf.compat.v1.placeholder(tf.float32, [None, DIM])
    emb = sparse_lookup(table, ids, name="lookup")
    assert emb.dtype == tf.float32
    loss = tf.reduce_sum(emb * weights)
    train = by_addr().minimize(loss)
    export = table.export()
    all_keys = sorted(set(sum(STEPS, [])))
    initial_values = table.lookup(tf.constant(all_keys, tf.int64), init_missing=True)
    half_slots = slot_dtype != "float32" and getattr(ref, "slot_width", DIM) == DIM
    # New rows' slots start from the initial values in the slots' dtype.
    initial_slots = [nearest_bfloat16(v) if half_slots else v for v in ref.initial_slots()]
    rng = np.random.default_rng(3)
    rounding = _Rounding()
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        initial = dict(zip(all_keys, sess.run(initial_values)[0]))
        before = {}
        for step, batch in enumerate(STEPS, start=1):
            w = rng.normal(0, 1, (len(batch), DIM)).astype(np.float32)
            sess.run(train, {ids: batch, weights: w})
            keys, values, slots = sorted_export(*sess.run(export))
            for i, key in enumerate(keys):
                key = int(key)
                if key not in batch:
                    np.testing.assert_array_equal(values[i], before[key][0])
                    continue
                grad = sum(w[p].astype(np.float64) for p, k in enumerate(batch) if k == key)
                # A new row starts from its initial values, rounded to the table's dtype.
                start, start_slots = before.get(key, (initial[key], initial_slots))
                wanted, wanted_slots = ref.update(start, start_slots, grad, step)
                bits = rounding_bits(seed, key, step, DIM * (1 + ref.num_slots))
                where = "key %d step %d" % (key, step)
                rounding.check(values[i], wanted, dtype, bits, 0, where)
                for s in range(ref.num_slots):
                    rounding.check(
                        slots[s][i],
                        wanted_slots[s],
                        slot_dtype if half_slots else "float32",
                        bits,
                        (s + 1) * DIM,
                        "slot %d of %s" % (s, where),
                    )
            before = {
                int(k): (values[i], [slots[s][i] for s in range(ref.num_slots)])
                for i, k in enumerate(keys)
            }
        if dtype != "float32" or (half_slots and ref.num_slots):
            assert rounding.total > 20
        assert rounding.mismatches <= max(1, rounding.total // 50), (
            rounding.mismatches,
            rounding.total,
        )


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_lookups_return_rounded_float32_and_values_convert_across_checkpoints(dtype, tmp_path):
    """A half-precision table stores upserted values rounded to nearest and returns float32;
    its checkpoint (values.bin in its dtype) restores into a float32 table exactly, and a
    float32 checkpoint restores into it rounded."""
    init(use_dynamic_expansion=True)
    keys = np.array([1, 7, 1 << 40], np.int64)
    values = np.array([[0.1, -0.2, 1 / 3], [3.14159, 1e-3, -7.5], [1e4, -0.3, 0.7]], np.float32)
    half = create_table(tf.int64, 3, "h", tf.compat.v1.zeros_initializer(), emb_dtype=HALF[dtype])
    wide = create_table(tf.int64, 3, "w", tf.compat.v1.zeros_initializer())
    rounded = values.astype(HALF[dtype].as_numpy_dtype).astype(np.float32)
    assert not np.array_equal(rounded, values)
    with new_session() as sess:
        sess.run([half.upsert(keys, values), wide.upsert(keys, values)])
        got = sess.run(half.lookup(keys))[0]
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, rounded)
        save_tables(sess, str(tmp_path / "ckpt"), tables=[half, wide])
    with open(tmp_path / "ckpt" / "h" / "meta.txt") as f:
        assert "emb_dtype %s\n" % dtype in f.read()
    assert os.path.getsize(tmp_path / "ckpt" / "h" / "values.bin") == keys.size * 3 * 2
    # Restored the other way round: each table reads the other's files.
    os.rename(tmp_path / "ckpt" / "h", tmp_path / "ckpt" / "tmp")
    os.rename(tmp_path / "ckpt" / "w", tmp_path / "ckpt" / "h")
    os.rename(tmp_path / "ckpt" / "tmp", tmp_path / "ckpt" / "w")
    with new_session() as sess:
        restore_tables(sess, str(tmp_path / "ckpt"), tables=[half, wide])
        np.testing.assert_array_equal(sess.run(wide.lookup(keys))[0], rounded)
        np.testing.assert_array_equal(sess.run(half.lookup(keys))[0], rounded)


def test_bad_emb_dtypes_are_refused_naming_the_parameter():
    init(use_dynamic_expansion=True)
    for bad in (tf.int8, "float64", "half-ish"):
        with pytest.raises(ValueError, match="emb_dtype must be one of float32, bfloat16, float16"):
            create_table(tf.int64, 4, "bad", tf.compat.v1.zeros_initializer(), emb_dtype=bad)
        with pytest.raises(ValueError, match="emb_dtype"):
            de.CuckooHashTableCreator(emb_dtype=bad)
    for bad in (tf.float16, "float64", tf.int32):
        with pytest.raises(
            ValueError,
            match="slot_dtype must be one of float32, bfloat16 .*"
            "float16 cannot hold squared gradients",
        ):
            create_table(tf.int64, 4, "bad", tf.compat.v1.zeros_initializer(), slot_dtype=bad)
        with pytest.raises(ValueError, match="slot_dtype"):
            de.CuckooHashTableCreator(slot_dtype=bad)
    with pytest.raises(ValueError, match="kv_creator's emb_dtype"):
        de.get_variable(
            "v",
            value_dtype=tf.float16,
            dim=2,
            kv_creator=de.CuckooHashTableCreator(emb_dtype=tf.bfloat16),
        )


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_de_half_value_dtype_trains_and_round_trips(dtype):
    """A de.Variable of a half value_dtype stores it natively: upserted values come back bit
    for bit, lookups return value_dtype, and it trains (float32 updates, rounded)."""
    value_dtype = HALF[dtype]
    v = de.get_variable(
        "v_" + dtype,
        value_dtype=value_dtype,
        dim=4,
        initializer=tf.keras.initializers.RandomNormal(0, 0.1, seed=1),
    )
    assert v.tables[0].spec.emb_dtype == dtype
    keys = tf.constant([5, 6], tf.int64)
    values = tf.constant(np.arange(8).reshape(2, 4) / 7, value_dtype)
    ids = tf.constant([1, 2, 3, 2], tf.int64)
    emb = de.embedding_lookup(v, ids)
    assert emb.dtype == value_dtype
    loss = tf.reduce_sum(tf.square(tf.cast(emb, tf.float32) - 1.0))
    train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(0.1)).minimize(loss)
    with new_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(v.upsert(keys, values))
        np.testing.assert_array_equal(sess.run(v.lookup(keys)), sess.run(values))
        first = sess.run(loss)
        for _ in range(20):
            sess.run(train)
        assert sess.run(loss) < first / 10
        assert sess.run(v.size()) == 5


def test_kv_creator_emb_dtype_keeps_a_float32_variable_in_bfloat16_rows(tmp_path):
    """A float32 variable with CuckooHashTableCreator(emb_dtype=tf.bfloat16): float32 API,
    bfloat16 rows (also through a TieredTableCreator's SSD tier, and with bfloat16 Adagrad
    accumulators: slot_dtype), trained like float32."""
    losses = {}
    for label, creator in (
        ("float32", None),
        ("bfloat16", de.CuckooHashTableCreator(emb_dtype=tf.bfloat16)),
        (
            "bfloat16 slots",
            de.CuckooHashTableCreator(emb_dtype=tf.bfloat16, slot_dtype=tf.bfloat16),
        ),
        ("tiered", de.TieredTableCreator(8, str(tmp_path), emb_dtype="bfloat16")),
    ):
        graph = tf.Graph()
        with graph.as_default():
            v = de.get_variable(
                "v",
                dim=8,
                kv_creator=creator,
                initializer=tf.keras.initializers.RandomNormal(0, 0.1, seed=2),
            )
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            emb = de.embedding_lookup(v, ids)
            assert emb.dtype == tf.float32
            loss = tf.reduce_mean(tf.square(emb - tf.cast(ids % 3, tf.float32)[:, None]))
            train = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.3)).minimize(
                loss
            )
            with new_session(graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                batches = [np.arange(b, b + 6) for b in range(0, 24, 2)]
                for _ in range(40):
                    for batch in batches:
                        sess.run(train, {ids: batch})
                losses[label] = np.mean([sess.run(loss, {ids: b}) for b in batches])
                if label != "float32":
                    assert v.tables[0].spec.emb_dtype == "bfloat16"
                assert v.tables[0].spec.slot_dtype == (
                    "bfloat16" if label == "bfloat16 slots" else "float32"
                )
    assert losses["float32"] < 0.05, losses
    assert abs(losses["bfloat16"] - losses["float32"]) < 0.01, losses
    assert abs(losses["bfloat16 slots"] - losses["float32"]) < 0.01, losses
    # The tier trains the same rows: bit-identical to all in memory.
    assert losses["tiered"] == losses["bfloat16"], losses
