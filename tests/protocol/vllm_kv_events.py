#!/usr/bin/python3
"""Independent encoder of vLLM KV-event batches, for protocol_test (python3-msgpack).

Writes batches the way vLLM's msgspec structs in vllm/distributed/kv_events.py serialize:
EventBatch(ts, events, data_parallel_rank=None) and the tagged events
BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
extra_keys=None, group_idx=None, kv_cache_spec_kind=None, kv_cache_spec_sliding_window=None),
BlockRemoved(block_hashes, medium, group_idx=None) and AllBlocksCleared(), with
omit_defaults=True. Two layouts: tagged maps (the current structs: {"type": tag, field: ...} in
declaration order, fields equal to their default left out) and array_like (older releases:
[tag, field...] with trailing defaults left out; before lora_name existed, BlockStored had 7
entries). Prints one "<name> <hex>" line per fixture; protocol_test knows what each holds.
"""
import msgpack

STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                 "kv_cache_spec_sliding_window"]
STORED_REQUIRED = 7  # fields without a default
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
REMOVED_REQUIRED = 2


def as_map(tag, fields, required, values):
    out = {"type": tag}
    for i, name in enumerate(fields):
        value = values.get(name)
        if i < required or value is not None:
            out[name] = value
    return out


def as_array(tag, fields, required, values, legacy_len=None):
    row = [values.get(name) for name in fields]
    n = len(row)
    while n > required and row[n - 1] is None:
        n -= 1
    if legacy_len is not None:
        n = legacy_len
    return [tag] + row[:n]


def stored(layout, legacy=False, **values):
    if layout == "map":
        return as_map("BlockStored", STORED_FIELDS, STORED_REQUIRED, values)
    return as_array("BlockStored", STORED_FIELDS, STORED_REQUIRED, values, 6 if legacy else None)


def removed(layout, **values):
    if layout == "map":
        return as_map("BlockRemoved", REMOVED_FIELDS, REMOVED_REQUIRED, values)
    return as_array("BlockRemoved", REMOVED_FIELDS, REMOVED_REQUIRED, values)


def cleared(layout):
    return {"type": "AllBlocksCleared"} if layout == "map" else ["AllBlocksCleared"]


def batch(layout, ts, events, rank=None):
    if layout == "map":
        out = {"ts": ts, "events": events}
        if rank is not None:
            out["data_parallel_rank"] = rank
        return out
    return [ts, events] + ([rank] if rank is not None else [])


def full_events(layout, hash_a, hash_b, parent):
    tokens = list(range(100, 116)) + [200000] * 15 + [4294967295]
    return [
        stored(layout, block_hashes=[hash_a, hash_b], parent_block_hash=parent, token_ids=tokens,
               block_size=16, lora_id=None, medium="GPU", lora_name="adapter-1",
               extra_keys=[("img-7", "salt"), None], group_idx=1,
               kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096),
        removed(layout, block_hashes=[hash_b], medium="CPU", group_idx=1),
        cleared(layout),
    ]


def minimal_events(layout, legacy=False):
    return [
        stored(layout, legacy, block_hashes=[11, 12], parent_block_hash=None,
               token_ids=[5] * 32, block_size=16, lora_id=None, medium="GPU", lora_name=None),
        removed(layout, block_hashes=[12], medium="GPU"),
        cleared(layout),
    ]


def main():
    a, b, parent = b"\x01" * 32, b"\x02" * 32, b"\x03" * 32
    fixtures = {
        # Current vLLM: tagged maps, sha256 (bytes) hashes, every field, a DP rank.
        "map_bytes_full": batch("map", 1700000000.25, full_events("map", a, b, parent), rank=2),
        # The same content with integer hashes, in both layouts (kvfabric encodes ints).
        "map_int_full": batch("map", 1700000000.25, full_events("map", 21, 22, 20), rank=2),
        "array_int_full": batch("array", 1700000000.25, full_events("array", 21, 22, 20), rank=2),
        # Current vLLM with only the fields every event has.
        "map_int_minimal": batch("map", 2.5, minimal_events("map")),
        # Releases before lora_name: 7-entry BlockStored, [ts, events].
        "array_int_legacy": batch("array", 2.5, minimal_events("array", legacy=True)),
    }
    for name, value in fixtures.items():
        print(name, msgpack.packb(value, use_bin_type=True).hex())


if __name__ == "__main__":
    main()
