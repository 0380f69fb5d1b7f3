#include "tf_ops/core/step_header.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace rec_sdk {
namespace {

std::vector<int64_t> Row(int64_t step, int64_t phase, int64_t plan = 7, int64_t batch = 3,
                         int64_t need = 4, int64_t restart = 0) {
  std::vector<int64_t> row(kHeaderWidth, 0);
  row[kHeaderVersion] = kHeaderFormat;
  row[kHeaderStep] = step;
  row[kHeaderPhase] = phase;
  row[kHeaderRestart] = restart;
  row[kHeaderHasData] = phase == kPhaseEnded ? 0 : 1;
  row[kHeaderPlan] = plan;
  row[kHeaderBatch] = batch;
  row[kHeaderNeed] = need;
  return row;
}

Status Check(const std::vector<std::vector<int64_t>>& rows, int64_t* need) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  return CheckHeaders(flat.data(), static_cast<int>(rows.size()), need);
}

TEST(StepHeaderTest, EqualHeadersPassAndGiveTheLargestNeed) {
  int64_t need = -1;
  Status s = Check(
      {Row(5, kPhaseTrain, 7, 3, 4), Row(5, kPhaseTrain, 7, 3, 9), Row(5, kPhaseTrain, 7, 3, 0)},
      &need);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(need, 9);
}

TEST(StepHeaderTest, EachDifferenceFailsNamingTheRanksAndWhatTheyRun) {
  int64_t need;
  Status s = Check({Row(5, kPhaseTrain), Row(5, kPhaseEval, 9, 4)}, &need);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("different phases"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 0: step 5 (train"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank 1: step 5 (eval"), std::string::npos) << s.message();

  s = Check({Row(5, kPhaseTrain), Row(6, kPhaseTrain), Row(5, kPhaseTrain)}, &need);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("different steps"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("ranks 0, 2: step 5"), std::string::npos) << s.message();

  s = Check({Row(5, kPhaseTrain, 7), Row(5, kPhaseTrain, 8)}, &need);
  EXPECT_NE(s.message().find("different batches of lookups"), std::string::npos);
  s = Check({Row(5, kPhaseTrain, 7, 3), Row(5, kPhaseTrain, 7, 4)}, &need);
  EXPECT_NE(s.message().find("different batches of lookups"), std::string::npos);

  s = Check({Row(5, kPhaseTrain, 7, 3, 4, 1), Row(5, kPhaseTrain, 7, 3, 4, 2)}, &need);
  EXPECT_NE(s.message().find("different restarts"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("in restart 2"), std::string::npos) << s.message();

  std::vector<int64_t> other = Row(5, kPhaseTrain);
  other[kHeaderVersion] = kHeaderFormat + 1;
  s = Check({Row(5, kPhaseTrain), other}, &need);
  EXPECT_NE(s.message().find("rank 1 sent a step header of another rec_sdk release"),
            std::string::npos)
      << s.message();
}

TEST(StepHeaderTest, AnEndedInputStopsEveryRankAndALeftRankFailsThem) {
  int64_t need;
  Status s = Check({Row(5, kPhaseTrain), Row(5, kPhaseEnded, 0, -1, 0)}, &need);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("rank 1 ran out of input"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("ran out of input before step 5"), std::string::npos);

  s = Check({Row(5, kPhaseEval), Row(5, kPhaseLeft, 0, -1, 0), Row(5, kPhaseEval)}, &need);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("rank 1 closed its session while ranks 0, 2"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("closed its session after step 4"), std::string::npos);

  // A step header without data (the rank's input ended in that step) stops every rank, also
  // when every rank's input ended at once.
  std::vector<int64_t> empty = Row(5, kPhaseTrain);
  empty[kHeaderHasData] = 0;
  s = Check({Row(5, kPhaseTrain), empty}, &need);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("rank 1: ran out of input before step 5"), std::string::npos)
      << s.message();
  s = Check({empty, empty}, &need);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);

  // Every rank leaving (all closed, or all out of input at once) is no error.
  s = Check({Row(5, kPhaseLeft, 0, -1, 0), Row(5, kPhaseEnded, 0, -1, 0)}, &need);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(StepHeaderTest, StepsAreNumberedPerRunAndPositionsTakeTurns) {
  StepHeaders* h = StepHeaders::Get("step_header_test_turns");
  EXPECT_EQ(h->Begin(101, kPhaseTrain, 10), 1);
  EXPECT_EQ(h->Begin(101, kPhaseTrain, 11), 1);  // another batch of the same run
  EXPECT_EQ(h->Current().step, 1);
  EXPECT_EQ(h->Current().began_ms, 10);
  EXPECT_EQ(h->Current().checked_ms, 0);
  std::vector<std::string> order;
  h->WhenTurn(101, 2, [&](bool ok) { order.push_back(ok ? "2" : "2 cancelled"); });
  h->WhenTurn(101, 1, [&](bool ok) { order.push_back(ok ? "1" : "1 cancelled"); });
  h->WhenTurn(101, 0, [&](bool ok) { order.push_back(ok ? "0" : "0 cancelled"); });
  EXPECT_EQ(order, (std::vector<std::string>{"0"}));
  h->Checked(101, 0, 12);
  EXPECT_EQ(h->Current().checked_ms, 12);
  EXPECT_EQ(order, (std::vector<std::string>{"0", "1"}));
  h->Checked(101, 1, 13);
  EXPECT_EQ(order, (std::vector<std::string>{"0", "1", "2"}));

  EXPECT_EQ(h->Begin(202, kPhaseEval, 20), 2);
  h->WhenTurn(202, 1, [&](bool ok) { order.push_back(ok ? "b" : "b off"); });
  h->Checked(101, 0, 21);  // another run's check wakes nothing of this one
  EXPECT_EQ(order.size(), 3u);
  h->CancelRun(202);
  EXPECT_EQ(order.back(), "b off");
  h->WhenTurn(202, 2, [&](bool ok) { order.push_back(ok ? "c" : "c off"); });  // after it
  EXPECT_EQ(order.back(), "c off");
  h->WhenTurn(202, 0, [&](bool ok) { order.push_back(ok ? "d" : "d off"); });
  EXPECT_EQ(order.back(), "d off");
  EXPECT_EQ(order.size(), 6u);

  EXPECT_EQ(h->Leave(kPhaseEnded, 30), 3);  // the step it would have run
  EXPECT_EQ(h->Current().left, kPhaseEnded);
  EXPECT_EQ(h->Begin(303, kPhaseTrain, 31), 3);
}

TEST(StepHeaderTest, HeadersOfARunWithoutAPlanTakePositionsInTheOrderTheyBegin) {
  StepHeaders* h = StepHeaders::Get("step_header_test_unplanned");
  EXPECT_EQ(h->UnplannedPosition(7), 0);
  EXPECT_EQ(h->UnplannedPosition(7), 1);
  EXPECT_EQ(h->UnplannedPosition(8), 0);  // another run counts from 0
  EXPECT_EQ(h->UnplannedPosition(7), 2);
  std::vector<int> order;
  h->WhenTurn(7, 1, [&](bool ok) { order.push_back(ok ? 1 : -1); });
  EXPECT_TRUE(order.empty());  // the second header waits for the first one's check
  h->Checked(7, 0, 1);
  EXPECT_EQ(order, (std::vector<int>{1}));
}

TEST(StepHeaderTest, PlanDigestsDifferByOrderAndAreZeroForNoPlan) {
  int64_t ab[] = {1, 2}, ba[] = {2, 1};
  EXPECT_EQ(PlanDigest(ab, 0), 0);
  EXPECT_GT(PlanDigest(ab, 2), 0);
  EXPECT_NE(PlanDigest(ab, 2), PlanDigest(ba, 2));
  EXPECT_EQ(PlanDigest(ab, 2), PlanDigest(ab, 2));
}

}  // namespace
}  // namespace rec_sdk
