"""The demo models and data: the synthetic Criteo-schema generator, the streaming readers,
and Wide&Deep / DLRM / DCN-v2 trained through rec_sdk.examples.train in both modes."""

import numpy as np
import pytest
import tensorflow as tf

from rec_sdk.examples import data, inputs, synthetic, train
from rec_sdk.examples.metrics import auc


def test_synthetic_rows_are_deterministic_across_ranges_and_chunks():
    g = synthetic.Generator(seed=3, scale=0.01)
    whole = g.rows(synthetic.CHUNK_ROWS - 50, 100)  # crosses a chunk boundary
    parts = [g.rows(synthetic.CHUNK_ROWS - 50, 30), g.rows(synthetic.CHUNK_ROWS - 20, 70)]
    for key in whole:
        np.testing.assert_array_equal(whole[key], np.concatenate([p[key] for p in parts]))
    streamed = list(g.chunks(100, start=synthetic.CHUNK_ROWS - 50))
    assert [len(c["label"]) for c in streamed] == [50, 50]
    np.testing.assert_array_equal(
        np.concatenate([c["categorical"] for c in streamed]), whole["categorical"]
    )
    other = synthetic.Generator(seed=4, scale=0.01).rows(synthetic.CHUNK_ROWS - 50, 100)
    assert not np.array_equal(other["categorical"], whole["categorical"])


def test_synthetic_schema_zipf_ids_and_planted_signal():
    g = synthetic.Generator(seed=0, scale=1.0)
    assert g.cardinalities == synthetic.cardinalities(1.0)
    assert max(g.cardinalities) == synthetic.MAX_CARDINALITY
    rows = g.chunk(0)
    assert rows["dense"].shape == (synthetic.CHUNK_ROWS, 13) and rows["dense"].min() >= 0
    cat = rows["categorical"]
    assert cat.shape == (synthetic.CHUNK_ROWS, 26)
    assert ((cat >= 0) & (cat < np.array(g.cardinalities))).all()
    # Zipf: the most frequent id of a large field carries a large share of its rows.
    _, counts = np.unique(cat[:, 2], return_counts=True)
    assert counts.max() > 0.05 * synthetic.CHUNK_ROWS and len(counts) > 5000
    # The label follows the planted logit: its AUC is high, a shuffled one's is 0.5.
    assert synthetic.bayes_auc(g) > 0.8
    assert abs(auc(rows["label"], np.random.default_rng(0).permutation(rows["logit"])) - 0.5) < 0.02
    features = synthetic.features(rows)
    assert (features["categorical"] >> 40 == np.arange(1, 27)).all()
    with pytest.raises(ValueError, match="scale must be > 0"):
        synthetic.cardinalities(0)


def _read(dataset):
    batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    out = []
    with tf.compat.v1.Session() as sess:
        while True:
            try:
                out.append(sess.run(batch))
            except tf.errors.OutOfRangeError:
                break
    return {k: np.concatenate([o[k] for o in out]) for k in out[0]}


def test_streaming_readers_match_the_generator_and_the_numpy_reader(tmp_path):
    g = synthetic.Generator(seed=1, scale=0.001)
    tsv = synthetic.write_tsv(str(tmp_path / "a.tsv"), g, 3000)
    record = synthetic.write_tfrecord(str(tmp_path / "a.tfrecord"), g, 3000)
    expected = synthetic.features(g.rows(0, 3000))
    from_records = _read(inputs.tfrecord_dataset(record, 512))
    for key in expected:
        np.testing.assert_allclose(from_records[key], expected[key], rtol=1e-6)
    from_tsv = _read(inputs.criteo_tsv_dataset([tsv], 700))
    reference = data.read_criteo_tsv(tsv)
    for key in ("label", "categorical"):
        np.testing.assert_array_equal(from_tsv[key], reference[key])
    np.testing.assert_allclose(from_tsv["dense"], reference["dense"], rtol=1e-6)
    np.testing.assert_allclose(from_tsv["dense"], expected["dense"], rtol=1e-6)
    np.testing.assert_array_equal(from_tsv["label"], expected["label"])


@pytest.mark.once
def test_criteo_reader_handles_empty_fields_and_rejects_bad_hex(tmp_path):
    good = tmp_path / "good.tsv"
    good.write_text("1\t" + "\t" * 12 + "5\t" + "\t".join(["ff"] + [""] * 25) + "\n")
    out = _read(inputs.criteo_tsv_dataset(str(good), 4))
    assert out["categorical"][0, 0] == 0x100 + (1 << 40)  # int(h, 16) + 1, field 1
    assert out["categorical"][0, 1] == 2 << 40  # empty: the field's own key
    np.testing.assert_allclose(out["dense"][0], [0] * 12 + [np.log1p(5)], rtol=1e-6)
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t" + "\t" * 12 + "5\t" + "\t".join(["zz"] + [""] * 25) + "\n")
    with pytest.raises(tf.errors.InvalidArgumentError, match="not 1-8 hex digits"):
        _read(inputs.criteo_tsv_dataset(str(bad), 4))


def test_avazu_reader(tmp_path):
    path = tmp_path / "train.csv"
    lines = [",".join(inputs.AVAZU_COLUMNS)]
    for i in range(5):
        lines.append(",".join([str(i), str(i % 2), "14102100"] + ["v%d" % (i % 2)] * 21))
    path.write_text("\n".join(lines) + "\n")
    out = _read(inputs.avazu_csv_dataset(str(path), 2))
    np.testing.assert_array_equal(out["label"], [0, 1, 0, 1, 0])
    cat = out["categorical"]
    assert cat.shape == (5, 22) and (cat >> 40 == np.arange(1, 23)).all()
    np.testing.assert_array_equal(cat[0], cat[2])
    assert (cat[0, 1:] != cat[1, 1:]).all() and cat[0, 0] == cat[1, 0]


@pytest.mark.parametrize("model", ["wide_deep", "dlrm", "dcn_v2"])
def test_models_train_on_movielens_in_session_mode(model):
    lines = []
    results = train.main(
        [
            "--model",
            model,
            "--data",
            "movielens",
            "--steps",
            "300",
            "--eval-every",
            "150",
            "--batch-size",
            "256",
        ],
        log=lines.append,
    )
    assert [h[0] for h in results["history"]] == [150, 300]
    assert results["test_auc"] > 0.72, results
    assert results["samples_per_s"] > 0
    assert any(line.startswith("final") for line in lines)


def test_dlrm_on_synthetic_files_streamed_with_tensorboard_summaries(tmp_path):
    g = synthetic.Generator(seed=0, scale=0.001)
    path = synthetic.write_tfrecord(str(tmp_path / "train.tfrecord"), g, 20000)
    logdir = str(tmp_path / "tb")
    results = train.main(
        [
            "--model",
            "dlrm",
            "--data",
            "tfrecord:" + path,
            "--steps",
            "120",
            "--eval-every",
            "60",
            "--batch-size",
            "512",
            "--eval-batches",
            "4",
            "--logdir",
            logdir,
        ],
        log=lambda line: None,
    )
    assert results["test_auc"] > 0.6, results
    tags = set()
    for event in tf.compat.v1.train.summary_iterator(
        next(str(p) for p in (tmp_path / "tb").iterdir())
    ):
        tags.update(v.tag for v in event.summary.value)
    assert {
        "loss",
        "step_time_ms",
        "samples_per_s",
        "eval/auc",
        "eval/log_loss",
        "tables/C3/size",
        "tables/C3/admitted",
        "tables/C3/evicted",
    } <= tags


@pytest.mark.estimator
def test_estimator_mode(tmp_path):
    results = train.main(
        [
            "--model",
            "wide_deep",
            "--data",
            "movielens",
            "--mode",
            "estimator",
            "--steps",
            "200",
            "--eval-every",
            "100",
            "--batch-size",
            "256",
            "--logdir",
            str(tmp_path),
        ],
        log=lambda line: None,
    )
    assert [h[0] for h in results["history"]] == [100, 200]
    assert results["test_auc"] > 0.7, results


@pytest.mark.parametrize(
    "mode", ["session", pytest.param("estimator", marks=pytest.mark.estimator)]
)
def test_dynamic_embedding_api(mode, tmp_path):
    """The same models on rec_sdk.dynamic_embedding variables (TFRA's API)."""
    results = train.main(
        [
            "--model",
            "dlrm",
            "--data",
            "movielens",
            "--api",
            "dynamic_embedding",
            "--mode",
            mode,
            "--steps",
            "200",
            "--eval-every",
            "200",
            "--batch-size",
            "256",
            "--logdir",
            str(tmp_path),
        ],
        log=lambda line: None,
    )
    assert results["test_auc"] > 0.7, results


def test_bad_arguments():
    with pytest.raises(SystemExit):
        train.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        train.parse_args(["--api", "dynamic_embedding", "--access-threshold", "2"])
    with pytest.raises(ValueError, match="--data must be"):
        train.make_source("parquet:x")


@pytest.mark.parametrize(
    "model,data",
    [
        pytest.param("wide_deep", "movielens", marks=pytest.mark.once),
        pytest.param("dlrm", "synthetic", marks=pytest.mark.stress),
    ],
)  # 2 minutes
def test_half_precision_rows_reach_the_auc_of_float32(model, data):
    """bfloat16 rows, and bfloat16 rows with bfloat16 Adam moments (stochastic rounding, fixed
    seed), reach float32's eval AUC after the same steps, within 0.002 (measured: within
    0.0001 at 1,000 / 600 steps)."""
    results = {}
    for dtype, slot_dtype in (
        ("float32", "float32"),
        ("bfloat16", "float32"),
        ("bfloat16", "bfloat16"),
    ):
        with tf.Graph().as_default():
            results[dtype, slot_dtype] = train.main(
                [
                    "--model",
                    model,
                    "--data",
                    data,
                    "--steps",
                    "300",
                    "--batch-size",
                    "512",
                    "--eval-every",
                    "300",
                    "--rows",
                    "200000",
                    "--emb-dtype",
                    dtype,
                    "--slot-dtype",
                    slot_dtype,
                ]
            )["test_auc"]
    base = results["float32", "float32"]
    assert base > 0.7, results
    for value in results.values():
        assert abs(value - base) < 0.002, results
