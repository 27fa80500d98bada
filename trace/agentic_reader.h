// Reader for the agentic-coding conversation directory (kv-cache-tester format): one JSON file
// per conversation, 64-token blocks, hash ids local to a file, sub-agent conversations nested in
// their parent. Each conversation and each nested sub-agent becomes its own session; the
// conversations are placed on one time axis by ConversationArrivals. Single-threaded.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trace/reader.h"

namespace kvf::trace {

// Hash ids of file k (0-based, in file-name order) become ((k + 1) << 40) | local_id, so ids
// never collide across conversations and sub-agents of one file keep sharing theirs. Local ids
// must be below 2^40. The directory is listed on open; next() merges the conversations in
// arrival order, parsing each file only when the merge reaches its start, so memory holds the
// conversations in progress, never the whole directory. A bad file is reported when reached.
absl::StatusOr<std::unique_ptr<RequestReader>> openAgenticDirectory(const std::string& dir,
                                                                    const ReaderOptions& options);

}  // namespace kvf::trace
