// Status helpers: the KVF_RETURN_IF_ERROR / KVF_ASSIGN_OR_RETURN macros that our Abseil
// (LTS 2022-06) lacks, plus small constructors used across modules.
// Header-only; safe from any thread.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/strings.h"

#define KVF_STATUS_CONCAT_INNER_(a, b) a##b
#define KVF_STATUS_CONCAT_(a, b) KVF_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define KVF_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::absl::Status kvf_status_ = (expr);       \
    if (!kvf_status_.ok()) return kvf_status_; \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else assigns the
// value to `lhs` (which may be a declaration: `KVF_ASSIGN_OR_RETURN(auto x, f());`).
#define KVF_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVF_ASSIGN_OR_RETURN_IMPL_(KVF_STATUS_CONCAT_(kvf_statusor_, __LINE__), lhs, rexpr)

#define KVF_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)   \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

// Coroutine variants: `co_return` instead of `return`.
#define KVF_CO_RETURN_IF_ERROR(expr)              \
  do {                                            \
    ::absl::Status kvf_status_ = (expr);          \
    if (!kvf_status_.ok()) co_return kvf_status_; \
  } while (false)

#define KVF_CO_ASSIGN_OR_RETURN(lhs, rexpr) \
  KVF_CO_ASSIGN_OR_RETURN_IMPL_(KVF_STATUS_CONCAT_(kvf_statusor_, __LINE__), lhs, rexpr)

#define KVF_CO_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr)   \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) co_return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace kvf {

// Prepends context to a non-OK status, keeping its code: "loading trace: <original>".
inline absl::Status annotate(const absl::Status& status, std::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), strCat(context, ": ", std::string(status.message())));
}

}  // namespace kvf
