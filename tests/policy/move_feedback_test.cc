// The move-cost feedback loop: converges on a biased link, waits for its minimum sample count,
// falls back from link to source, stays within its bounds, ignores bad samples, and forgets a
// reused slot.
#include "policy/move_feedback.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvf::policy {
namespace {

TEST(MoveFeedbackTest, ConvergesOnABiasedLinkAfterMinSamples) {
  MoveFeedbackConfig config;
  config.min_samples = 5;
  MoveFeedback f(config);
  // Link 1 -> 2 takes 3x what the model predicts, with +-20% noise.
  const double noise[] = {1.2, 0.8, 1.1, 0.9, 1.0, 1.15, 0.85, 1.05, 0.95, 1.0};
  for (int i = 0; i < 4; ++i) f.record(1, 2, 0.1, 0.3 * noise[i]);
  EXPECT_EQ(f.factor(1, 2), 1.0);  // not enough samples yet
  for (int i = 0; i < 40; ++i) f.record(1, 2, 0.1, 0.3 * noise[i % 10]);
  EXPECT_NEAR(f.factor(1, 2), 3.0, 0.3);
  EXPECT_EQ(f.linkSamples(1, 2), 44);
  // Predicted x factor tracks the measured cost within 1.2x.
  EXPECT_LT(std::abs(std::log(0.1 * f.factor(1, 2) / 0.3)), std::log(1.2));
  // Another link from the same source borrows the source's estimate; other sources do not.
  EXPECT_NEAR(f.factor(1, 5), 3.0, 0.3);
  EXPECT_EQ(f.factor(4, 2), 1.0);
}

TEST(MoveFeedbackTest, TracksAChangeInTheLink) {
  MoveFeedback f;
  for (int i = 0; i < 30; ++i) f.record(0, 1, 1.0, 2.0);
  EXPECT_NEAR(f.factor(0, 1), 2.0, 0.01);
  for (int i = 0; i < 30; ++i) f.record(0, 1, 1.0, 1.0);  // the link recovered
  EXPECT_NEAR(f.factor(0, 1), 1.0, 0.05);
}

TEST(MoveFeedbackTest, IsBoundedAndIgnoresBadSamples) {
  MoveFeedbackConfig config;
  config.min_samples = 1;
  config.max_factor = 4;
  MoveFeedback f(config);
  f.record(0, 1, 0.001, 100.0);  // 100,000x: clamped
  EXPECT_NEAR(f.factor(0, 1), 4.0, 1e-9);
  f.record(2, 3, 0.0, 1.0);
  f.record(2, 3, 1.0, -1.0);
  f.record(2, 3, NAN, 1.0);
  f.record(-1, 3, 1.0, 1.0);
  f.record(2, kMaxInstances, 1.0, 1.0);
  EXPECT_EQ(f.linkSamples(2, 3), 0);
  EXPECT_EQ(f.factor(2, 3), 1.0);
  EXPECT_EQ(f.factor(-1, 3), 1.0);
}

TEST(MoveFeedbackTest, ForgetsAReusedSlot) {
  MoveFeedbackConfig config;
  config.min_samples = 1;
  MoveFeedback f(config);
  f.record(3, 4, 1.0, 2.0);
  f.record(4, 3, 1.0, 2.0);
  f.forget(3);
  EXPECT_EQ(f.factor(3, 4), 1.0);
  EXPECT_EQ(f.linkSamples(4, 3), 0);
  EXPECT_EQ(f.sourceSamples(3), 0);
  EXPECT_NEAR(f.factor(4, 5), 2.0, 1e-9);  // 4's own pushes are still known
}

}  // namespace
}  // namespace kvf::policy
