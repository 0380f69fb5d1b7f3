// The optimizer slots of a table's rows (table_slots.cc): which optimizer they belong to and
// their initial values (TableSlots), and an optimizer's description of them
// (TableSlotLayout, which EmbeddingTable names SlotLayout).
//
// A row's record holds num_slots() slots after its embedding (table_storage.h), each of
// slot_width() floats: dim (one per element, the default) or 1 (one per row, e.g. row-wise
// Adagrad's accumulator), as the optimizer that attached them asked.
//
// EmbeddingTable's slot operations:
//   EnsureSlots(optimizer, initial_values, width) declares the optimizer slots of the table:
//     one array per slot, initialised to initial_values[i]; width: floats per slot, 0 for
//     dim. Idempotent for the same optimizer; a different optimizer is an error (one sparse
//     optimizer per table). A table restored with slots by Import accepts the first optimizer
//     whose slot count matches. The rows are re-laid out once, under the exclusive lock.
//   UpdateRows(addresses, n, cost, update, run) calls update(i, value, slots) for every i in
//     [0, n) with addresses[i] != -1, in parallel; one update of the table at a time
//     (update_mu_), so concurrent updates are never lost. All addresses are validated before
//     any row is touched; `slots` points at the row's num_slots() slot vectors (slot_width()
//     floats each). Addresses must be unique.
//   ApplyUpdate(layout, ...) is UpdateRows for the optimizer of `layout`, attaching its slots
//     first if needed (as EnsureSlots). All or nothing: when an address is invalid or the
//     optimizer cannot train the table, nothing changes (no slots attached, no optimizer
//     bound, no row written).
//   TakeNotice() returns a notice from the last EnsureSlots (e.g. checkpoint slots of another
//     optimizer that were re-initialised) and clears it; empty when there is none.
#ifndef REC_SDK_CORE_TABLE_SLOTS_H_
#define REC_SDK_CORE_TABLE_SLOTS_H_

#include <mutex>
#include <string>
#include <vector>

namespace rec_sdk {

// An optimizer's slots: its name and the initial value of each slot.
struct TableSlotLayout {
  std::string optimizer;
  std::vector<float> initial_values;
  int width = 0;  // floats per slot: 0 for dim (per element), 1 for one per row
};

// Which optimizer a table's slots belong to. Changed only under the table's exclusive
// structure_mu_, except the notice (notice_mu). The slots' number and width are the table's
// row layout (EmbeddingTable::num_slots_, slot_width_).
struct TableSlots {
  static constexpr int kMaxSlots = 4;
  std::string optimizer;  // empty until an optimizer attaches its slots
  float initial_values[kMaxSlots] = {0, 0, 0, 0};
  bool values_known = false;  // false after an Import of slots, until EnsureSlots
  // The slots came from a checkpoint and no optimizer applied since: a different optimizer
  // may still take the table over (its slots start from their initial values).
  bool from_checkpoint = false;
  std::mutex notice_mu;
  std::string notice;  // for TakeNotice
};

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_TABLE_SLOTS_H_
