"""TFRA's key and value files of a de.Variable (save_to_file_system, load_from_file_system):
each shard's keys and rows in files of its own (see rec_sdk.tables.table_files)."""

import tensorflow as tf

from rec_sdk.ops import table_ops
from rec_sdk.tables import shard_names, table_files


class KeyValueFiles:
    """The key and value file methods of de.Variable (a base class of it: they use its
    shards, `_shards`, and its protocol)."""

    def _file_names(self, file_name_list, proc_size, proc_rank):
        """Each shard's file name: <table>_mht_<i>of<n>_rank<r>_size<s> (TFRA's), or the
        given list."""
        if file_name_list is not None:
            if len(file_name_list) != self.shard_num:
                raise ValueError(
                    "file_name_list must name %d files (one per shard), got %r"
                    % (self.shard_num, file_name_list)
                )
            return list(file_name_list)
        return [
            shard_names.shard_file_name(t.table_name, proc_rank, proc_size) for t in self._shards
        ]

    def save_to_file_system(
        self,
        dirpath,
        proc_size=1,
        proc_rank=0,
        file_name_list=None,
        dirpath_env=table_files.DIRPATH_ENV,
        append_to_file=False,
        buffer_size=4194304,
        name=None,
    ):
        """Op writing each shard's keys and rows to key and value files in dirpath (see
        SparseEmbedding.save_to_file_system; no slots). proc_size / proc_rank name the files
        of one process of several."""
        del buffer_size
        self._no_string_keys("save_to_file_system")
        with tf.name_scope(name or "%s_save_to_file_system" % self.name.split("/")[-1]):
            return tf.group(
                [
                    t.save_to_file_system(dirpath, f, dirpath_env, append_to_file)
                    for t, f in zip(
                        self._shards, self._file_names(file_name_list, proc_size, proc_rank)
                    )
                ]
            )

    def load_from_file_system(
        self,
        dirpath,
        proc_size=1,
        proc_rank=0,
        file_name_list=None,
        dirpath_env=table_files.DIRPATH_ENV,
        load_entire_dir=False,
        buffer_size=4194304,
        name=None,
    ):
        """Op upserting what save_to_file_system wrote: each shard its own files, or with
        load_entire_dir every file of dirpath, routed to the shards by the partitioner (so
        files of another shard count load too)."""
        del buffer_size
        if load_entire_dir:
            return self._load_files(dirpath, dirpath_env, "", 1, 0, name)
        self._no_string_keys("load_from_file_system")
        with tf.name_scope(name or "%s_load_from_file_system" % self.name.split("/")[-1]):
            self.note_writes()
            return tf.group(
                [
                    t.load_from_file_system(dirpath, f, dirpath_env)
                    for t, f in zip(
                        self._shards, self._file_names(file_name_list, proc_size, proc_rank)
                    )
                ]
            )

    def load_from_file_system_with_restore_function(
        self,
        dirpath,
        proc_size=1,
        proc_rank=0,
        buffer_size=4194304,
        name=None,
        dirpath_env=table_files.DIRPATH_ENV,
    ):
        """Op upserting the rows of every file this variable's tables saved in dirpath (any
        shard count, any process count: `<base>_mht_*`), routed to the shards by the
        partitioner; with proc_size > 1 only the keys of process proc_rank
        (partitioner(key, proc_size) == proc_rank), as TFRA's."""
        del buffer_size
        return self._load_files(
            dirpath, dirpath_env, self._file_prefix(), proc_size, proc_rank, name
        )

    def saved_files(self, dirpath, dirpath_env=table_files.DIRPATH_ENV):
        """The files this variable's tables saved in dirpath (their paths without suffix)."""
        return table_files.saved_bases(
            table_files.directory(dirpath, dirpath_env), self._file_prefix()
        )

    def _file_prefix(self):
        return shard_names.variable_shard_prefix(
            shard_names.parse_variable_shard(self._shards[0].table_name)[0]
        )

    def _load_files(self, dirpath, dirpath_env, prefix, proc_size, proc_rank, name):
        self._no_string_keys("load_from_file_system_with_restore_function")
        self.note_writes()
        with tf.name_scope(name or "%s_load_from_file_system" % self.name.split("/")[-1]):
            keys, rows = table_files.load_tensors(
                table_files.directory(dirpath, dirpath_env),
                None,
                self.table_key_dtype,
                self.stored_dim,
                entire_dir=True,
                prefix=prefix,
            )
            if proc_size > 1:
                mine = tf.equal(tf.cast(self.partition_fn(keys, proc_size), tf.int32), proc_rank)
                keys, rows = tf.boolean_mask(keys, mine), tf.boolean_mask(rows, mine)
            parts, shard_keys, _ = self.split_keys(keys)
            return tf.group(
                [
                    table_ops.upsert(t.handle, k, r)
                    for t, k, r in zip(self._shards, shard_keys, self.by_shard(parts, rows))
                ]
            )
