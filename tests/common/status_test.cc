#include "common/status.h"

#include <gtest/gtest.h>

namespace kvf {
namespace {

absl::Status failIf(bool fail) {
  if (fail) return absl::InvalidArgumentError("bad");
  return absl::OkStatus();
}

absl::StatusOr<int> valueOr(bool fail, int v) {
  if (fail) return absl::NotFoundError("missing");
  return v;
}

absl::Status chain(bool fail, int* steps) {
  KVF_RETURN_IF_ERROR(failIf(fail));
  ++*steps;
  return absl::OkStatus();
}

absl::StatusOr<int> sum(bool fail_a, bool fail_b) {
  KVF_ASSIGN_OR_RETURN(int a, valueOr(fail_a, 2));
  KVF_ASSIGN_OR_RETURN(int b, valueOr(fail_b, 3));
  return a + b;
}

TEST(StatusMacros, ReturnIfErrorStopsOnError) {
  int steps = 0;
  EXPECT_TRUE(chain(false, &steps).ok());
  EXPECT_EQ(steps, 1);
  absl::Status s = chain(true, &steps);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(steps, 1);
}

TEST(StatusMacros, AssignOrReturnPropagates) {
  EXPECT_EQ(*sum(false, false), 5);
  EXPECT_EQ(sum(true, false).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sum(false, true).status().code(), absl::StatusCode::kNotFound);
}

TEST(StatusMacros, AnnotateKeepsCode) {
  absl::Status s = annotate(absl::NotFoundError("x"), "loading");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "loading: x");
  EXPECT_TRUE(annotate(absl::OkStatus(), "ctx").ok());
}

}  // namespace
}  // namespace kvf
