// Checkpoint files of one table, streamed to and from disk without a second in-memory copy.
// The files and their checksums: checkpoint_format.h.
//
// SaveTableFiles writes the files (each fsync'ed) and meta.txt into a new directory and
// fsyncs it; the caller makes the save atomic by writing into a temporary directory and
// renaming it. RestoreTableFiles checks every directory's meta.txt and file sizes before it
// touches the table, then streams the rows in; a checksum mismatch found while streaming
// leaves the table empty and names the file. It can merge the directories of several ranks
// and keep only the keys of one rank (key % rank_size), so a checkpoint restores into a
// different number of ranks.
#ifndef REC_SDK_CORE_CHECKPOINT_H_
#define REC_SDK_CORE_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tf_ops/core/checkpoint_format.h"
#include "tf_ops/core/embedding_table.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {

// Writes the table into `dir`, which must not exist. *rows receives the rows written. With
// delta (tables created with track_changes), only the rows changed since the last save (full
// or delta) and the keys removed since then (removed.bin) are written. Either kind of save
// starts a new change set.
// *save_id (may be null) receives the save's id: call table->CommitSave(id) once the save is
// durable (renamed into place), which starts the next change set.
Status SaveTableFiles(EmbeddingTable* table, const std::string& dir, int64_t* rows,
                      bool delta = false, int64_t* save_id = nullptr);

// Applies a delta directory onto the table (which must hold the checkpoint the delta
// follows, with the same optimizer slots): removals, changed rows, pending keys, counters.
Status ApplyDeltaFiles(EmbeddingTable* table, const std::string& dir, int64_t* rows);

// The save id recorded in a table directory's metadata (checksum verified) and whether the
// directory is a delta.
Status ReadCheckpointId(const std::string& dir, int64_t* save_id, bool* delta);

struct RestoreOptions {
  int64_t rank_id = 0;  // keep keys with abs(key % rank_size) == rank_id
  int64_t rank_size = 1;
  bool int32_keys = false;  // the table takes int32 keys: larger keys are an error
};

// Replaces the table's contents with the rows of `dirs` that belong to the rank. *rows
// receives the rows restored; *note says what happened to optimizer slots (may be empty).
Status RestoreTableFiles(EmbeddingTable* table, const std::vector<std::string>& dirs,
                         const RestoreOptions& options, int64_t* rows, std::string* note);

// Writes a file of a serving update (a rank's part of it): n bytes to path, created or
// truncated, then the file and its directory fsync'ed.
Status WriteUpdateFile(const std::string& path, const void* data, size_t n);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_CHECKPOINT_H_
