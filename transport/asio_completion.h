// Delivers transport completions on an Asio executor instead of the transport's progress thread:
// onExecutor(ex, fn) wraps a PutCallback / LandingCallback so that `fn` runs via asio::post on
// `ex`. Header-only; include it only where Asio is already in use.
#pragma once

#include <memory>
#include <utility>

#include <boost/asio/post.hpp>

#include "transport/transport.h"

namespace kvf::transport {

// Returns a callback that forwards its single argument to `fn` on `executor`.
template <class Executor, class Fn>
auto onExecutor(Executor executor, Fn fn) {
  auto shared = std::make_shared<Fn>(std::move(fn));
  return [executor, shared](auto value) {
    boost::asio::post(
        executor, [shared, value = std::move(value)]() mutable { (*shared)(std::move(value)); });
  };
}

}  // namespace kvf::transport
