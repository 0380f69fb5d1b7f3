// The step header of synchronous ranks: the first collective of every step that exchanges
// rows over ranks gathers one header per rank (its step number, phase, restart id, whether it
// still has data, the step's plan and the batch's need). Every rank checks the gathered
// headers the same way (CheckHeaders), so a mismatch fails every rank's step at once, before
// any other collective of the step started (a collective that fails or is cancelled cannot
// be reused in its process). The headers of all graphs share one collective instance key per
// position in a step's plan, so ranks in different steps, phases or graphs meet at it and
// see the difference instead of waiting for each other forever.
//
// StepHeaders is a process's record of its steps: their numbers (one per run that ran a
// header), the order of a step's batches (the header at position p starts once position
// p - 1 was checked) and what it is doing (Status, read by the peers' watchdogs).
#ifndef REC_SDK_TF_OPS_CORE_STEP_HEADER_H_
#define REC_SDK_TF_OPS_CORE_STEP_HEADER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tf_ops/core/status.h"

namespace rec_sdk {

// A header's fields (int64 each), in order.
enum HeaderField : int {
  kHeaderVersion = 0,  // kHeaderFormat: a process of another rec_sdk release differs here
  kHeaderStep,         // the step's number in its process (1, 2, ...)
  kHeaderPhase,        // a Phase
  kHeaderRestart,      // the restart id of the process (rec_sdk.distribute.launch)
  kHeaderHasData,      // 0 when the rank's input ended (kPhaseEnded)
  kHeaderPlan,         // a digest of the step's plan: the batches it exchanges, in order
  kHeaderBatch,        // the batch of this header (-1: a leave header)
  kHeaderNeed,         // the batch's largest count of keys for one rank
  kHeaderWidth,
};

constexpr int64_t kHeaderFormat = 1;
// Positions in a step's plan (collective instance keys kFirstHeaderKey + position).
constexpr int kMaxPlanPositions = 64;
constexpr int32_t kFirstHeaderKey = 1;

enum Phase : int64_t {
  kPhaseUnknown = 0,
  kPhaseTrain = 1,  // a step whose batches include training lookups
  kPhaseEval = 2,   // a step of evaluation lookups only
  kPhaseLeft = 3,   // a leave header: the rank closed its session
  kPhaseEnded = 4,  // a leave header: the rank's input ended
};

const char* PhaseName(int64_t phase);

// The check every rank runs on the gathered headers (`rows`: ranks x kHeaderWidth, in rank
// order). OK with *need set to the largest kHeaderNeed; OutOfRange when a rank's input
// ended (every rank stops at this step); FailedPrecondition naming the ranks and what
// differs when a rank left or the ranks run different steps, phases, plans or restarts.
Status CheckHeaders(const int64_t* rows, int ranks, int64_t* need);

// The digest of a plan (its batch ids in order); 0 for an empty plan.
int64_t PlanDigest(const int64_t* batches, int count);

class StepHeaders {
 public:
  // What a process's steps are doing, for its peers' watchdogs (times in ms since the epoch).
  struct Activity {
    int64_t step = 0;  // the last step whose header this process began
    int64_t phase = kPhaseUnknown;
    int64_t began_ms = 0;    // when that header began (0: none yet)
    int64_t checked_ms = 0;  // when it was checked (0: not yet; it waits for its peers)
    int64_t left = 0;        // the Phase of the leave header it sent, or 0
  };

  // The process-wide record named `name` (made on first use, never freed).
  static StepHeaders* Get(const std::string& name);

  // The step number of the run `step_id`: the next number when its first header begins.
  int64_t Begin(int64_t step_id, int64_t phase, int64_t now_ms);
  // Calls turn(true) once position `position` of run `step_id` may start its header: at once
  // for position 0, else once position - 1 of that run was checked; turn(false) when the run
  // was cancelled (CancelRun), before or while it waits.
  void WhenTurn(int64_t step_id, int position, std::function<void(bool)> turn);
  // The run `step_id` failed or was cancelled: its waiters get turn(false), now and later.
  void CancelRun(int64_t step_id);
  // The position of the next header of run `step_id` when the run was given no plan (a
  // callable made from the session, a fetch the plan could not follow): 0, 1, ... in the
  // order its headers begin, so that each has its own collective instance key. Ranks whose
  // headers begin in different orders meet another batch's header and fail its check.
  int UnplannedPosition(int64_t step_id);
  // Position `position` of run `step_id` passed its check.
  void Checked(int64_t step_id, int position, int64_t now_ms);
  // A leave header of `phase` (kPhaseLeft, kPhaseEnded): the step number it carries.
  int64_t Leave(int64_t phase, int64_t now_ms);
  Activity Current();

 private:
  struct Run {
    std::vector<bool> checked = std::vector<bool>(kMaxPlanPositions, false);
    bool cancelled = false;
    int unplanned = 0;                                      // headers begun without a plan
    std::multimap<int, std::function<void(bool)>> waiters;  // by position
  };
  Run& RunOf(int64_t step_id);  // under mu_
  std::mutex mu_;
  int64_t last_step_id_ = -1;
  int64_t steps_ = 0;
  std::map<int64_t, Run> runs_;  // the last few runs, by step id
  std::deque<int64_t> order_;    // their step ids, oldest first
  Activity activity_;
};

}  // namespace rec_sdk

#endif  // REC_SDK_TF_OPS_CORE_STEP_HEADER_H_
