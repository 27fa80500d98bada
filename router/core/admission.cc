#include "router/core/admission.h"

#include <algorithm>

#include "common/strings.h"

namespace kvf::router {

std::string_view shedReasonName(ShedReason r) {
  switch (r) {
    case ShedReason::kQueueFull:
      return "queue_full";
    case ShedReason::kSessionShare:
      return "session_share";
    case ShedReason::kWaitTimeout:
      return "wait_timeout";
  }
  return "unknown";
}

void OverloadStats::recordWait(Nanos wait) {
  const double s = nanosToSeconds(wait);
  size_t b = 0;
  while (b < kWaitBuckets.size() && s > kWaitBuckets[b]) ++b;
  ++wait_buckets[b];
  wait_sum_s += s;
  ++wait_count;
}

std::string OverloadStats::prometheusText(int64_t depth) const {
  std::string out;
  auto metric = [&](std::string_view name, std::string_view type, std::string_view help, double v) {
    out +=
        strCat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", v, "\n");
  };
  metric("kvfabric_router_queue_depth", "gauge", "Requests waiting in the router's queue",
         static_cast<double>(depth));
  metric("kvfabric_router_queue_max_depth", "gauge", "Most requests ever waiting at once",
         static_cast<double>(max_depth));
  metric("kvfabric_router_admitted_total", "counter",
         "Requests sent to an instance without waiting (overload control on)",
         static_cast<double>(admitted_at_once));
  metric("kvfabric_router_queued_total", "counter", "Requests that waited in the queue",
         static_cast<double>(queued));
  metric("kvfabric_router_queue_dispatched_total", "counter",
         "Requests that left the queue for an instance", static_cast<double>(dispatched));
  metric("kvfabric_router_queue_cancelled_total", "counter",
         "Requests whose client left while they waited", static_cast<double>(cancelled));
  out +=
      "# HELP kvfabric_router_shed_total Requests answered 429 by overload control\n"
      "# TYPE kvfabric_router_shed_total counter\n";
  for (int r = 0; r < kShedReasons; ++r) {
    out +=
        strCat("kvfabric_router_shed_total{reason=\"", shedReasonName(static_cast<ShedReason>(r)),
               "\"} ", shed[static_cast<size_t>(r)], "\n");
  }
  constexpr std::string_view kWait = "kvfabric_router_queue_wait_seconds";
  out += strCat("# HELP ", kWait, " Time requests waited in the router's queue\n# TYPE ", kWait,
                " histogram\n");
  uint64_t cumulative = 0;
  for (size_t b = 0; b < wait_buckets.size(); ++b) {
    cumulative += wait_buckets[b];
    std::string le = b < kWaitBuckets.size() ? strCat(kWaitBuckets[b]) : std::string("+Inf");
    out += strCat(kWait, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  out += strCat(kWait, "_sum ", wait_sum_s, "\n", kWait, "_count ", wait_count, "\n");
  return out;
}

std::optional<ShedReason> AdmissionQueue::push(uint64_t ticket, std::string_view session,
                                               int64_t cost, Nanos now) {
  if (size_ >= config_.max_queue) return ShedReason::kQueueFull;
  // A request without a session is a session of its own; the leading NUL keeps its key apart
  // from every client-sent session id.
  std::string key =
      session.empty() ? strCat(std::string_view("\0", 1), ticket) : std::string(session);
  SessionQueue& q = sessions_[key];
  if (static_cast<int64_t>(q.entries.size()) >= config_.max_per_session) {
    if (q.entries.empty()) sessions_.erase(key);
    return ShedReason::kSessionShare;
  }
  if (q.entries.empty()) active_.push_back(key);
  const int64_t quantum = std::max<int64_t>(1, config_.quantum_tokens);
  q.entries.push_back(Entry{ticket, std::clamp<int64_t>(cost, 0, quantum * kMaxRounds), now});
  session_of_[ticket] = std::move(key);
  ++size_;
  return std::nullopt;
}

std::optional<AdmissionQueue::Popped> AdmissionQueue::pop() {
  if (size_ == 0) return std::nullopt;
  const int64_t quantum = std::max<int64_t>(1, config_.quantum_tokens);
  // Each visit without enough deficit moves the session to the back; a cost is at most
  // kMaxRounds quanta, so this ends within kMaxRounds + 1 passes over the active sessions.
  for (;;) {
    std::string key = active_.front();
    SessionQueue& q = sessions_[key];
    if (!q.credited) {
      q.deficit += quantum;
      q.credited = true;
    }
    const Entry head = q.entries.front();
    if (head.cost <= q.deficit) {
      q.deficit -= head.cost;
      q.entries.pop_front();
      session_of_.erase(head.ticket);
      --size_;
      if (q.entries.empty()) {
        active_.pop_front();
        sessions_.erase(key);
      }
      return Popped{head.ticket, head.queued_at};
    }
    q.credited = false;
    active_.pop_front();
    active_.push_back(std::move(key));
  }
}

std::optional<Nanos> AdmissionQueue::remove(uint64_t ticket) {
  auto it = session_of_.find(ticket);
  if (it == session_of_.end()) return std::nullopt;
  std::string key = std::move(it->second);
  session_of_.erase(it);
  SessionQueue& q = sessions_[key];
  auto e = std::find_if(q.entries.begin(), q.entries.end(),
                        [&](const Entry& x) { return x.ticket == ticket; });
  Nanos queued_at = e->queued_at;
  q.entries.erase(e);
  --size_;
  dropIfEmpty(key);
  return queued_at;
}

void AdmissionQueue::dropIfEmpty(const std::string& key) {
  auto it = sessions_.find(key);
  if (it == sessions_.end() || !it->second.entries.empty()) return;
  sessions_.erase(it);
  active_.erase(std::find(active_.begin(), active_.end(), key));
}

}  // namespace kvf::router
