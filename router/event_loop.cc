#include "router/event_loop.h"

namespace kvf::router {

size_t runEventLoop(boost::asio::io_context& ioc, std::chrono::nanoseconds busy_poll,
                    const std::function<bool()>& spin_while) {
  if (busy_poll <= std::chrono::nanoseconds::zero()) return ioc.run();
  using SteadyClock = std::chrono::steady_clock;
  auto spinning = [&] { return !ioc.stopped() && (!spin_while || spin_while()); };
  size_t handled = 0;
  while (!ioc.stopped()) {
    size_t n = ioc.run_one();  // sleeps until an event arrives
    if (n == 0) break;         // stopped, or no work left
    handled += n;
    // Each poll() runs the ready handlers and checks the reactor once without waiting.
    auto deadline = SteadyClock::now() + busy_poll;
    while (spinning()) {
      n = ioc.poll();
      handled += n;
      auto now = SteadyClock::now();
      if (n > 0) {
        deadline = now + busy_poll;
      } else if (now >= deadline) {
        break;
      }
    }
  }
  return handled;
}

}  // namespace kvf::router
