#include "tf_ops/core/table_registry.h"

namespace rec_sdk {

bool ParseShareMode(const std::string& text, ShareMode* mode) {
  if (text.empty()) {
    *mode = ShareMode::kPrivate;
  } else if (text == "reader") {
    *mode = ShareMode::kReader;
  } else if (text == "trainer") {
    *mode = ShareMode::kTrainer;
  } else {
    return false;
  }
  return true;
}

TableRegistry& TableRegistry::Process() {
  static auto* registry = new TableRegistry;
  return *registry;
}

void TableRegistry::Attach(const std::shared_ptr<EmbeddingTable>& table) {
  std::lock_guard<std::mutex> lock(mu_);
  ++users_[table.get()];
}

void TableRegistry::Detach(const std::shared_ptr<EmbeddingTable>& table) {
  std::lock_guard<std::mutex> lock(mu_);
  auto user = users_.find(table.get());
  if (user == users_.end()) return;
  if (--user->second > 0) return;
  users_.erase(user);
  auto kept = kept_.find(table->name());
  if (table->HoldsCheckpoint(table->checkpoint_id())) {
    kept_[table->name()] = table;
  } else if (kept != kept_.end() && kept->second == table) {
    kept_.erase(kept);
  }
}

void TableRegistry::Note(int64_t save_id, const std::shared_ptr<EmbeddingTable>& table,
                         int key_type) {
  if (save_id == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = noted_.begin(); it != noted_.end();) {
    it = it->second.table.expired() ? noted_.erase(it) : std::next(it);
  }
  noted_[save_id] = Noted{table, key_type};
}

std::shared_ptr<EmbeddingTable> TableRegistry::Find(int64_t save_id, const EmbeddingTable& own,
                                                    int key_type, ShareMode share) {
  if (share == ShareMode::kPrivate) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = noted_.find(save_id);
  if (it == noted_.end() || it->second.key_type != key_type) return nullptr;
  std::shared_ptr<EmbeddingTable> found = it->second.table.lock();
  if (found == nullptr || found.get() == &own || !found->HoldsCheckpoint(save_id) ||
      found->config() != own.config()) {
    return nullptr;
  }
  if (share == ShareMode::kTrainer) {
    auto user = users_.find(found.get());
    if (user != users_.end() && user->second > 0) return nullptr;
  }
  return found;
}

int64_t TableRegistry::Users(const EmbeddingTable& table) {
  std::lock_guard<std::mutex> lock(mu_);
  auto user = users_.find(&table);
  return user == users_.end() ? 0 : user->second;
}

void TableRegistry::HandOver(const EmbeddingTable& current, EmbeddingTable* next, ShareMode share) {
  if (share == ShareMode::kReader || next == &current) return;
  next->ResetAdmission();
  if (current.admission_configured()) {
    // The same thresholds were valid on `current`, so they are valid here.
    (void)next->ConfigureAdmission(current.admission());
  }
}

}  // namespace rec_sdk
