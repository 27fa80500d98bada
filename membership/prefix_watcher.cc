#include "membership/prefix_watcher.h"

#include <algorithm>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/strings.h"

namespace kvf::membership {
namespace {

asio::awaitable<void> pause(boost::asio::steady_timer& timer, std::chrono::milliseconds d) {
  timer.expires_after(d);
  co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
}

}  // namespace

std::shared_ptr<PrefixWatcher> PrefixWatcher::create(asio::any_io_executor executor,
                                                     std::shared_ptr<EtcdClient> etcd,
                                                     WatcherOptions options,
                                                     WatcherCallbacks callbacks,
                                                     const Clock& clock) {
  return std::shared_ptr<PrefixWatcher>(new PrefixWatcher(
      std::move(executor), std::move(etcd), std::move(options), std::move(callbacks), clock));
}

PrefixWatcher::PrefixWatcher(asio::any_io_executor executor, std::shared_ptr<EtcdClient> etcd,
                             WatcherOptions options, WatcherCallbacks callbacks, const Clock& clock)
    : etcd_(std::move(etcd)),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      clock_(clock),
      range_end_(prefixRangeEnd(options_.prefix)),
      watch_timer_(executor),
      probe_timer_(executor) {}

void PrefixWatcher::start() {
  auto executor = watch_timer_.get_executor();
  asio::co_spawn(
      executor, [self = shared_from_this()] { return self->watchLoop(); }, asio::detached);
  asio::co_spawn(
      executor, [self = shared_from_this()] { return self->probeLoop(); }, asio::detached);
}

void PrefixWatcher::stop() {
  stopped_ = true;
  up_ = false;
  watch_timer_.cancel();
  probe_timer_.cancel();
  if (stream_ != nullptr) stream_->cancel();
}

void PrefixWatcher::contact() { last_contact_ = clock_.now(); }

void PrefixWatcher::down(std::string_view what, const absl::Status& status) {
  if (up_) {
    log::warn("etcd unreachable; keeping the last membership", "what", what, "endpoint",
              etcd_->endpoint(), "error", std::string(status.message()));
  } else {
    failure_log_.warn("etcd still unreachable", "what", what, "endpoint", etcd_->endpoint(),
                      "error", std::string(status.message()));
  }
  up_ = false;
}

void PrefixWatcher::restartFromList(std::string_view why) {
  log::warn("etcd watch starts over from a list", "prefix", options_.prefix, "reason", why,
            "revision", revision_);
  need_list_ = true;
  if (stream_ != nullptr) stream_->cancel();
}

asio::awaitable<absl::Status> PrefixWatcher::list() {
  std::map<std::string, std::string> fresh;
  std::string from = options_.prefix;
  int64_t at = 0;  // every page at the first page's revision
  ResponseHeader header;
  for (;;) {
    auto page = co_await etcd_->range(from, range_end_, options_.page_size, at);
    if (stopped_) co_return absl::CancelledError("stopped");
    if (!page.ok()) co_return page.status();
    if (at == 0) {
      at = page->header.revision;
      header = page->header;
    }
    for (KeyValue& kv : page->kvs) fresh[kv.key] = std::move(kv.value);
    if (fresh.size() > options_.max_keys) {
      co_return absl::ResourceExhaustedError(
          strCat("more than ", options_.max_keys, " keys under ", options_.prefix));
    }
    if (!page->more || page->kvs.empty()) break;
    from = page->kvs.back().key + '\0';
  }
  // Report the difference to what the owner knows.
  for (auto it = members_.begin(); it != members_.end();) {
    if (fresh.contains(it->first)) {
      ++it;
      continue;
    }
    std::string key = it->first;
    it = members_.erase(it);
    callbacks_.on_delete(key);
  }
  for (auto& [key, value] : fresh) {
    auto known = members_.find(key);
    if (known != members_.end() && known->second == value) continue;
    members_[key] = value;
    callbacks_.on_put(key, value);
  }
  revision_ = at;
  cluster_id_ = header.cluster_id;
  ++lists_;
  contact();
  log::info("etcd prefix listed", "prefix", options_.prefix, "keys", members_.size(), "revision",
            at, "endpoint", etcd_->endpoint());
  co_return absl::OkStatus();
}

void PrefixWatcher::apply(const WatchEvent& event) {
  const std::string& key = event.kv.key;
  if (event.type == EventType::kPut) {
    auto known = members_.find(key);
    if (known == members_.end() && members_.size() >= options_.max_keys) {
      failure_log_.warn("etcd prefix holds too many keys; ignoring a new one", "key", key,
                        "max_keys", options_.max_keys);
    } else if (known == members_.end() || known->second != event.kv.value) {
      members_[key] = event.kv.value;
      callbacks_.on_put(key, event.kv.value);
    }
  } else if (members_.erase(key) > 0) {
    callbacks_.on_delete(key);
  }
  revision_ = std::max(revision_, event.kv.mod_revision);
}

asio::awaitable<void> PrefixWatcher::follow(WatchStream& stream) {
  for (;;) {
    auto message = co_await stream.next();
    if (stopped_) co_return;
    if (!message.ok()) {
      if (absl::IsInvalidArgument(message.status()) ||
          absl::IsResourceExhausted(message.status())) {
        // A message we could not read may have carried events: only a list is safe now.
        restartFromList(std::string(message.status().message()));
      } else if (!need_list_) {
        down("watch", message.status());
      }
      co_return;
    }
    contact();
    if (message->canceled) {
      restartFromList(message->compact_revision > 0
                          ? strCat("revision compacted up to ", message->compact_revision)
                          : strCat("watch canceled: ", message->cancel_reason));
      co_return;
    }
    if (message->created) {
      if (!up_) {
        log::info("etcd watch established", "prefix", options_.prefix, "from", revision_ + 1,
                  "endpoint", stream.endpoint());
      }
      up_ = true;
      continue;
    }
    if (message->events.empty()) {
      // A progress notification: every change up to its revision has been delivered.
      revision_ = std::max(revision_, message->header.revision);
      continue;
    }
    for (const WatchEvent& event : message->events) {
      apply(event);
      if (stopped_) co_return;
    }
  }
}

asio::awaitable<void> PrefixWatcher::watchLoop() {
  auto self = shared_from_this();
  auto backoff = options_.retry_min;
  auto wait = [&]() -> asio::awaitable<void> {
    co_await pause(watch_timer_, backoff);
    backoff = std::min(backoff * 2, options_.retry_max);
  };
  while (!stopped_) {
    if (need_list_) {
      absl::Status s = co_await list();
      if (stopped_) break;
      if (!s.ok()) {
        down("list", s);
        co_await wait();
        continue;
      }
      need_list_ = false;
    }
    auto stream = co_await etcd_->watch(options_.prefix, range_end_, revision_ + 1,
                                        options_.watch_idle_timeout);
    if (stopped_) break;
    if (!stream.ok()) {
      down("watch", stream.status());
      co_await wait();
      continue;
    }
    backoff = options_.retry_min;
    stream_ = stream->get();
    watching_ = true;
    co_await follow(**stream);
    watching_ = false;
    stream_ = nullptr;
    if (stopped_) break;
    ++watch_restarts_;
    if (!need_list_) co_await wait();  // etcd may be restarting: do not spin on it
  }
}

asio::awaitable<void> PrefixWatcher::probeLoop() {
  auto self = shared_from_this();
  while (!stopped_) {
    co_await pause(probe_timer_, options_.probe_interval);
    if (stopped_) break;
    // The prefix itself as a key: a range that returns nothing, answered by any live member.
    auto probe = co_await etcd_->range(options_.prefix, "", 1, 0);
    if (stopped_) break;
    if (!probe.ok()) {
      down("probe", probe.status());
      // The watch's connection may be half-open; make it reconnect once etcd answers again.
      if (stream_ != nullptr) stream_->cancel();
      continue;
    }
    contact();
    const ResponseHeader& h = probe->header;
    if (cluster_id_ != 0 && h.cluster_id != cluster_id_) {
      restartFromList(strCat("etcd cluster changed from ", cluster_id_, " to ", h.cluster_id));
    } else if (h.revision < revision_) {
      restartFromList(strCat("etcd revision went back from ", revision_, " to ", h.revision));
    } else if (watching_ && !up_) {
      up_ = true;
    }
  }
}

}  // namespace kvf::membership
