// Test helper: an io_context running on a background thread, and run() which executes a
// coroutine on it and waits for its result with a deadline (a hung coroutine fails the test
// instead of hanging it). Owned by one test; run() may be called from the test thread only.
#pragma once

#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

namespace kvf::testing {

namespace asio = boost::asio;

class IoThread {
 public:
  IoThread() : work_(asio::make_work_guard(ioc_)), thread_([this] { ioc_.run(); }) {}
  ~IoThread() { stop(); }

  asio::io_context& context() { return ioc_; }
  asio::any_io_executor executor() { return ioc_.get_executor(); }

  // Runs `make()` (returning an awaitable<T>) on the io thread; throws std::runtime_error if
  // it does not finish within `timeout`.
  template <class F>
  auto run(F make, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    auto future = asio::co_spawn(ioc_, make(), asio::use_future);
    if (future.wait_for(timeout) != std::future_status::ready) {
      throw std::runtime_error("coroutine did not finish in time");
    }
    return future.get();
  }

  void stop() {
    if (!thread_.joinable()) return;
    work_.reset();
    ioc_.stop();
    thread_.join();
  }

 private:
  asio::io_context ioc_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace kvf::testing
