// The router's io thread loop: io_context::run(), optionally with a short busy-poll window
// (poll the reactor without sleeping for up to `busy_poll` after the last handled event before
// blocking) to save the wake-up latency of events that follow closely (an engine's response
// after the request went out). Threading: call from the one thread that runs `ioc`.
#pragma once

#include <chrono>
#include <functional>

#include <boost/asio/io_context.hpp>

namespace kvf::router {

// Runs `ioc` until it is stopped or out of work, like ioc.run(). With busy_poll > 0, after
// each handled event it keeps polling (non-blocking) until `busy_poll` passes with no event,
// then blocks in run_one(); when `spin_while` is given, it polls only while that returns true
// (e.g. while a request awaits its upstream) and blocks at once otherwise. Returns the number
// of handlers run.
size_t runEventLoop(boost::asio::io_context& ioc, std::chrono::nanoseconds busy_poll,
                    const std::function<bool()>& spin_while = {});

}  // namespace kvf::router
