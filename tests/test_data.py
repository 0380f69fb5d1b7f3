"""Tests for rec_sdk.examples.data (Criteo reader/writer, MovieLens, split)."""

import gzip
import math
import subprocess

import numpy as np
import pytest

from rec_sdk.examples import data

N_DENSE = 13
N_CAT = 26


# ---------------------------------------------------------------------------
# Criteo
# ---------------------------------------------------------------------------


def _random_rows(rng, n):
    """Random Criteo rows as Python values; None marks an empty field."""
    rows = []
    for _ in range(n):
        label = int(rng.integers(0, 2))
        dense = [
            None if rng.random() < 0.2 else int(rng.integers(-5, 100000)) for _ in range(N_DENSE)
        ]
        cats = [
            None if rng.random() < 0.2 else "%08x" % int(rng.integers(0, 2**32))
            for _ in range(N_CAT)
        ]
        rows.append((label, dense, cats))
    # Make sure the extremes occur at least once.
    rows[0] = (1, [None] * N_DENSE, [None] * N_CAT)
    rows[1] = (0, [0] * N_DENSE, ["00000000"] * N_CAT)
    rows[2] = (1, [-1] * N_DENSE, ["ffffffff"] * N_CAT)
    return rows


def _line(row):
    label, dense, cats = row
    cells = [str(label)]
    cells += ["" if v is None else str(v) for v in dense]
    cells += ["" if v is None else v for v in cats]
    return "\t".join(cells)


def _expected(rows):
    """Reference values computed straight from the spec, row by row."""
    label = np.array([r[0] for r in rows], dtype=np.float32)
    dense = np.zeros((len(rows), N_DENSE), dtype=np.float64)
    cat = np.zeros((len(rows), N_CAT), dtype=np.int64)
    for i, (_, d, c) in enumerate(rows):
        for j, v in enumerate(d):
            x = 0 if v is None else v
            dense[i, j] = math.log1p(max(x, 0))
        for j, h in enumerate(c):
            base = 0 if h is None else int(h, 16) + 1
            cat[i, j] = base + ((j + 1) << 40)
    return label, dense.astype(np.float32), cat


def _write_lines(path, lines, newline="\n"):
    with open(path, "w", encoding="ascii", newline="") as f:
        for line in lines:
            f.write(line + newline)


def _check(parsed, rows):
    label, dense, cat = _expected(rows)
    assert parsed["label"].dtype == np.float32
    assert parsed["dense"].dtype == np.float32
    assert parsed["categorical"].dtype == np.int64
    assert parsed["label"].shape == (len(rows),)
    assert parsed["dense"].shape == (len(rows), N_DENSE)
    assert parsed["categorical"].shape == (len(rows), N_CAT)
    np.testing.assert_array_equal(parsed["label"], label)
    np.testing.assert_allclose(parsed["dense"], dense, rtol=1e-6)
    np.testing.assert_array_equal(parsed["categorical"], cat)


def test_read_criteo_matches_reference(tmp_path):
    rows = _random_rows(np.random.default_rng(1), 300)
    path = tmp_path / "day.tsv"
    _write_lines(path, [_line(r) for r in rows])
    _check(data.read_criteo_tsv(path), rows)


def test_read_criteo_crlf_and_gzip(tmp_path):
    rows = _random_rows(np.random.default_rng(2), 50)
    crlf = tmp_path / "crlf.tsv"
    _write_lines(crlf, [_line(r) for r in rows], newline="\r\n")
    _check(data.read_criteo_tsv(str(crlf)), rows)

    gz = tmp_path / "day.tsv.gz"
    with gzip.open(gz, "wt", encoding="ascii") as f:
        for r in rows:
            f.write(_line(r) + "\n")
    _check(data.read_criteo_tsv(gz), rows)


def test_read_criteo_max_rows_stops_before_bad_lines(tmp_path):
    rows = _random_rows(np.random.default_rng(3), 20)
    path = tmp_path / "day.tsv"
    _write_lines(path, [_line(r) for r in rows] + ["garbage"])
    _check(data.read_criteo_tsv(path, max_rows=7), rows[:7])
    _check(data.read_criteo_tsv(path, max_rows=20), rows)
    with pytest.raises(ValueError, match="line 21"):
        data.read_criteo_tsv(path)


def test_read_criteo_empty_file(tmp_path):
    path = tmp_path / "empty.tsv"
    path.write_text("")
    parsed = data.read_criteo_tsv(path)
    _check(parsed, [])


def test_read_criteo_fields_never_collide(tmp_path):
    rows = [(0, [1] * N_DENSE, ["0000abcd"] * N_CAT), (1, [1] * N_DENSE, [None] * N_CAT)]
    path = tmp_path / "same.tsv"
    _write_lines(path, [_line(r) for r in rows])
    cat = data.read_criteo_tsv(path)["categorical"]
    assert len(np.unique(cat)) == 2 * N_CAT
    assert (cat > 0).all()


def test_read_criteo_short_and_uppercase_hex(tmp_path):
    cats = ["1", "ABCDEF", "aBc", "0"] + ["FFFFFFFF"] * (N_CAT - 4)
    path = tmp_path / "hex.tsv"
    _write_lines(path, [_line((0.5, [None] * N_DENSE, cats))])
    parsed = data.read_criteo_tsv(path)
    assert parsed["label"][0] == np.float32(0.5)
    expected = [int(h, 16) + 1 + ((j + 1) << 40) for j, h in enumerate(cats)]
    assert parsed["categorical"][0].tolist() == expected


def test_read_criteo_large_chunked(tmp_path):
    # More rows than one internal chunk, to exercise chunk concatenation.
    n = (1 << 16) + 123
    line = _line((1, [3] + [None] * (N_DENSE - 1), ["0000000f"] * N_CAT))
    path = tmp_path / "big.tsv"
    _write_lines(path, [line] * n)
    parsed = data.read_criteo_tsv(path)
    assert parsed["label"].shape == (n,)
    np.testing.assert_allclose(parsed["dense"][:, 0], np.log1p(3.0), rtol=1e-6)
    assert (parsed["categorical"][:, 5] == 16 + (6 << 40)).all()


def _good_fields():
    return ["1"] + ["7"] * N_DENSE + ["deadbeef"] * N_CAT


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda f: f[:-1], "fields"),
        (lambda f: f + ["x"], "fields"),
        (lambda f: f[:5] + ["12a"] + f[6:], "I5"),
        (lambda f: f[:2] + ["1.5"] + f[3:], "I2"),
        (lambda f: f[:2] + [" 4"] + f[3:], "I2"),
        (lambda f: f[:14] + ["xyz"] + f[15:], "C1"),
        (lambda f: f[:20] + ["123456789"] + f[21:], "C7"),
        (lambda f: f[:39] + ["0x12"], "C26"),
        (lambda f: ["yes"] + f[1:], "label"),
        (lambda f: [""] + f[1:], "label"),
    ],
)
def test_read_criteo_malformed_line(tmp_path, mutate, problem):
    good = "\t".join(_good_fields())
    bad = "\t".join(mutate(_good_fields()))
    path = tmp_path / "bad.tsv"
    _write_lines(path, [good, good, bad, good])
    with pytest.raises(ValueError) as info:
        data.read_criteo_tsv(path)
    msg = str(info.value)
    assert "line 3" in msg
    assert str(path) in msg
    assert problem in msg


def test_read_criteo_blank_line_is_malformed(tmp_path):
    good = "\t".join(_good_fields())
    path = tmp_path / "blank.tsv"
    _write_lines(path, [good, "", good])
    with pytest.raises(ValueError, match="line 2"):
        data.read_criteo_tsv(path)


def test_write_criteo_roundtrip(tmp_path):
    rows = _random_rows(np.random.default_rng(4), 100)
    path = tmp_path / "written.tsv"
    out = data.write_criteo_tsv(
        path,
        label=[r[0] for r in rows],
        dense_int=[r[1] for r in rows],
        categorical_hex=[r[2] for r in rows],
    )
    assert out == path
    # The writer's text must equal the independently built lines.
    assert path.read_text().splitlines() == [_line(r) for r in rows]
    _check(data.read_criteo_tsv(path), rows)


def test_write_criteo_numpy_inputs(tmp_path):
    rng = np.random.default_rng(5)
    label = rng.integers(0, 2, size=10).astype(np.float32)
    dense = rng.integers(0, 50, size=(10, N_DENSE))
    cats = [["%08x" % int(v) for v in rng.integers(0, 2**32, size=N_CAT)] for _ in range(10)]
    path = tmp_path / "np.tsv.gz"
    data.write_criteo_tsv(path, label, dense, cats)
    rows = [(int(label[i]), dense[i].tolist(), cats[i]) for i in range(10)]
    _check(data.read_criteo_tsv(path), rows)


def test_write_criteo_rejects_bad_shapes(tmp_path):
    with pytest.raises(ValueError):
        data.write_criteo_tsv(tmp_path / "a.tsv", [1], [[1] * 12], [["0"] * N_CAT])
    with pytest.raises(ValueError):
        data.write_criteo_tsv(tmp_path / "b.tsv", [1, 0], [[1] * N_DENSE], [["0"] * N_CAT])


# ---------------------------------------------------------------------------
# train_test_split
# ---------------------------------------------------------------------------


def test_train_test_split_small():
    n = 101
    feats = {"a": np.arange(n), "b": np.arange(2 * n).reshape(n, 2)}
    train, test = data.train_test_split(feats, test_fraction=0.3, seed=7)
    assert len(test["a"]) == round(n * 0.3)
    assert len(train["a"]) + len(test["a"]) == n
    # Rows stay aligned across arrays and the parts partition the rows.
    np.testing.assert_array_equal(train["b"][:, 0], 2 * train["a"])
    np.testing.assert_array_equal(test["b"][:, 0], 2 * test["a"])
    assert sorted(np.concatenate([train["a"], test["a"]])) == list(range(n))
    again = data.train_test_split(feats, test_fraction=0.3, seed=7)
    np.testing.assert_array_equal(again[1]["a"], test["a"])
    other = data.train_test_split(feats, test_fraction=0.3, seed=8)
    assert not np.array_equal(other[1]["a"], test["a"])


def test_train_test_split_rejects_bad_input():
    with pytest.raises(ValueError):
        data.train_test_split({"a": np.arange(3), "b": np.arange(4)})
    with pytest.raises(ValueError):
        data.train_test_split({"a": np.arange(3)}, test_fraction=1.0)


# ---------------------------------------------------------------------------
# MovieLens-100k
# ---------------------------------------------------------------------------


def test_movielens_download_failure_is_reported(tmp_path, monkeypatch):
    def fake_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="offline")

    monkeypatch.setattr(data.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError) as info:
        data.load_movielens_100k(cache_dir=tmp_path / "ml")
    assert "pip download" in str(info.value)
    assert "recbole==1.2.1" in str(info.value)
    assert "offline" in str(info.value)


@pytest.fixture(scope="module")
def movielens():
    # Uses the default cache ($REC_SDK_DATA_DIR or ~/.cache/rec_sdk/ml-100k);
    # the first run downloads the ~2 MB recbole wheel from PyPI.
    return data.load_movielens_100k()


def test_movielens_100k(movielens, monkeypatch):
    feats, vocab = movielens
    n = 100_000
    for key in (
        "user_id",
        "item_id",
        "occupation",
        "zip",
        "age",
        "gender",
        "genres",
        "label",
        "timestamp",
    ):
        assert key in feats
        assert feats[key].shape[0] == n

    assert vocab["user_id"] == 943
    assert vocab["item_id"] == 1682
    assert vocab["gender"] == 2
    assert vocab["occupation"] == 21
    assert len(np.unique(feats["user_id"])) == 943
    assert len(np.unique(feats["item_id"])) == 1682
    for key in ("user_id", "item_id", "occupation", "zip", "age", "gender"):
        ids = feats[key]
        assert ids.dtype == np.int64
        assert ids.min() >= 1
        assert ids.max() <= vocab[key]

    # First rating in the file: user 196 rated item 242 with 3 stars; the
    # numeric vocabulary keeps the original ids.
    assert feats["user_id"][0] == 196
    assert feats["item_id"][0] == 242
    assert feats["label"][0] == 0.0
    assert feats["timestamp"][0] == 881250949

    label = feats["label"]
    assert label.dtype == np.float32
    assert set(np.unique(label)) <= {0.0, 1.0}
    assert 0.4 < label.mean() < 0.7

    genres = feats["genres"]
    assert genres.dtype == np.int64 and genres.ndim == 2
    valid = genres != -1
    assert (genres[valid] >= 1).all()
    assert genres.max() == vocab["genres"]
    assert valid[:, 0].all()  # every movie has at least one genre
    # Padding only at the end of a row.
    assert (np.diff(valid.astype(np.int8), axis=1) <= 0).all()
    assert valid[:, -1].any()  # G is the real maximum

    # Side features are a function of the user / item.
    for key in ("occupation", "zip", "age", "gender"):
        pairs = np.unique(np.stack([feats["user_id"], feats[key]], 1), axis=0)
        assert len(pairs) == 943
    pairs = np.unique(np.concatenate([feats["item_id"][:, None], genres], 1), axis=0)
    assert len(pairs) == 1682

    train, test = data.train_test_split(feats, test_fraction=0.2, seed=0)
    assert len(train["label"]) == 80_000
    assert len(test["label"]) == 20_000
    assert set(train) == set(feats) == set(test)
    assert train["genres"].shape == (80_000, genres.shape[1])

    # A second load comes from the cache: downloading again would fail.
    def no_download(*args, **kwargs):
        raise AssertionError("cache was not reused")

    monkeypatch.setattr(data, "_download_recbole_wheel", no_download)
    again, vocab_again = data.load_movielens_100k()
    assert vocab_again == vocab
    np.testing.assert_array_equal(again["genres"], genres)
