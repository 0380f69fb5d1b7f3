// The file format of a table checkpoint: its files, their version and their checksum
// (CRC-32C). Without the table: the file layer (checkpoint_files.h) and the cold store use it
// without pulling in EmbeddingTable.
//
// A table directory holds
//   keys.bin       int64 per row
//   values.bin     dim elements of emb_dtype per row (the embedding: float32, or bfloat16 /
//                  float16 for half-precision tables, as meta.txt says)
//   slot<i>.bin    float32 x slot width per row, one file per optimizer slot (bfloat16 slots
//                  widen exactly, so any slot dtype restores into any other)
//   counts.bin     uint32 per row (admission count)
//   last_seen.bin  int64 per row (last-seen clock: data timestamp, global step or tick)
//   pending.bin    (int64 key, int64 count, int64 last_seen) per key counting towards admission
//   removed.bin    int64 per key removed since the previous save (delta checkpoints only)
//   meta.txt       "name value" lines: format version, table, dim, emb_dtype (float32 when
//                  absent), update_step (stochastic rounding's), rows, pending, optimizer,
//                  slot initial values, clocks, counters, save id and parent save id (deltas
//                  apply only onto the checkpoint they follow), and for every file its size
//                  in bytes and CRC-32C; its last line is the CRC-32C of the lines before it.
//                  Written last: a directory without it is an incomplete save.
// All numbers are little-endian (the machine's order on x86-64 and arm64).
//
#ifndef REC_SDK_CORE_CHECKPOINT_FORMAT_H_
#define REC_SDK_CORE_CHECKPOINT_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace rec_sdk {

constexpr int kCheckpointFormatVersion = 1;

// CRC-32C (Castagnoli) of data, continuing from crc (0 to start).
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_CHECKPOINT_FORMAT_H_
