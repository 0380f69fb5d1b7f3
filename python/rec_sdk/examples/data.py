"""Small data sets and readers for the rec_sdk examples.

Plain NumPy and the standard library only, so that it can be imported
without TensorFlow.

* :func:`load_movielens_100k` - MovieLens-100k ratings joined with user and
  item side information, as dense integer ids.
* :func:`train_test_split` - deterministic random row split of a feature dict.
* :func:`read_criteo_tsv` / :func:`write_criteo_tsv` - reader and writer for
  the Criteo display-advertising TSV format.
"""

import glob
import gzip
import os
import re
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

__all__ = [
    "load_movielens_100k",
    "train_test_split",
    "read_criteo_tsv",
    "write_criteo_tsv",
    "CRITEO_NUM_DENSE",
    "CRITEO_NUM_CATEGORICAL",
]

# ---------------------------------------------------------------------------
# MovieLens-100k
# ---------------------------------------------------------------------------

# The RecBole wheel (MIT licensed) ships a copy of MovieLens-100k in its
# "atomic file" format; fetching it through pip avoids depending on the
# GroupLens site being reachable.
_RECBOLE_REQUIREMENT = "recbole==1.2.1"
_ML100K_MEMBER_DIR = "recbole/dataset_example/ml-100k/"
_ML100K_FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")

# Categorical fields returned by load_movielens_100k, besides "genres".
_ML100K_ID_FIELDS = ("user_id", "item_id", "occupation", "zip", "age", "gender")


def _default_ml100k_cache_dir():
    env = os.environ.get("REC_SDK_DATA_DIR")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "rec_sdk", "ml-100k")


def _download_recbole_wheel(dest_dir):
    """Downloads the RecBole wheel into ``dest_dir`` and returns its path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        _RECBOLE_REQUIREMENT,
        "-d",
        dest_dir,
    ]
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False
        )
    except OSError as e:
        raise RuntimeError(f"Could not run {' '.join(cmd)!r} to fetch MovieLens-100k: {e}") from e
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()[-2000:]
        raise RuntimeError(
            f"Fetching MovieLens-100k failed: {' '.join(cmd)!r} exited with "
            f"status {proc.returncode}.\n{detail}"
        )
    wheels = glob.glob(os.path.join(dest_dir, "recbole-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(
            f"{' '.join(cmd)!r} succeeded but did not produce exactly one "
            f"recbole wheel in {dest_dir} (found {wheels})."
        )
    return wheels[0]


def _write_atomically(path, payload):
    """Writes bytes to ``path`` so readers never observe a partial file."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        # mkstemp creates 0600 files; cached data is not private.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _ensure_ml100k_files(cache_dir):
    """Returns {file name: path}, downloading and extracting on a cache miss."""
    paths = {name: os.path.join(cache_dir, name) for name in _ML100K_FILES}
    if all(os.path.isfile(p) for p in paths.values()):
        return paths
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rec_sdk_recbole_") as tmp:
        wheel = _download_recbole_wheel(tmp)
        with zipfile.ZipFile(wheel) as zf:
            for name in _ML100K_FILES:
                try:
                    payload = zf.read(_ML100K_MEMBER_DIR + name)
                except KeyError as e:
                    raise RuntimeError(
                        f"{os.path.basename(wheel)} does not contain {_ML100K_MEMBER_DIR + name}."
                    ) from e
                _write_atomically(paths[name], payload)
    return paths


def _read_atomic_file(path):
    """Reads a RecBole atomic file into {column name: list of str}.

    The first line holds ``name:type`` headers; only the names are kept.
    """
    with open(path, "r", encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\r\n").split("\t")
        names = [h.split(":", 1)[0] for h in header]
        columns = {n: [] for n in names}
        for lineno, line in enumerate(f, start=2):
            line = line.rstrip("\r\n")
            if not line:
                continue
            values = line.split("\t")
            if len(values) != len(names):
                raise ValueError(
                    f"{path}: line {lineno}: expected {len(names)} "
                    f"tab-separated fields, got {len(values)}"
                )
            for n, v in zip(names, values):
                columns[n].append(v)
    return columns


def _require_columns(columns, required, path):
    missing = [c for c in required if c not in columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; found {list(columns)}")


def _sorted_vocab(tokens):
    """Sorted distinct tokens: numerically if all are integers, else as text.

    Numeric order keeps e.g. ages and the original MovieLens user/item ids in
    their natural order, so MovieLens user 196 gets id 196.
    """
    distinct = set(tokens)
    if distinct and all(re.fullmatch(r"-?[0-9]+", t) for t in distinct):
        return sorted(distinct, key=lambda t: (int(t), t))
    return sorted(distinct)


def _encode(tokens, vocab):
    """Maps tokens to int64 ids 1..len(vocab) given a vocab list."""
    index = {t: i + 1 for i, t in enumerate(vocab)}
    return np.fromiter((index[t] for t in tokens), dtype=np.int64, count=len(tokens))


def load_movielens_100k(cache_dir=None):
    """Loads MovieLens-100k, one row per rating, with user and item features.

    The data come from the ``recbole==1.2.1`` wheel on PyPI (MIT licensed),
    fetched once with ``pip download`` and cached as three TSV files
    (``ml-100k.inter``, ``ml-100k.user``, ``ml-100k.item``).

    Args:
      cache_dir: directory holding the cached files. Defaults to the
        ``REC_SDK_DATA_DIR`` environment variable if set, else
        ``~/.cache/rec_sdk/ml-100k``.

    Returns:
      ``(features, vocab_sizes)``. ``features`` maps names to NumPy arrays with
      one row per rating (100,000 rows), in file order:

      * ``user_id``, ``item_id``, ``occupation``, ``zip``, ``age``,
        ``gender``: int64 ``[n]``. Each field's tokens are mapped to dense ids
        ``1..vocab_sizes[field]`` in sorted token order (numeric order when
        every token is an integer); 0 is never used.
      * ``genres``: int64 ``[n, G]`` with ``G`` the largest number of genres of
        any item; genre ids start at 1 and rows are padded with -1.
      * ``label``: float32 ``[n]``, 1.0 if the rating is >= 4 else 0.0.
      * ``timestamp``: int64 ``[n]``, seconds since the epoch.

      ``vocab_sizes`` maps each id field and ``"genres"`` to its number of
      distinct tokens, i.e. the largest id; an embedding table therefore needs
      ``vocab_sizes[field] + 1`` rows if it is indexed by id directly.

    Raises:
      RuntimeError: if the files are not cached and the download fails.
      ValueError: if a cached file does not have the expected layout.
    """
    if cache_dir is None:
        cache_dir = _default_ml100k_cache_dir()
    paths = _ensure_ml100k_files(os.fspath(cache_dir))

    inter_path = paths["ml-100k.inter"]
    user_path = paths["ml-100k.user"]
    item_path = paths["ml-100k.item"]
    inter = _read_atomic_file(inter_path)
    users = _read_atomic_file(user_path)
    items = _read_atomic_file(item_path)
    _require_columns(inter, ("user_id", "item_id", "rating", "timestamp"), inter_path)
    _require_columns(users, ("user_id", "age", "gender", "occupation", "zip_code"), user_path)
    _require_columns(items, ("item_id", "class"), item_path)

    # Vocabularies of user/item ids cover the side tables as well as the
    # ratings, so every rated user/item is guaranteed an id.
    user_vocab = _sorted_vocab(inter["user_id"] + users["user_id"])
    item_vocab = _sorted_vocab(inter["item_id"] + items["item_id"])
    n_users = len(user_vocab)
    n_items = len(item_vocab)

    rating_user = _encode(inter["user_id"], user_vocab)
    rating_item = _encode(inter["item_id"], item_vocab)
    table_user = _encode(users["user_id"], user_vocab)
    table_item = _encode(items["item_id"], item_vocab)
    if len(np.unique(table_user)) != len(table_user):
        raise ValueError(f"{user_path}: duplicate user_id")
    if len(np.unique(table_item)) != len(table_item):
        raise ValueError(f"{item_path}: duplicate item_id")

    features = {"user_id": rating_user, "item_id": rating_item}
    vocab_sizes = {"user_id": n_users, "item_id": n_items}

    # Per-user side features: build a lookup indexed by dense user id, then
    # gather by each rating's user.
    missing_users = np.setdiff1d(np.unique(rating_user), table_user)
    if missing_users.size:
        raise ValueError(f"{user_path}: {missing_users.size} rated user(s) have no profile")
    for field, column in (
        ("occupation", "occupation"),
        ("zip", "zip_code"),
        ("age", "age"),
        ("gender", "gender"),
    ):
        vocab = _sorted_vocab(users[column])
        lookup = np.full(n_users + 1, -1, dtype=np.int64)
        lookup[table_user] = _encode(users[column], vocab)
        features[field] = lookup[rating_user]
        vocab_sizes[field] = len(vocab)

    missing_items = np.setdiff1d(np.unique(rating_item), table_item)
    if missing_items.size:
        raise ValueError(f"{item_path}: {missing_items.size} rated item(s) have no entry")
    item_genres = [g.split() for g in items["class"]]
    genre_vocab = sorted({g for gs in item_genres for g in gs})
    genre_index = {g: i + 1 for i, g in enumerate(genre_vocab)}
    max_genres = max((len(gs) for gs in item_genres), default=0)
    genre_lookup = np.full((n_items + 1, max_genres), -1, dtype=np.int64)
    for row, gs in zip(table_item, item_genres):
        genre_lookup[row, : len(gs)] = [genre_index[g] for g in gs]
    features["genres"] = genre_lookup[rating_item]
    vocab_sizes["genres"] = len(genre_vocab)

    ratings = np.asarray(inter["rating"], dtype=np.float64)
    features["label"] = (ratings >= 4.0).astype(np.float32)
    # Timestamps are typed "float" in the header but hold whole seconds.
    features["timestamp"] = np.asarray([int(float(t)) for t in inter["timestamp"]], dtype=np.int64)

    order = (
        "user_id",
        "item_id",
        "occupation",
        "zip",
        "age",
        "gender",
        "genres",
        "label",
        "timestamp",
    )
    return {k: features[k] for k in order}, vocab_sizes


# ---------------------------------------------------------------------------
# Splitting
# ---------------------------------------------------------------------------


def train_test_split(features, test_fraction=0.2, seed=0):
    """Splits every array of a feature dict into train and test rows.

    The same random row selection is applied to every array, so rows stay
    aligned. Within each part rows keep their original relative order. The
    result depends only on the number of rows, ``test_fraction`` and ``seed``.

    Args:
      features: dict of arrays that all have the same length along axis 0.
      test_fraction: fraction of rows put in the test part, in (0, 1);
        the test part gets ``round(n * test_fraction)`` rows.
      seed: seed of the NumPy random generator that picks the test rows.

    Returns:
      ``(train, test)``, two dicts with the same keys as ``features``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not features:
        raise ValueError("features is empty")
    arrays = {k: np.asarray(v) for k, v in features.items()}
    lengths = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    n = next(iter(lengths.values()))
    if n is None or any(length != n for length in lengths.values()):
        raise ValueError(f"all features need the same number of rows, got {lengths}")
    n_test = int(round(n * test_fraction))
    perm = np.random.default_rng(seed).permutation(n)
    test_idx = np.sort(perm[:n_test])
    train_idx = np.sort(perm[n_test:])
    train = {k: a[train_idx] for k, a in arrays.items()}
    test = {k: a[test_idx] for k, a in arrays.items()}
    return train, test


# ---------------------------------------------------------------------------
# Criteo
# ---------------------------------------------------------------------------

CRITEO_NUM_DENSE = 13
CRITEO_NUM_CATEGORICAL = 26
_CRITEO_NUM_FIELDS = 1 + CRITEO_NUM_DENSE + CRITEO_NUM_CATEGORICAL
# Bit position of the field tag in categorical ids; hashed values are at most
# 32 bits (+1), so the tag never overlaps them.
_CRITEO_FIELD_SHIFT = 40

# int()/float() would also accept spaces, underscores, "nan", "0x..." etc.;
# these patterns keep the accepted syntax to plain numbers and hex digits.
_INT_RE = re.compile(rb"[+-]?[0-9]+")
_NUMBER_RE = re.compile(rb"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEX_RE = re.compile(rb"[0-9a-fA-F]{1,8}")

_DECIMAL_CHARS = b"0123456789+-"
_HEX_CHARS = b"0123456789abcdefABCDEF"
# Nibble value of each byte. NUL (numpy's padding of short "S" tokens) also
# maps to 0; _hex_to_int64 masks those positions out.
_HEX_NIBBLE = np.zeros(256, dtype=np.int64)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_NIBBLE[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_NIBBLE[_c] = 10 + _i
del _i, _c

_CHUNK_ROWS = 1 << 16


def _diagnose_criteo_line(line):
    """Describes what is wrong with a malformed Criteo line (for errors)."""
    fields = line.split(b"\t")
    if len(fields) != _CRITEO_NUM_FIELDS:
        return f"expected {_CRITEO_NUM_FIELDS} tab-separated fields, got {len(fields)}"
    if not _NUMBER_RE.fullmatch(fields[0]):
        return f"label is not a number: {fields[0]!r}"
    for i in range(CRITEO_NUM_DENSE):
        tok = fields[1 + i]
        if tok and not _INT_RE.fullmatch(tok):
            return f"integer field I{i + 1} is not an integer: {tok!r}"
    for i in range(CRITEO_NUM_CATEGORICAL):
        tok = fields[1 + CRITEO_NUM_DENSE + i]
        if tok and not _HEX_RE.fullmatch(tok):
            return f"categorical field C{i + 1} is not 1-8 hex digits: {tok!r}"
    return "malformed line"


def _hex_to_int64(tokens):
    """Maps an "S8" array of validated hex tokens to int(tok, 16) + 1, or 0
    for empty tokens, elementwise."""
    raw = np.frombuffer(tokens.tobytes(), dtype=np.uint8)
    raw = raw.reshape(tokens.shape + (8,))
    present = raw != 0  # numpy pads shorter tokens with trailing NULs
    nibbles = _HEX_NIBBLE[raw]
    value = np.zeros(tokens.shape, dtype=np.int64)
    for k in range(8):
        value = np.where(present[..., k], value * 16 + nibbles[..., k], value)
    return np.where(present[..., 0], value + 1, 0)


def _open_binary(path):
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def read_criteo_tsv(path, max_rows=None):
    """Reads a file in the Criteo display-advertising TSV format.

    Each line is ``label``, 13 integer fields ``I1..I13`` and 26 categorical
    fields ``C1..C26``, separated by tabs. Integer and categorical fields may
    be empty; categorical values are hashes written as (up to) 8 hex digits.
    The file is read line by line; a path ending in ``.gz`` is decompressed
    on the fly.

    Args:
      path: file to read.
      max_rows: if not None, stop after this many rows.

    Returns:
      A dict with

      * ``label``: float32 ``[n]``.
      * ``dense``: float32 ``[n, 13]``, ``log1p(max(x, 0))`` of the integer
        fields, with empty fields taken as 0.
      * ``categorical``: int64 ``[n, 26]``. For field ``f`` (0-based) a value
        ``h`` becomes ``int(h, 16) + 1`` and an empty field becomes 0; then
        ``(f + 1) << 40`` is added, so ids of different fields never collide
        (an empty field also gets a per-field id).

    Raises:
      ValueError: for a malformed line (wrong number of fields, a label or
        integer field that is not a number, a categorical field that is not
        1-8 hex digits); the message names the file and the 1-based line.
    """
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    fpath = os.fspath(path)

    def fail(lineno, problem):
        raise ValueError(f"{fpath}: line {lineno}: {problem}")

    field_offsets = np.array(
        [(f + 1) << _CRITEO_FIELD_SHIFT for f in range(CRITEO_NUM_CATEGORICAL)], dtype=np.int64
    )
    labels, denses, cats = [], [], []
    # Rows of the chunk being filled; categorical tokens are decoded per
    # chunk with NumPy, which is far faster than int(tok, 16) per field.
    chunk_label, chunk_dense, chunk_cat = [], [], []
    total = 0

    def flush():
        labels.append(np.array(chunk_label, dtype=np.float32))
        denses.append(np.array(chunk_dense, dtype=np.float64))
        # Tokens were checked to be <= 8 hex digits, so "S8" loses nothing.
        tokens = np.array(chunk_cat, dtype="S8")
        cats.append(_hex_to_int64(tokens) + field_offsets)
        chunk_label.clear()
        chunk_dense.clear()
        chunk_cat.clear()

    with _open_binary(path) as f:
        for lineno, line in enumerate(f, start=1):
            if max_rows is not None and total >= max_rows:
                break
            line = line.rstrip(b"\r\n")
            fields = line.split(b"\t")
            if len(fields) != _CRITEO_NUM_FIELDS:
                fail(lineno, _diagnose_criteo_line(line))
            label_tok = fields[0]
            dense_toks = fields[1 : 1 + CRITEO_NUM_DENSE]
            cat_toks = fields[1 + CRITEO_NUM_DENSE :]
            # Cheap whole-line character checks first; int() rejects the
            # remaining bad shapes such as "1-2" or "+".
            if (
                not _NUMBER_RE.fullmatch(label_tok)
                or b"".join(dense_toks).translate(None, _DECIMAL_CHARS)
                or b"".join(cat_toks).translate(None, _HEX_CHARS)
                or max(map(len, cat_toks)) > 8
            ):
                fail(lineno, _diagnose_criteo_line(line))
            try:
                dense_row = [int(t) if t else 0 for t in dense_toks]
            except ValueError:
                dense_row = None
            if dense_row is None:
                fail(lineno, _diagnose_criteo_line(line))

            chunk_label.append(float(label_tok))
            chunk_dense.append(dense_row)
            chunk_cat.append(cat_toks)
            total += 1
            if len(chunk_label) == _CHUNK_ROWS:
                flush()

    if chunk_label:
        flush()
    if labels:
        label = np.concatenate(labels)
        dense = np.concatenate(denses)
        categorical = np.concatenate(cats)
    else:
        label = np.zeros(0, dtype=np.float32)
        dense = np.zeros((0, CRITEO_NUM_DENSE), dtype=np.float64)
        categorical = np.zeros((0, CRITEO_NUM_CATEGORICAL), dtype=np.int64)
    dense = np.log1p(np.maximum(dense, 0.0)).astype(np.float32)
    return {"label": label, "dense": dense, "categorical": categorical}


def _format_field(value):
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        if np.isnan(value):
            return ""
        if float(value).is_integer():
            return str(int(value))
    return str(value)


def write_criteo_tsv(path, label, dense_int, categorical_hex):
    """Writes rows in the Criteo TSV format read by :func:`read_criteo_tsv`.

    Args:
      path: output file (overwritten). A ``.gz`` suffix writes gzip.
      label: ``n`` labels, usually 0/1.
      dense_int: ``n`` rows of 13 integers; ``None`` (or NaN) leaves a field
        empty.
      categorical_hex: ``n`` rows of 26 hex strings (e.g. ``"68fd1e64"``);
        ``None`` or ``""`` leaves a field empty.

    Returns:
      ``path``.
    """
    label = list(label)
    dense_int = list(dense_int)
    categorical_hex = list(categorical_hex)
    n = len(label)
    if len(dense_int) != n or len(categorical_hex) != n:
        raise ValueError(
            f"label, dense_int and categorical_hex need the same number of "
            f"rows, got {n}, {len(dense_int)} and {len(categorical_hex)}"
        )
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "wt", encoding="ascii", newline="\n") as f:
        for r in range(n):
            d_row = list(dense_int[r])
            c_row = list(categorical_hex[r])
            if len(d_row) != CRITEO_NUM_DENSE:
                raise ValueError(
                    f"row {r}: expected {CRITEO_NUM_DENSE} integer fields, got {len(d_row)}"
                )
            if len(c_row) != CRITEO_NUM_CATEGORICAL:
                raise ValueError(
                    f"row {r}: expected {CRITEO_NUM_CATEGORICAL} "
                    f"categorical fields, got {len(c_row)}"
                )
            cells = [_format_field(label[r])]
            cells += [_format_field(v) for v in d_row]
            cells += ["" if v is None else str(v) for v in c_row]
            f.write("\t".join(cells) + "\n")
    return path
