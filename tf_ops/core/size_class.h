// Size classes of the all-to-all exchanges of tables sharded over ranks, and the class a
// batch of lookups sends its keys in, agreed by every rank without a message of its own.
//
// TensorFlow fixes the shape of a collective instance at its first run, so an exchange whose
// size changes from step to step picks, at run time, one instance per size class. Class i
// holds (4 + i % 4) << (i / 4) rows: 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ... (at most 25%
// padding between classes).
//
// A batch's keys go out in the class its SizeHint holds. Every part carries the sender's
// need, so after the exchange every rank knows every rank's need and calls Observe with the
// same largest one: the hints of all ranks stay equal, step after step, with no exchange of
// their own. When the need outgrew the hint, the step resends in the need's class.
#ifndef REC_SDK_TF_OPS_CORE_SIZE_CLASS_H_
#define REC_SDK_TF_OPS_CORE_SIZE_CLASS_H_

#include <cstdint>
#include <mutex>
#include <string>

namespace rec_sdk {

// Classes 0 .. kSizeClasses - 1; the largest holds 7 << 28 rows (1,879,048,192).
constexpr int kSizeClasses = 116;

// The rows of class `index` (0 <= index < kSizeClasses).
int64_t SizeClassRows(int index);

// The smallest class holding `rows` rows (rows <= 4: class 0), or -1 when `rows` is negative
// or more than the largest class holds.
int SizeClassOf(int64_t rows);

class SizeHint {
 public:
  // Shrinking waits for this many steps in a row whose need is at most half the hint.
  static constexpr int kShrinkAfter = 16;

  // The process-wide hint named `name` (made on first use at class 0, never freed).
  static SizeHint* Get(const std::string& name);

  int Current();
  // Records a step's largest need (rows): the hint grows at once to one class above the
  // need's class (headroom for the next steps), and shrinks to that after kShrinkAfter steps
  // in a row that needed at most half of it. Returns the need's class, or -1 (hint
  // unchanged) when SizeClassOf(need) is -1.
  int Observe(int64_t need);

 private:
  std::mutex mu_;
  int current_ = 0;
  int low_steps_ = 0;
};

}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_SIZE_CLASS_H_
