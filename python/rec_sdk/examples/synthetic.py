"""A deterministic synthetic data set with Criteo's schema, for demos and benchmarks.

Rows have a 0/1 label, 13 non-negative integer fields I1..I13 and 26 categorical fields
C1..C26, as in Criteo's display-advertising data. Categorical ids are Zipf-distributed over
per-field cardinalities (by default Criteo's, scaled by `scale`, at most 10M per field), and
the label carries a planted signal: logit = bias + sum over fields of a weight per (field, id)
+ a linear term of log1p(dense), so a model that learns per-id embeddings reaches an AUC well
above 0.5 (the generator's own logit reaches `bayes_auc`), and skipping work shows up as lower
AUC.

Any number of rows: rows are made in chunks of CHUNK_ROWS, each from its own random stream
(seed, chunk number), so row r is the same whichever range is asked for, and files larger
than memory are written chunk by chunk.

    python -m rec_sdk.examples.synthetic --rows 1000000 --out criteo_synth.tfrecord
    python -m rec_sdk.examples.synthetic --rows 100000 --out criteo_synth.tsv --scale 0.01
"""

import argparse
import os
import sys

import numpy as np
import tensorflow as tf

from rec_sdk.examples.metrics import auc

NUM_DENSE = 13
NUM_CATEGORICAL = 26
CHUNK_ROWS = 1 << 16
MAX_CARDINALITY = 10_000_000
# Distinct values per categorical field in Criteo's 7-day Kaggle data (C1..C26).
CRITEO_CARDINALITIES = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)
ZIPF_EXPONENT = 1.1
_MIX = np.uint64(0x9E3779B97F4A7C15)


def cardinalities(scale=1.0):
    """Per-field cardinalities: Criteo's times `scale`, in [2, MAX_CARDINALITY]."""
    if not scale > 0:
        raise ValueError("scale must be > 0, got %r" % (scale,))
    return tuple(int(min(MAX_CARDINALITY, max(2, round(c * scale)))) for c in CRITEO_CARDINALITIES)


def _hash(values, salt):
    """A 64-bit mix of uint64 values (splitmix64 finaliser), per element."""
    with np.errstate(over="ignore"):
        x = values.astype(np.uint64) + np.uint64(salt) * _MIX
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _unit(values, salt):
    """Deterministic uniform [0, 1) per value."""
    return (_hash(values, salt) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class Generator:
    """Rows of the synthetic data set (see the module doc).

    Args:
      seed: the data set (every row depends on it).
      scale: multiplies Criteo's per-field cardinalities.
      signal: the spread of the planted per-id weights (larger: an easier task).
    """

    def __init__(self, seed=0, scale=1.0, signal=0.6):
        self.seed = int(seed)
        self.cardinalities = cardinalities(scale)
        self.signal = float(signal)
        self.dense_weights = np.linspace(-0.3, 0.3, NUM_DENSE)

    def chunk(self, index):
        """Chunk `index` (rows index*CHUNK_ROWS ...): dict of label float32 [n], dense int64
        [n, 13], categorical int64 [n, 26] (per-field ids in [0, cardinality)), logit
        float64 [n] (the planted one)."""
        rng = np.random.default_rng([self.seed, index])
        n = CHUNK_ROWS
        dense = np.floor(np.exp(rng.normal(1.0, 1.5, (n, NUM_DENSE)))).astype(np.int64)
        categorical = np.empty((n, NUM_CATEGORICAL), np.int64)
        logit = np.full(n, -1.2)
        for f, card in enumerate(self.cardinalities):
            ranks = rng.zipf(ZIPF_EXPONENT, n).astype(np.uint64) - np.uint64(1)
            # Scatter the ranks over the field's ids, so that frequent ids are not 0, 1, 2...
            ids = (_hash(ranks % np.uint64(card), 1000 + f) % np.uint64(card)).astype(np.int64)
            categorical[:, f] = ids
            # Per-(field, id) weight: a few fields matter more than others.
            strength = self.signal * (1.5 if f % 5 == 0 else 0.6)
            logit += strength * (_unit(ids, 2000 + f) - 0.5) * 2.0
        logit += (np.log1p(dense) - 1.3) @ self.dense_weights
        label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return {"label": label, "dense": dense, "categorical": categorical, "logit": logit}

    def rows(self, start, count):
        """Rows [start, start + count) as a dict like chunk()'s."""
        if start < 0 or count < 0:
            raise ValueError("start and count must be >= 0, got %d and %d" % (start, count))
        parts = []
        first, last = start // CHUNK_ROWS, (start + count - 1) // CHUNK_ROWS
        for index in range(first, last + 1) if count else ():
            chunk = self.chunk(index)
            lo = max(start - index * CHUNK_ROWS, 0)
            hi = min(start + count - index * CHUNK_ROWS, CHUNK_ROWS)
            parts.append({k: v[lo:hi] for k, v in chunk.items()})
        if not parts:
            return {
                "label": np.zeros(0, np.float32),
                "dense": np.zeros((0, NUM_DENSE), np.int64),
                "categorical": np.zeros((0, NUM_CATEGORICAL), np.int64),
                "logit": np.zeros(0),
            }
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def chunks(self, rows, start=0):
        """Yields row dicts covering rows [start, start + rows), at most CHUNK_ROWS each."""
        done = 0
        while done < rows:
            count = min(CHUNK_ROWS - (start + done) % CHUNK_ROWS, rows - done)
            yield self.rows(start + done, count)
            done += count


def features(rows, field_shift=40):
    """Model inputs from generated rows: label float32 [n], dense float32 [n, 13] =
    log1p(dense), categorical int64 [n, 26] with the field number in the high bits
    ((f + 1) << field_shift), so the fields never share keys."""
    offsets = np.arange(1, NUM_CATEGORICAL + 1, dtype=np.int64) << field_shift
    return {
        "label": rows["label"],
        "dense": np.log1p(rows["dense"]).astype(np.float32),
        "categorical": rows["categorical"] + offsets,
    }


def bayes_auc(generator, rows=CHUNK_ROWS, start=0):
    """The AUC of the planted logit itself on `rows` rows: the best a model can do."""
    data = generator.rows(start, rows)
    return auc(data["label"], data["logit"])


def write_tfrecord(path, generator, rows, start=0):
    """Writes rows as tf.train.Examples (label float, dense int64[13], categorical
    int64[26]); read them back with rec_sdk.examples.inputs.tfrecord_dataset."""
    tmp = path + ".tmp"
    with tf.io.TFRecordWriter(tmp) as writer:
        for chunk in generator.chunks(rows, start):
            for i in range(len(chunk["label"])):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "label": tf.train.Feature(
                                float_list=tf.train.FloatList(value=[chunk["label"][i]])
                            ),
                            "dense": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=chunk["dense"][i])
                            ),
                            "categorical": tf.train.Feature(
                                int64_list=tf.train.Int64List(value=chunk["categorical"][i])
                            ),
                        }
                    )
                )
                writer.write(example.SerializeToString())
    os.replace(tmp, path)
    return path


def write_tsv(path, generator, rows, start=0):
    """Writes rows in Criteo's TSV format (categorical values as 8 hex digits of a hash of
    (field, id)); read with rec_sdk.examples.inputs.criteo_tsv_dataset or
    rec_sdk.examples.data.read_criteo_tsv."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="ascii", newline="\n") as f:
        for chunk in generator.chunks(rows, start):
            hashed = np.stack(
                [
                    _hash(chunk["categorical"][:, c], 3000 + c) & np.uint64(0xFFFFFFFF)
                    for c in range(NUM_CATEGORICAL)
                ],
                axis=1,
            )
            lines = []
            for i in range(len(chunk["label"])):
                cells = ["%d" % chunk["label"][i]]
                cells += ["%d" % v for v in chunk["dense"][i]]
                cells += ["%08x" % v for v in hashed[i]]
                lines.append("\t".join(cells))
            f.write("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--out", required=True, help="a .tfrecord or .tsv file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplies Criteo's per-field cardinalities"
    )
    parser.add_argument("--start", type=int, default=0, help="first row")
    args = parser.parse_args(argv)
    generator = Generator(seed=args.seed, scale=args.scale)
    if args.out.endswith(".tsv"):
        write_tsv(args.out, generator, args.rows, args.start)
    elif args.out.endswith((".tfrecord", ".tfrecords")):
        write_tfrecord(args.out, generator, args.rows, args.start)
    else:
        parser.error("--out must end with .tsv or .tfrecord")
    print(
        "wrote %d rows to %s (the planted logit's AUC: %.3f)"
        % (args.rows, args.out, bayes_auc(generator)),
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
