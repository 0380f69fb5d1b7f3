// Reading a table directory of a checkpoint (private to the core library): its files
// checked against meta.txt (OpenSource), then its rows streamed in batches by a reader thread
// while the caller inserts the previous batch (StreamSource). checkpoint.cc restores and
// applies deltas through it.
#ifndef REC_SDK_TF_OPS_CORE_CHECKPOINT_SOURCE_H_
#define REC_SDK_TF_OPS_CORE_CHECKPOINT_SOURCE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tf_ops/core/checkpoint_files.h"
#include "tf_ops/core/embedding_table.h"
#include "tf_ops/core/status.h"

namespace rec_sdk {
namespace checkpoint_source {

using checkpoint_files::FileInfo;
using checkpoint_files::Meta;
using checkpoint_files::Reader;

// One table directory, checked and ready to stream.
struct Source {
  std::string dir;
  Meta meta;
  EmbeddingTable::CheckpointInfo info;
  bool delta = false;
  bool cleared = false;
  int64_t removed = 0;
  std::vector<FileInfo> files;  // keys, values, slots..., counts, last_seen, pending
};

// Rows read from a table directory, in batches handed from a reader thread to the inserter.
struct Batch {
  int64_t size = 0;
  std::vector<int64_t> keys, last_seen;
  std::vector<uint32_t> counts;
  std::vector<char> stored;  // the values as the file holds them, when not float32
  std::vector<float> values;
  std::vector<std::vector<float>> slots;
};

// Opens and checks the table directory `dir` of a table of `dim` floats per row.
Status OpenSource(const std::string& dir, int dim, Source* src);

// DataLoss naming the file when the CRC-32C read by `r` is not the one `f` lists.
Status CheckCrc(const Reader& r, const FileInfo& f);

// Streams the rows of a checked source: a reader thread fills batches (file reads and
// checksums) while this thread hands the previous batch to insert(). After the rows,
// *pending holds the source's pending keys. A corrupted file is reported in preference to
// the insert error it may have caused.
Status StreamSource(const Source& src, int64_t dim, int num_slots,
                    const std::function<Status(const Batch&)>& insert,
                    std::vector<std::array<int64_t, 3>>* pending);

}  // namespace checkpoint_source
}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_CHECKPOINT_SOURCE_H_
