// Delivers transport completions on an Asio executor instead of the transport's progress thread:
// onExecutor(ex, fn) wraps a PutCallback / LandingCallback so that `fn` runs via asio::post on
// `ex`; asyncPut() is postPut() as an Asio async operation (e.g. co_await with use_awaitable).
// Header-only; include it only where Asio is already in use.
#pragma once

#include <memory>
#include <utility>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
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

// Posts `request` (copied) and completes with the put's StatusOr<PutResult> on the handler's
// associated executor; a request rejected up front completes with that error. If `handle_out`
// is given it receives the handle (for cancel()) before the operation completes. With
// use_awaitable, pass a named PutRequest (GCC 12: no temporaries inside co_await).
template <class CompletionToken>
auto asyncPut(TransportContext& ctx, const PutRequest& request, CompletionToken&& token,
              std::shared_ptr<PutHandle>* handle_out = nullptr) {
  using Signature = void(absl::StatusOr<PutResult>);
  return boost::asio::async_initiate<CompletionToken, Signature>(
      [&ctx, handle_out](auto handler, PutRequest req) {
        auto executor = boost::asio::get_associated_executor(handler);
        using Handler = decltype(handler);
        auto shared = std::make_shared<Handler>(std::move(handler));
        auto deliver = [executor, shared](absl::StatusOr<PutResult> result) {
          boost::asio::post(executor, [shared, result = std::move(result)]() mutable {
            (*shared)(std::move(result));
          });
        };
        auto handle = ctx.postPut(std::move(req), deliver);
        if (!handle.ok()) {
          deliver(handle.status());
        } else if (handle_out != nullptr) {
          *handle_out = *handle;
        }
      },
      token, request);
}

}  // namespace kvf::transport
