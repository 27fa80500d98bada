#include "router/event_loop.h"

#include <gtest/gtest.h>

#include <chrono>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

namespace kvf::router {
namespace {

using namespace std::chrono_literals;

// Posts a chain of `n` handlers, each after a short timer, so events arrive both within and
// after a busy-poll window.
void chain(boost::asio::io_context& ioc, int n, std::chrono::microseconds gap, int* ran) {
  if (n == 0) return;
  auto timer = std::make_shared<boost::asio::steady_timer>(ioc, gap);
  timer->async_wait([&ioc, n, gap, ran, timer](const boost::system::error_code&) {
    ++*ran;
    chain(ioc, n - 1, gap, ran);
  });
}

TEST(EventLoopTest, RunsEveryHandlerAndReturnsWhenOutOfWork) {
  for (auto busy_poll : {0us, 50us, 5000us}) {
    boost::asio::io_context ioc(1);
    int ran = 0;
    chain(ioc, 20, 200us, &ran);  // some inside the window, some (at 50 us) after it
    int posted = 0;
    for (int i = 0; i < 10; ++i) boost::asio::post(ioc, [&posted] { ++posted; });
    size_t handled = runEventLoop(ioc, busy_poll);
    EXPECT_EQ(ran, 20) << busy_poll.count();
    EXPECT_EQ(posted, 10) << busy_poll.count();
    EXPECT_GE(handled, 30u) << busy_poll.count();
    EXPECT_TRUE(ioc.stopped());
  }
}

TEST(EventLoopTest, StopEndsTheLoopWhileSpinning) {
  boost::asio::io_context ioc(1);
  auto guard = boost::asio::make_work_guard(ioc);  // without stop() the loop would never end
  boost::asio::steady_timer timer(ioc, 1ms);
  timer.async_wait([&ioc](const boost::system::error_code&) { ioc.stop(); });
  auto start = std::chrono::steady_clock::now();
  runEventLoop(ioc, 100ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(ioc.stopped());
}

// With a predicate that says "nothing in flight", the loop blocks at once after each event
// instead of spinning; every handler still runs.
TEST(EventLoopTest, SpinsOnlyWhileThePredicateHolds) {
  boost::asio::io_context ioc(1);
  int ran = 0;
  int asked = 0;
  chain(ioc, 10, 500us, &ran);
  auto start = std::chrono::steady_clock::now();
  runEventLoop(ioc, 20s, [&asked] {
    ++asked;
    return false;
  });
  EXPECT_EQ(ran, 10);
  EXPECT_GE(asked, 9);  // asked after each event but the last (then the context ran dry)
  // Spinning would have polled for the 20 s window after the last event; 10 events of 0.5 ms
  // take milliseconds, and half the window leaves a loaded machine seconds.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

}  // namespace
}  // namespace kvf::router
