#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include <fmt/format.h>

namespace kvf::metrics {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  if (!bounds_.empty() && std::isinf(bounds_.back())) bounds_.pop_back();
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
}

void Histogram::observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    out[i] = running;
  }
  return out;
}

std::vector<double> exponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::vector<double> linearBuckets(double start, double width, int count) {
  std::vector<double> out;
  for (int i = 0; i < count; ++i) out.push_back(start + width * i);
  return out;
}

std::vector<double> latencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,  0.1,  0.25,
          0.5,    1.0,     2.5,    5.0,   10.0,   20.0,  40.0, 80.0,  160.0, 600.0};
}

std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

namespace {

void appendEscaped(std::string& out, std::string_view s, bool quote_escapes) {
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote_escapes) {
      out += "\\\"";
    } else {
      out.push_back(c);
    }
  }
}

void appendLabels(std::string& out, const Labels& labels, std::string_view extra_name = {},
                  std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return;
  out.push_back('{');
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out.push_back(',');
    first = false;
    out += k;
    out += "=\"";
    appendEscaped(out, v, true);
    out.push_back('"');
  }
  if (!extra_name.empty()) {
    if (!first) out.push_back(',');
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out.push_back('"');
  }
  out.push_back('}');
}

const char* typeText(MetricType t) {
  switch (t) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

Registry::Series& Registry::seriesFor(std::string_view name, std::string_view help, MetricType type,
                                      const Labels& labels) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(std::string(name), Family{std::string(help), type, {}}).first;
  } else if (it->second.type != type) {
    std::fprintf(stderr, "metric %s registered with two types\n", std::string(name).c_str());
    std::abort();
  }
  for (auto& s : it->second.series) {
    if (s->labels == labels) return *s;
  }
  auto series = std::make_unique<Series>();
  series->labels = labels;
  it->second.series.push_back(std::move(series));
  return *it->second.series.back();
}

Counter& Registry::counter(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mu_);
  Series& s = seriesFor(name, help, MetricType::kCounter, labels);
  if (!s.counter) s.counter = std::make_unique<Counter>();
  return *s.counter;
}

Gauge& Registry::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  std::lock_guard lock(mu_);
  Series& s = seriesFor(name, help, MetricType::kGauge, labels);
  if (!s.gauge) s.gauge = std::make_unique<Gauge>();
  return *s.gauge;
}

Histogram& Registry::histogram(std::string_view name, std::string_view help,
                               std::vector<double> bounds, const Labels& labels) {
  std::lock_guard lock(mu_);
  Series& s = seriesFor(name, help, MetricType::kHistogram, labels);
  if (!s.histogram) s.histogram = std::make_unique<Histogram>(std::move(bounds));
  return *s.histogram;
}

void Registry::callback(std::string_view name, std::string_view help, MetricType type,
                        const Labels& labels, std::function<double()> read) {
  std::lock_guard lock(mu_);
  Series& s = seriesFor(name, help, type, labels);
  s.read = std::move(read);
}

std::shared_ptr<const void> Registry::retire(std::string_view key, std::string_view value) {
  auto retired = std::make_shared<std::vector<std::unique_ptr<Series>>>();
  std::lock_guard lock(mu_);
  for (auto& [name, family] : families_) {
    auto& all = family.series;
    auto keep = std::stable_partition(all.begin(), all.end(), [&](const auto& s) {
      return std::none_of(s->labels.begin(), s->labels.end(),
                          [&](const auto& l) { return l.first == key && l.second == value; });
    });
    std::move(keep, all.end(), std::back_inserter(*retired));
    all.erase(keep, all.end());
  }
  return retired;
}

std::string Registry::exposition() const {
  std::lock_guard lock(mu_);
  std::string out;
  out.reserve(4096);
  for (const auto& [name, family] : families_) {
    out += "# HELP ";
    out += name;
    out.push_back(' ');
    appendEscaped(out, family.help, false);
    out += "\n# TYPE ";
    out += name;
    out.push_back(' ');
    out += typeText(family.type);
    out.push_back('\n');
    for (const auto& s : family.series) {
      if (family.type == MetricType::kHistogram && s->histogram) {
        const Histogram& h = *s->histogram;
        auto cumulative = h.cumulativeCounts();
        for (size_t i = 0; i <= h.bounds().size(); ++i) {
          out += name;
          out += "_bucket";
          std::string le = i < h.bounds().size() ? formatValue(h.bounds()[i]) : "+Inf";
          appendLabels(out, s->labels, "le", le);
          out.push_back(' ');
          out += std::to_string(cumulative[i]);
          out.push_back('\n');
        }
        out += name;
        out += "_sum";
        appendLabels(out, s->labels);
        out.push_back(' ');
        out += formatValue(h.sum());
        out += '\n';
        out += name;
        out += "_count";
        appendLabels(out, s->labels);
        out.push_back(' ');
        out += std::to_string(cumulative.back());
        out += '\n';
        continue;
      }
      double v = 0;
      if (s->read) {
        v = s->read();
      } else if (s->counter) {
        v = s->counter->value();
      } else if (s->gauge) {
        v = s->gauge->value();
      }
      out += name;
      appendLabels(out, s->labels);
      out.push_back(' ');
      out += formatValue(v);
      out.push_back('\n');
    }
  }
  return out;
}

}  // namespace kvf::metrics
