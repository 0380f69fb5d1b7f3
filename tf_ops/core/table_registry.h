// TableRegistry: which tables the sessions of one process may share, and when.
//
// tf.estimator builds a new graph and session per mode, and train_and_evaluate evaluates while
// the training session is open: per-session tables would be re-read from files each time and
// held twice. A session's table op gets a ShareMode (the "share" attribute, set by
// GraphModifierHook); shareable tables that commit or restore a checkpoint are noted here by
// save id, so that a later restore of the same checkpoint can use the table in memory instead
// of the files, within these rules:
//   * the table found must be the same table: same key type and configuration (TableConfig
//     ==), and still hold the checkpoint unchanged (EmbeddingTable::HoldsCheckpoint);
//   * a reader (a graph without training lookups of the table) may use a table another
//     session is using; a trainer only one that no session uses;
//   * a shareable table that still holds its checkpoint when its last user detaches is kept
//     (one per table name) for the next session.
// Private tables (ShareMode::kPrivate, the default) never take part.
#ifndef REC_SDK_CORE_TABLE_REGISTRY_H_
#define REC_SDK_CORE_TABLE_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

// How a session's table may share storage with other sessions of the process (see above).
enum class ShareMode { kPrivate, kReader, kTrainer };

// "" (private), "reader" or "trainer" -> the mode; false for anything else.
bool ParseShareMode(const std::string& text, ShareMode* mode);

class TableRegistry {
 public:
  // The process-wide registry (never destroyed: it outlives every session).
  static TableRegistry& Process();

  // A session starts or stops using `table` (shareable sessions only). Detaching the last
  // user keeps the table for a later session if it still holds its checkpoint (replacing the
  // table kept under its name), else forgets a kept copy of it.
  void Attach(const std::shared_ptr<EmbeddingTable>& table);
  void Detach(const std::shared_ptr<EmbeddingTable>& table);

  // `table` (keys of type key_type, an opaque tag such as a TF DataType) now holds checkpoint
  // save_id (0: none, ignored).
  void Note(int64_t save_id, const std::shared_ptr<EmbeddingTable>& table, int key_type);

  // A table holding checkpoint save_id that a session of mode `share` whose table is `own`
  // may use instead of reading the files, or null (see the rules above).
  std::shared_ptr<EmbeddingTable> Find(int64_t save_id, const EmbeddingTable& own, int key_type,
                                       ShareMode share);

  // How many sessions use `table` (Attach minus Detach).
  int64_t Users(const EmbeddingTable& table);

  // What a session hands to the table it switches to (one Find returned, or a fresh one of its
  // own): its graph's admission settings. A reader's graph configures none, and the table it
  // switches to may be in use by a trainer, so a reader leaves them untouched.
  static void HandOver(const EmbeddingTable& current, EmbeddingTable* next, ShareMode share);

 private:
  struct Noted {
    std::weak_ptr<EmbeddingTable> table;
    int key_type;
  };

  std::mutex mu_;
  std::map<int64_t, Noted> noted_;                               // by save id
  std::map<const EmbeddingTable*, int64_t> users_;               // attached sessions
  std::map<std::string, std::shared_ptr<EmbeddingTable>> kept_;  // by table name
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_REGISTRY_H_
