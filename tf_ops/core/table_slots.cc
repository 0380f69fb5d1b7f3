// The optimizer slots of a table's rows: attaching an optimizer's slots (re-laying out the
// rows once) and the notices that leaves for the kernels to log.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tf_ops/core/embedding_table.h"

namespace rec_sdk {

Status EmbeddingTable::EnsureSlots(const std::string& optimizer,
                                   const std::vector<float>& initial_values, int width) {
  ChangeScope change(&changes_);
  {
    std::shared_lock<std::shared_mutex> structure(structure_mu_);
    if (SlotsReadyLocked(optimizer, initial_values, width)) return Status::Ok();
  }
  std::unique_lock<std::shared_mutex> structure(structure_mu_);
  return EnsureSlotsLocked(optimizer, initial_values, width);
}

bool EmbeddingTable::SlotsReadyLocked(const std::string& optimizer,
                                      const std::vector<float>& initial_values, int width) const {
  int resolved;
  return slots_.values_known && !slots_.from_checkpoint && slots_.optimizer == optimizer &&
         num_slots_ == static_cast<int>(initial_values.size()) &&
         ResolveSlotWidth(width, optimizer, &resolved).ok() &&
         (num_slots_ == 0 || slot_width_ == resolved) &&
         std::equal(initial_values.begin(), initial_values.end(), slots_.initial_values);
}

Status EmbeddingTable::ResolveSlotWidth(int requested, const std::string& what, int* width) const {
  *width = requested == 0 ? config_.dim : requested;
  if (*width == config_.dim || *width == 1) return Status::Ok();
  return Status::InvalidArgument(what + " on table '" + config_.name + "': slots of " +
                                 std::to_string(*width) + " floats; a slot holds dim (" +
                                 std::to_string(config_.dim) + ") floats or 1 per row");
}

Status EmbeddingTable::EnsureSlotsLocked(const std::string& optimizer,
                                         const std::vector<float>& initial_values, int width) {
  const int wanted = static_cast<int>(initial_values.size());
  if (wanted > kMaxSlots) {
    return Status::InvalidArgument("optimizer '" + optimizer + "' asks for " +
                                   std::to_string(wanted) + " slots; at most " +
                                   std::to_string(kMaxSlots) + " are supported");
  }
  REC_SDK_RETURN_IF_ERROR(ResolveSlotWidth(width, "optimizer '" + optimizer + "'", &width));
  const bool same_width = wanted == 0 || num_slots_ == 0 || slot_width_ == width;
  if (slots_.values_known && slots_.from_checkpoint) {
    slots_.from_checkpoint = false;
    if (slots_.optimizer == optimizer && num_slots_ == wanted && same_width) {
      // Restored slots of this optimizer: new rows start from this instance's values.
      for (int s = 0; s < wanted; ++s) slots_.initial_values[s] = initial_values[s];
      return Status::Ok();
    }
    // The checkpoint was trained by another optimizer: its slots cannot serve this one.
    std::lock_guard<std::mutex> lock(alloc_mu_);
    REC_SDK_RETURN_IF_ERROR(RelayoutLocked(wanted, width, initial_values.data()));
    if (tier_.store != nullptr) {
      REC_SDK_RETURN_IF_ERROR(
          tier_.RelayoutColdLocked(wanted, width, initial_values.data(), /*reset_slots=*/true));
    }
    for (int64_t row = 0; row < next_row_; ++row) {
      char* record = RecordOf(row);
      for (int s = 0; s < wanted; ++s) {
        FillSlot(record, s, initial_values[s]);
      }
    }
    {
      std::lock_guard<std::mutex> notice_lock(slots_.notice_mu);
      slots_.notice = "table '" + config_.name + "': the checkpoint's slots of optimizer '" +
                      slots_.optimizer + "' were dropped; optimizer '" + optimizer +
                      "' starts its " + std::to_string(wanted) +
                      " slot(s) from their initial values";
    }
    for (int s = 0; s < wanted; ++s) slots_.initial_values[s] = initial_values[s];
    slots_.optimizer = optimizer;
    return Status::Ok();
  }
  if (slots_.values_known) {
    if (slots_.optimizer == optimizer && num_slots_ == wanted && same_width) {
      for (int s = 0; s < wanted; ++s) {
        if (slots_.initial_values[s] != initial_values[s]) {
          return Status::FailedPrecondition(
              "table '" + config_.name + "': optimizer '" + optimizer + "' slot " +
              std::to_string(s) + " starts at " + std::to_string(slots_.initial_values[s]) +
              " for this table; another instance asks for " + std::to_string(initial_values[s]));
        }
      }
      return Status::Ok();
    }
    return Status::FailedPrecondition(
        "table '" + config_.name + "' is already trained by sparse optimizer '" + slots_.optimizer +
        "'; it cannot also be trained by '" + optimizer + "' (one sparse optimizer per table)");
  }
  std::lock_guard<std::mutex> lock(alloc_mu_);
  if (num_slots_ > 0 && (num_slots_ != wanted || slot_width_ != width)) {
    return Status::FailedPrecondition(
        "table '" + config_.name + "' was imported with " + std::to_string(num_slots_) +
        " optimizer slots of " + std::to_string(slot_width_) + " floats but optimizer '" +
        optimizer + "' uses " + std::to_string(wanted) + " of " + std::to_string(width));
  }
  const int first_new = num_slots_;
  // Give every row handed out so far its slots; later rows get them in InitializeRowLocked.
  if (wanted > num_slots_) {
    REC_SDK_RETURN_IF_ERROR(RelayoutLocked(wanted, width, initial_values.data()));
  }
  for (int s = 0; s < wanted; ++s) slots_.initial_values[s] = initial_values[s];
  // Rows added after an Import of slots but before this call got no slot values of their own.
  for (int64_t row = 0; first_new > 0 && row < next_row_; ++row) {
    RowMeta& meta = MetaOf(row);
    if (!meta.slots_unset) continue;
    meta.slots_unset = 0;
    char* record = RecordOf(row);
    for (int s = 0; s < first_new; ++s) {
      FillSlot(record, s, initial_values[s]);
    }
  }
  slots_.optimizer = optimizer;
  slots_.values_known = true;
  slots_.from_checkpoint = false;
  return Status::Ok();
}

std::string EmbeddingTable::TakeNotice() {
  std::lock_guard<std::mutex> lock(slots_.notice_mu);
  std::string notice;
  notice.swap(slots_.notice);
  return notice;
}

}  // namespace rec_sdk
