#include "tf_ops/core/step_header.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <utility>

#include "tf_ops/core/process_wide.h"

namespace rec_sdk {

namespace {

bool IsLeave(const int64_t* row) {
  return row[kHeaderPhase] == kPhaseLeft || row[kHeaderPhase] == kPhaseEnded;
}

// "rank 1" or "ranks 0, 2".
std::string Ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

std::string Describe(const int64_t* row) {
  std::ostringstream out;
  if (row[kHeaderPhase] == kPhaseLeft) {
    out << "closed its session after step " << row[kHeaderStep] - 1;
  } else if (row[kHeaderPhase] == kPhaseEnded || row[kHeaderHasData] == 0) {
    out << "ran out of input before step " << row[kHeaderStep];
  } else {
    out << "step " << row[kHeaderStep] << " (" << PhaseName(row[kHeaderPhase]) << ", plan "
        << row[kHeaderPlan] << ", batch " << row[kHeaderBatch] << ")";
  }
  if (row[kHeaderRestart] != 0) out << " in restart " << row[kHeaderRestart];
  return out.str();
}

// The ranks grouped by what they run: "rank 0: step 5 (train, ...); rank 1: ...".
std::string WhatEachRuns(const int64_t* rows, int ranks) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < ranks; ++r) {
    std::string what = Describe(rows + r * kHeaderWidth);
    auto it = std::find_if(
        groups.begin(), groups.end(),
        [&](const std::pair<std::string, std::vector<int>>& g) { return g.first == what; });
    if (it == groups.end()) {
      groups.push_back({what, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::ostringstream out;
  for (size_t i = 0; i < groups.size(); ++i) {
    out << (i ? "; " : "") << Ranks(groups[i].second) << ": " << groups[i].first;
  }
  return out.str();
}

int64_t NowAtLeastOne(int64_t now_ms) { return now_ms > 0 ? now_ms : 1; }

}  // namespace

const char* PhaseName(int64_t phase) {
  switch (phase) {
    case kPhaseTrain:
      return "train";
    case kPhaseEval:
      return "eval";
    case kPhaseLeft:
      return "left";
    case kPhaseEnded:
      return "input ended";
    default:
      return "unknown";
  }
}

int64_t PlanDigest(const int64_t* batches, int count) {
  if (count == 0) return 0;
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a over the ids' bytes
  for (int i = 0; i < count; ++i) {
    uint64_t value = static_cast<uint64_t>(batches[i]);
    for (int b = 0; b < 8; ++b) {
      hash ^= (value >> (8 * b)) & 0xff;
      hash *= 1099511628211ULL;
    }
  }
  return static_cast<int64_t>(hash >> 17);  // positive, and short enough to read in a message
}

Status CheckHeaders(const int64_t* rows, int ranks, int64_t* need) {
  *need = 0;
  std::vector<int> ended, left, running, other_format;
  for (int r = 0; r < ranks; ++r) {
    const int64_t* row = rows + r * kHeaderWidth;
    if (row[kHeaderVersion] != kHeaderFormat) other_format.push_back(r);
    if (row[kHeaderPhase] == kPhaseEnded || (!IsLeave(row) && row[kHeaderHasData] == 0)) {
      ended.push_back(r);
    }
    if (row[kHeaderPhase] == kPhaseLeft) left.push_back(r);
    if (!IsLeave(row)) running.push_back(r);
    *need = std::max(*need, row[kHeaderNeed]);
  }
  const std::string each = WhatEachRuns(rows, ranks);
  if (!other_format.empty()) {
    return Status::FailedPrecondition(
        Ranks(other_format) + " sent a step header of another rec_sdk release (every rank " +
        "must run the same rec_sdk): " + each);
  }
  if (running.empty()) return Status::Ok();  // every rank leaves (leave headers only)
  if (!ended.empty()) {
    return Status(StatusCode::kOutOfRange,
                  Ranks(ended) + " ran out of input: every rank stops at this step (the ranks " +
                      "stop together at the end of the shortest input). " + each);
  }
  if (!left.empty()) {
    return Status::FailedPrecondition(Ranks(left) + " closed its session while " + Ranks(running) +
                                      " runs another step: the ranks must run the same steps. " +
                                      each);
  }
  const int64_t* first = rows + running[0] * kHeaderWidth;
  for (int r : running) {
    const int64_t* row = rows + r * kHeaderWidth;
    for (int field : {kHeaderRestart, kHeaderStep, kHeaderPhase, kHeaderPlan, kHeaderBatch}) {
      if (row[field] != first[field]) {
        const char* what = field == kHeaderRestart ? "restarts (start every rank again together)"
                           : field == kHeaderStep  ? "steps"
                           : field == kHeaderPhase ? "phases"
                                                   : "batches of lookups or collectives (every "
                                                     "rank must build the same graph and run "
                                                     "the same fetches)";
        return Status::FailedPrecondition(std::string("the ranks run different ") + what + ": " +
                                          each);
      }
    }
  }
  return Status::Ok();
}

StepHeaders* StepHeaders::Get(const std::string& name) { return ProcessWide<StepHeaders>(name); }

StepHeaders::Run& StepHeaders::RunOf(int64_t step_id) {
  auto it = runs_.find(step_id);
  if (it != runs_.end()) return it->second;
  order_.push_back(step_id);
  while (order_.size() > 8) {  // the last runs only: a run's waiters are gone when it ends
    runs_.erase(order_.front());
    order_.pop_front();
  }
  return runs_[step_id];
}

int64_t StepHeaders::Begin(int64_t step_id, int64_t phase, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step_id != last_step_id_) {
    last_step_id_ = step_id;
    ++steps_;
    RunOf(step_id);
    activity_ = Activity();
    activity_.step = steps_;
    activity_.phase = phase;
    activity_.began_ms = NowAtLeastOne(now_ms);
  }
  return steps_;
}

void StepHeaders::WhenTurn(int64_t step_id, int position, std::function<void(bool)> turn) {
  bool ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Run& run = RunOf(step_id);
    if (run.cancelled) {
      ready = false;
    } else if (position <= 0 || position > kMaxPlanPositions || run.checked[position - 1]) {
      ready = true;
    } else {
      run.waiters.emplace(position, std::move(turn));
      return;
    }
  }
  turn(ready);
}

int StepHeaders::UnplannedPosition(int64_t step_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return RunOf(step_id).unplanned++;
}

void StepHeaders::CancelRun(int64_t step_id) {
  std::vector<std::function<void(bool)>> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Run& run = RunOf(step_id);
    run.cancelled = true;
    for (auto& w : run.waiters) cancelled.push_back(std::move(w.second));
    run.waiters.clear();
  }
  for (auto& turn : cancelled) turn(false);
}

void StepHeaders::Checked(int64_t step_id, int position, int64_t now_ms) {
  std::vector<std::function<void(bool)>> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Run& run = RunOf(step_id);
    if (position >= 0 && position < kMaxPlanPositions) run.checked[position] = true;
    if (position == 0 && step_id == last_step_id_) activity_.checked_ms = NowAtLeastOne(now_ms);
    auto range = run.waiters.equal_range(position + 1);
    for (auto w = range.first; w != range.second; ++w) ready.push_back(std::move(w->second));
    run.waiters.erase(range.first, range.second);
  }
  for (auto& turn : ready) turn(true);
}

int64_t StepHeaders::Leave(int64_t phase, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  activity_ = Activity();
  activity_.step = steps_ + 1;
  activity_.phase = phase;
  activity_.began_ms = NowAtLeastOne(now_ms);
  activity_.left = phase;
  return steps_ + 1;
}

StepHeaders::Activity StepHeaders::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  return activity_;
}

}  // namespace rec_sdk
