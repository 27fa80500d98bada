// Test helper: a loopback TCP relay in front of a server, for fault injection between a client
// and a server that keeps running. cut() closes every relayed connection and answers new ones
// by closing them at once; restore() relays again; setUpstream() points new connections at
// another port (a replaced server). Runs on its own thread; methods are called from the test
// thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>

namespace kvf::testing {

class TcpRelay {
 public:
  explicit TcpRelay(uint16_t upstream_port)
      : upstream_port_(upstream_port),
        acceptor_(ioc_, {boost::asio::ip::make_address("127.0.0.1"), 0}),
        work_(boost::asio::make_work_guard(ioc_)) {
    accept();
    thread_ = std::thread([this] { ioc_.run(); });
  }
  ~TcpRelay() {
    boost::asio::post(ioc_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      closeAll();
    });
    work_.reset();
    ioc_.stop();
    thread_.join();
  }

  uint16_t port() const { return acceptor_.local_endpoint().port(); }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port()); }

  void cut() {
    cut_ = true;
    boost::asio::post(ioc_, [this] { closeAll(); });
  }
  void restore() { cut_ = false; }
  void setUpstream(uint16_t port) { upstream_port_ = port; }

 private:
  using tcp = boost::asio::ip::tcp;
  struct Pair {
    tcp::socket client;
    tcp::socket server;
    std::array<char, 16384> up{};
    std::array<char, 16384> down{};
    explicit Pair(boost::asio::io_context& ioc) : client(ioc), server(ioc) {}
    void close() {
      boost::system::error_code ignored;
      client.close(ignored);
      server.close(ignored);
    }
  };

  void accept() {
    auto pair = std::make_shared<Pair>(ioc_);
    acceptor_.async_accept(pair->client, [this, pair](boost::system::error_code ec) {
      if (ec) return;
      accept();
      if (cut_) {
        pair->close();
        return;
      }
      pair->server.async_connect({boost::asio::ip::make_address("127.0.0.1"), upstream_port_},
                                 [this, pair](boost::system::error_code cec) {
                                   if (cec || cut_) {
                                     pair->close();
                                     return;
                                   }
                                   pairs_.push_back(pair);
                                   pump(pair, pair->client, pair->server, pair->up);
                                   pump(pair, pair->server, pair->client, pair->down);
                                 });
    });
  }

  void pump(std::shared_ptr<Pair> pair, tcp::socket& from, tcp::socket& to,
            std::array<char, 16384>& buffer) {
    from.async_read_some(boost::asio::buffer(buffer),
                         [this, pair, &from, &to, &buffer](boost::system::error_code ec, size_t n) {
                           if (ec) {
                             pair->close();
                             return;
                           }
                           boost::asio::async_write(to, boost::asio::buffer(buffer.data(), n),
                                                    [this, pair, &from, &to, &buffer](
                                                        boost::system::error_code wec, size_t) {
                                                      if (wec) {
                                                        pair->close();
                                                        return;
                                                      }
                                                      pump(pair, from, to, buffer);
                                                    });
                         });
  }

  void closeAll() {
    for (auto& weak : pairs_) {
      if (auto pair = weak.lock()) pair->close();
    }
    pairs_.clear();
  }

  std::atomic<uint16_t> upstream_port_;
  std::atomic<bool> cut_{false};
  boost::asio::io_context ioc_;
  tcp::acceptor acceptor_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::vector<std::weak_ptr<Pair>> pairs_;  // io thread only
  std::thread thread_;
};

}  // namespace kvf::testing
