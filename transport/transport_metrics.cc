#include "transport/transport_metrics.h"

namespace kvf::transport {

void exportMetrics(const TransportContext& ctx, metrics::Registry& registry,
                   const metrics::Labels& labels) {
  using metrics::MetricType;
  const TransportContext* c = &ctx;
  auto counter = [&](const char* name, const char* help, auto field) {
    registry.callback(name, help, MetricType::kCounter, labels,
                      [c, field] { return static_cast<double>(c->stats().*field); });
  };
  counter("kvfabric_transport_puts_ok_total", "Batched puts completed", &TransportStats::puts_ok);
  counter("kvfabric_transport_puts_failed_total", "Batched puts failed, cancelled or timed out",
          &TransportStats::puts_failed);
  counter("kvfabric_transport_put_bytes_total", "Bytes of completed puts",
          &TransportStats::bytes_put);
  counter("kvfabric_transport_gets_ok_total", "Batched one-sided reads completed",
          &TransportStats::gets_ok);
  counter("kvfabric_transport_gets_failed_total", "Batched reads failed, cancelled or timed out",
          &TransportStats::gets_failed);
  counter("kvfabric_transport_get_bytes_total", "Bytes of completed reads",
          &TransportStats::bytes_got);
  counter("kvfabric_transport_landings_ok_total", "Landings verified complete",
          &TransportStats::landings_ok);
  counter("kvfabric_transport_landings_failed_total", "Landings failed or timed out",
          &TransportStats::landings_failed);
  counter("kvfabric_transport_checksum_mismatches_total",
          "Landed or read blocks whose xxh3 differed", &TransportStats::checksum_mismatches);
  counter("kvfabric_transport_peer_failures_total", "Peers found dead (endpoint error or exit)",
          &TransportStats::peer_failures);
  counter("kvfabric_transport_endpoints_created_total", "UCX endpoints created",
          &TransportStats::endpoints_created);
  counter("kvfabric_transport_puts_refused_total",
          "Puts refused before any UCX call (malformed remote key, range outside its region)",
          &TransportStats::puts_refused);
  counter("kvfabric_transport_notices_refused_total",
          "Completion notices naming no outstanding landing, or malformed",
          &TransportStats::notices_refused);
  counter("kvfabric_transport_gets_refused_total",
          "Gets refused before any UCX call (malformed remote key, range outside its region)",
          &TransportStats::gets_refused);
  registry.callback("kvfabric_transport_endpoints_cached", "UCX endpoints in the cache",
                    MetricType::kGauge, labels,
                    [c] { return static_cast<double>(c->stats().endpoints_cached); });
}

}  // namespace kvf::transport
