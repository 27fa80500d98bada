// Prometheus export of a TransportContext's counters (kvfabric_transport_*), read at scrape time
// from its atomics. The context must outlive every scrape of `registry` (register it in the
// component that owns both). Safe from any thread.
#pragma once

#include "common/metrics.h"
#include "transport/transport.h"

namespace kvf::transport {

void exportMetrics(const TransportContext& ctx, metrics::Registry& registry,
                   const metrics::Labels& labels = {});

}  // namespace kvf::transport
