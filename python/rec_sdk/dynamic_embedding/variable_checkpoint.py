"""How a de.Variable saves its shards in tf.train.Checkpoint and SavedModel: as one set of
tensors whatever the number of shards (keys, rows, which rows have slots and those slots, the
restrict policies' statistics), so that a checkpoint restores into any number of shards; the
tables are the SavedModel's resources."""

import copy

import tensorflow as tf

from rec_sdk.ops import table_ops


class VariableCheckpoint:
    """The TensorFlow trackable methods of de.Variable (a base class of it: they use its
    shards, `_shards`, its string keys `key_strings` and its protocol)."""

    def _serialize_to_tensors(self):
        """Every shard's keys and rows ("keys", "values"), which rows have optimizer slots
        ("has_slots": a shard the optimizer never trained has none) and those slots
        ("slots" [num_slots, rows with slots, dim], or 1 float per row of a row-wise
        optimizer's instead of dim), and every key's access statistics
        ("access_keys", "last_seen", "counts"): one set of tensors whatever the number of
        shards, so that a checkpoint restores into any number of shards."""
        exports = [
            table_ops.export(t.handle, self.table_key_dtype, self.stored_dim) for t in self._shards
        ]
        num_slots = tf.reduce_max(tf.stack([tf.shape(s)[0] for _, _, s in exports]))
        full_shards = [tf.equal(tf.shape(s)[0], num_slots) for _, _, s in exports]
        # Floats per slot of the trained shards (dim, or 1 for a row-wise optimizer).
        width = tf.reduce_max(
            tf.stack(
                [tf.where(full, tf.shape(s)[2], 0) for full, (_, _, s) in zip(full_shards, exports)]
            )
        )
        has_slots, slots = [], []
        for full, (keys, _, shard_slots) in zip(full_shards, exports):
            has_slots.append(tf.fill(tf.shape(keys), full))
            slots.append(
                tf.cond(
                    full, lambda s=shard_slots: s, lambda: tf.zeros(tf.stack([num_slots, 0, width]))
                )
            )
        access = [table_ops.export_access(t.handle) for t in self._shards]
        keys = tf.concat([k for k, _, _ in exports], 0)
        strings = (
            {} if self.key_strings is None else {"key_strings": self.key_strings.strings(keys)}
        )  # the string of each key
        return {
            "keys": keys,
            **strings,
            "values": tf.concat([v for _, v, _ in exports], 0),
            "has_slots": tf.concat(has_slots, 0),
            "slots": tf.concat(slots, 1),
            # Restrict policies' statistics, by key (int64).
            "access_keys": tf.concat([k for k, _, _ in access], 0),
            "last_seen": tf.concat([s for _, s, _ in access], 0),
            "counts": tf.concat([c for _, _, c in access], 0),
        }

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        """The tables and the lookups' shadow variables, for SavedModels (their functions
        capture them); checkpoints hold the variable's own tensors only, so that they restore
        into any number of shards."""
        del kwargs
        if save_type == "savedmodel":
            shadows = {
                "shadow_" + name: shadow
                for name, shadow in self._trainable_store.items()
                if isinstance(shadow, tf.Variable)
            }
            return {**self._resources(), **shadows}
        return {}

    def _resources(self):
        """{name: resource} of the tables (and the string-key dictionary)."""
        found = {"table_%d" % i: t for i, t in enumerate(self._shards)}
        if self.key_strings is not None:
            found["key_strings"] = self.key_strings.table
        return found

    def _deserialization_dependencies(self, children):
        """The tables come first (a SavedModel maps them before the variable)."""
        del children
        return self._resources()

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        """For a SavedModel: a copy of the variable on the exported graph's copies of its
        tables, whose save and restore functions are traced there."""
        del tensor_map, options, kwargs
        exported = copy.copy(self)
        exported._shards = [object_map.get(t, t) for t in self._shards]
        if self.key_strings is not None:
            exported.key_strings = copy.copy(self.key_strings)
            exported.key_strings.table = object_map.get(
                self.key_strings.table, self.key_strings.table
            )
        object_map[self] = exported
        return []

    def _restore_from_tensors(self, restored_tensors):
        """Replaces the shards' contents with a checkpoint's, each key routed to its shard by
        the partitioner (any saved number of shards): rows with slots are imported with
        them, the others upserted after (their slots start from the optimizer's initial
        values when it next trains them)."""
        # Ranks are unknown where a SavedModel traces this function.
        keys = tf.reshape(restored_tensors["keys"], [-1])
        rows = tf.reshape(restored_tensors["values"], [-1, self.stored_dim])
        has_slots = tf.reshape(restored_tensors["has_slots"], [-1])
        all_slots = restored_tensors["slots"]
        all_slots = tf.reshape(
            all_slots, tf.stack([tf.shape(all_slots)[0], -1, tf.shape(all_slots)[-1]])
        )
        slot_index = tf.cumsum(tf.cast(has_slots, tf.int32)) - 1  # row -> its slots' column
        parts, shard_keys, _ = self.split_keys(keys)
        ops = []
        for table, k, r, h, i in zip(
            self._shards,
            shard_keys,
            self.by_shard(parts, rows),
            self.by_shard(parts, has_slots),
            self.by_shard(parts, slot_index),
        ):
            slots = tf.gather(all_slots, tf.boolean_mask(i, h), axis=1)
            imported = table_ops.import_rows(
                table.handle, tf.boolean_mask(k, h), tf.boolean_mask(r, h), slots
            )
            with tf.control_dependencies([imported]):
                rest = tf.logical_not(h)
                ops.append(
                    table_ops.upsert(
                        table.handle, tf.boolean_mask(k, rest), tf.boolean_mask(r, rest)
                    )
                )
        access_keys = tf.reshape(restored_tensors["access_keys"], [-1])
        access_parts, access_keys_of, _ = self.split_keys(
            tf.cast(access_keys, self.table_key_dtype)
        )
        if self.key_strings is not None:
            ops.append(self.key_strings.record(restored_tensors["key_strings"], keys))
        with tf.control_dependencies(ops):  # the statistics of the rows just restored
            return tf.group(
                [
                    table_ops.import_access(t.handle, tf.cast(k, tf.int64), s, c)
                    for t, k, s, c in zip(
                        self._shards,
                        access_keys_of,
                        self.by_shard(
                            access_parts, tf.reshape(restored_tensors["last_seen"], [-1])
                        ),
                        self.by_shard(access_parts, tf.reshape(restored_tensors["counts"], [-1])),
                    )
                ]
            )
