"""FeatureSpec: one sparse feature of the input batch and the table it is looked up in.

Mirrors mx_rec.core.asc.feature_spec.FeatureSpec. A spec names where the feature's ids sit in
the batch (`index_key`), which table they are looked up in (`table_name`), and the table's
feature admission and eviction thresholds. A spec with `is_timestamp=True` names instead the
batch's per-sample timestamp feature, used for eviction.
"""

import itertools
import numbers
import threading

from rec_sdk.base.validation import INT32_MAX, check_bool, check_int, check_threshold

MAX_TUPLE_INDEX = 255

# Every FeatureSpec of the process gets a distinct name: the given one plus "_<n>" from this
# counter, as in the SDK, so that specs of one feature (several lookups of it, or the training
# and evaluation pipelines) never collide.
_ids = itertools.count(1)
_ids_lock = threading.Lock()


def check_thresholds(access_threshold, eviction_threshold, where):
    """Validates an (access_threshold, eviction_threshold) pair as the SDK does: each None or
    an int in [-1, 2**31-1]; an eviction threshold needs an access threshold."""
    if access_threshold is not None:
        check_threshold("%s access_threshold" % where, access_threshold)
    if eviction_threshold is not None:
        check_threshold("%s eviction_threshold" % where, eviction_threshold)
        if access_threshold is None:
            raise ValueError(
                "%s: eviction_threshold=%d needs an access_threshold too (use -1 "
                "for eviction without admission)" % (where, eviction_threshold)
            )
    return access_threshold, eviction_threshold


class FeatureSpec:
    """A sparse feature of the batch.

    Args:
      name: the feature's name (a non-empty string). The spec's `name` attribute is made
        unique with a counter, as in the SDK ("user_ids" -> "user_ids_3"), so several specs
        of one feature may look it up (the SDK's multi-lookup mode).
      table_name: the table its ids are looked up in (default: name).
      index_key: where the ids are in the batch: a dict key (str) or, for tuple batches, a
        position (int in [0, 255]) (default: name, as given).
      access_threshold: feature admission: -1 or None turns it off; n >= 0 gives a key a row
        once it was seen n times in training (0 admits every key). In [-1, 2**31-1].
      eviction_threshold: eviction: keys not seen for this many seconds of data time (the
        timestamp feature) are evicted when an EvictHook fires. In [-1, 2**31-1]; needs
        access_threshold.
      is_timestamp: True makes this spec the per-sample timestamp feature (int seconds,
        shape [batch] or [batch, 1]) of the table `table_name`, or of every table of the
        pipeline when no table has that name. It is never looked up.
      batch_size: accepted for the SDK's API (batch shapes come from the dataset).
      faae_coefficient: each occurrence of a key in this feature adds this much (an int >= 1)
        to the key's admission count.
    """

    def __init__(
        self,
        name,
        table_name=None,
        index_key=None,
        access_threshold=None,
        eviction_threshold=None,
        is_timestamp=None,
        batch_size=None,
        faae_coefficient=1,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError("FeatureSpec name must be a non-empty string, got %r" % (name,))
        where = "FeatureSpec %r:" % name
        if table_name is None:
            table_name = name
        if not isinstance(table_name, str) or not table_name:
            raise ValueError(
                "%s table_name must be a non-empty string, got %r" % (where, table_name)
            )
        if index_key is None:
            index_key = name
        if isinstance(index_key, bool) or not isinstance(index_key, (str, numbers.Integral)):
            raise TypeError(
                "%s index_key must be a batch dict key (str) or a tuple index "
                "(int in [0, %d]), got %r" % (where, MAX_TUPLE_INDEX, index_key)
            )
        if isinstance(index_key, numbers.Integral):
            index_key = check_int("%s index_key" % where, index_key, 0, MAX_TUPLE_INDEX)
        elif not index_key:
            raise ValueError("%s index_key must not be empty" % where)
        check_thresholds(access_threshold, eviction_threshold, where)
        if is_timestamp is not None:
            check_bool("%s is_timestamp" % where, is_timestamp)
        if batch_size is not None:
            check_int("%s batch_size" % where, batch_size, 1, INT32_MAX)
        faae_coefficient = check_int("%s faae_coefficient" % where, faae_coefficient, 1, INT32_MAX)
        with _ids_lock:
            self.name = "%s_%d" % (name, next(_ids))
        self.table_name = table_name
        self.index_key = index_key
        self.access_threshold = access_threshold
        self.eviction_threshold = eviction_threshold
        self.is_timestamp = bool(is_timestamp)
        self.batch_size = batch_size
        self.faae_coefficient = faae_coefficient

    @property
    def admission(self):
        """True when this spec turns feature admission on."""
        return self.access_threshold is not None and self.access_threshold >= 0

    def __repr__(self):
        return (
            "FeatureSpec(name=%r, table_name=%r, index_key=%r, access_threshold=%r, "
            "eviction_threshold=%r, is_timestamp=%r, faae_coefficient=%r)"
            % (
                self.name,
                self.table_name,
                self.index_key,
                self.access_threshold,
                self.eviction_threshold,
                self.is_timestamp,
                self.faae_coefficient,
            )
        )
