// Metrics owned by the component that updates them, exported in Prometheus text format.
// A component asks its Registry for a Counter / Gauge / Histogram once (at construction) and
// keeps the reference; the Registry owns the objects for its own lifetime. Updates are lock-free
// atomics callable from any thread; registration and exposition take the registry's mutex.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvf::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double delta = 1.0) { value_.fetch_add(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double delta = 1.0) { value_.fetch_add(delta, std::memory_order_relaxed); }
  void dec(double delta = 1.0) { value_.fetch_sub(delta, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Fixed-bucket histogram; bucket bounds are upper bounds (le), sorted ascending, +Inf implied.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);

  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound, then the +Inf count last.
  std::vector<uint64_t> cumulativeCounts() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, non-cumulative
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// `count` buckets: start, start*factor, ...
std::vector<double> exponentialBuckets(double start, double factor, int count);
// `count` buckets: start, start+width, ...
std::vector<double> linearBuckets(double start, double width, int count);
// Latency buckets in seconds from 100 us to 600 s.
std::vector<double> latencyBuckets();

enum class MetricType { kCounter, kGauge, kHistogram };

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Returns the metric for (name, labels), creating it on first use. A name must keep one type
  // and help text; asking for it with another type aborts (a programming error).
  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help, std::vector<double> bounds,
                       const Labels& labels = {});
  // A gauge (or counter) whose value is computed at scrape time. The callback runs on the
  // scraping thread under the registry mutex; it must be cheap and thread-safe.
  void callback(std::string_view name, std::string_view help, MetricType type, const Labels& labels,
                std::function<double()> read);

  // Removes every series carrying the label `key`="value" (e.g. an instance that left) from
  // the exposition. The removed metric objects stay alive as long as the returned handle, so
  // that whoever still holds a pointer to one (a request in flight) may keep updating it.
  std::shared_ptr<const void> retire(std::string_view key, std::string_view value);

  // Prometheus text exposition format 0.0.4.
  std::string exposition() const;

 private:
  struct Series {
    Labels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
    std::function<double()> read;
  };
  struct Family {
    std::string help;
    MetricType type;
    std::vector<std::unique_ptr<Series>> series;
  };
  Series& seriesFor(std::string_view name, std::string_view help, MetricType type,
                    const Labels& labels);

  mutable std::mutex mu_;
  std::map<std::string, Family, std::less<>> families_;
};

// Content-Type for the exposition format.
inline constexpr std::string_view kExpositionContentType = "text/plain; version=0.0.4";

// Formats a sample value as Prometheus expects (+Inf, -Inf, NaN, shortest round-trip).
std::string formatValue(double v);

}  // namespace kvf::metrics
