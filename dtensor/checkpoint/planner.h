// dtensor/checkpoint/planner.h
//
// What a distributed checkpoint saves and where it is (torch.distributed.checkpoint's
// metadata.py, planner.py, default_planner.py, _dedup_save_plans.py, resharding.py), without
// any I/O or collectives, so that each piece can be tested alone:
//
//   - ChunkMeta: a box of a global tensor (offsets, sizes).
//   - WriteItem / SavePlan: what one rank offers to write (one item per local chunk or object).
//   - create_global_save_plan: the coordinator's step. It checks that the ranks agree on each
//     key (kind, dtype, global size), gives each chunk that several ranks hold (replicated
//     data) to the least-loaded of them, and validates every tensor: chunks in bounds, no two
//     overlapping, every element covered. Errors name the keys and ranks.
//   - Metadata: the checkpoint's table of contents (format version, save id, one Entry per key
//     with its stored chunks: file, byte range, a CRC-32 per checksum block). It is the JSON
//     file `.metadata` (see the README's "On-disk format").
//   - chunk_overlap: the box two chunks share (how load finds the byte ranges to read).
#pragma once

#include "dtensor/checkpoint/crc32.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor {
namespace checkpoint {

// The on-disk format's version (Metadata::version). Readers reject other versions.
constexpr int kFormatVersion = 1;
// The format's name, the first field of every metadata file.
constexpr const char* kFormatName = "dtensor-cpp-dcp";
// Default checksum block: every stored chunk is checksummed in blocks of this many bytes.
constexpr int64_t kDefaultChecksumBlockBytes = int64_t(1) << 20;
// The largest checksum block readers accept (1 TiB): larger ones are not from save.
constexpr int64_t kMaxChecksumBlockBytes = int64_t(1) << 40;

// A box of a tensor: element offsets and sizes per dim (a 0-dim tensor: both empty).
struct ChunkMeta {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
  int64_t numel() const;
  bool operator==(const ChunkMeta& o) const { return offsets == o.offsets && sizes == o.sizes; }
  bool operator<(const ChunkMeta& o) const {
    return offsets != o.offsets ? offsets < o.offsets : sizes < o.sizes;
  }
  std::string to_string() const;  // "offsets=[0, 2] sizes=[4, 2]"
};

// The box that `a` and `b` (chunks of the same tensor) share; nullopt when they do not overlap
// or the shared box is empty.
std::optional<ChunkMeta> chunk_overlap(const ChunkMeta& a, const ChunkMeta& b);

// Our dtype names ("float32", "bfloat16", "int64", "bool", "complex64", ...).
std::string dtype_name(at::ScalarType t);
// Throws "unknown dtype '<name>'".
at::ScalarType dtype_from_name(const std::string& name);
int64_t element_size(const std::string& dtype);

enum class ItemKind { Tensor, Object };

// One thing a rank offers to write: a chunk of a tensor, or a whole non-tensor object.
struct WriteItem {
  std::string fqn;
  ItemKind kind = ItemKind::Tensor;
  std::string dtype;                 // tensors
  std::vector<int64_t> global_size;  // tensors
  ChunkMeta chunk;                   // tensors: the chunk's box in the global tensor
  int64_t nbytes = 0;                // estimate for load balancing (objects: 0)
};

struct SavePlan {
  std::vector<WriteItem> items;
};

// The coordinator's step (PyTorch: create_default_global_save_plan + dedup_save_plans): one
// plan per rank in, one plan per rank out. Items that several ranks offer (the same key and
// box; the same object key) are kept once, on the rank with the fewest bytes assigned so far
// (ties: the lowest rank); items are processed largest first. Throws, naming keys and ranks,
// when ranks disagree on a key's kind, dtype or global size, or a tensor's chunks are out of
// bounds, overlap, or do not cover it.
std::vector<SavePlan> create_global_save_plan(const std::vector<SavePlan>& local_plans);

// ---- Metadata (the `.metadata` file) ---------------------------------------------------

// Where one chunk (or object) is stored.
struct StoredChunk {
  ChunkMeta chunk;   // objects: empty
  std::string file;  // relative to the checkpoint directory
  int64_t offset = 0;
  int64_t length = 0;
  // CRC-32 (IEEE) of each checksum block of the chunk's bytes: block i covers bytes
  // [i * block, min((i + 1) * block, length)).
  std::vector<uint32_t> crc32;
  // PyTorch's DCP format: the byte range of the torch.save stream that holds a tensor chunk's
  // bytes ([offset, offset + length) lies inside it); -1 otherwise. Not part of the JSON.
  int64_t stream_offset = -1;
  int64_t stream_length = 0;
};

struct Entry {
  ItemKind kind = ItemKind::Tensor;
  std::string dtype;              // tensors
  std::vector<int64_t> size;      // tensors: global size
  std::vector<StoredChunk> chunks;  // objects: exactly one
};

struct Metadata {
  int version = kFormatVersion;
  int64_t save_id = 0;
  int world_size = 1;
  int64_t checksum_block_bytes = kDefaultChecksumBlockBytes;
  std::map<std::string, Entry> entries;
  // false: the stored chunks have no checksums (their crc32 lists are empty): a checkpoint
  // PyTorch's DCP wrote. Not part of the JSON: our format always has them.
  bool checksummed = true;

  // The data files the entries refer to, sorted.
  std::vector<std::string> files() const;
  // Stored bytes (tensor and object data).
  int64_t total_bytes() const;
};

// Throws, naming the key, when an entry's chunks are out of bounds, overlap or leave
// elements uncovered, a chunk's length or (when checksummed) checksum count does not match its box, its byte
// range overflows, or its file is not a plain file name (no '/', not "." or ".."). The sizes
// and ranges may come from a file: nothing in here overflows.
void validate_metadata(const Metadata& metadata);

void to_json(nlohmann::json& j, const ChunkMeta& c);
void from_json(const nlohmann::json& j, ChunkMeta& c);
void to_json(nlohmann::json& j, const WriteItem& w);
void from_json(const nlohmann::json& j, WriteItem& w);
void to_json(nlohmann::json& j, const SavePlan& p);
void from_json(const nlohmann::json& j, SavePlan& p);
void to_json(nlohmann::json& j, const StoredChunk& c);
void from_json(const nlohmann::json& j, StoredChunk& c);
void to_json(nlohmann::json& j, const Entry& e);
void from_json(const nlohmann::json& j, Entry& e);
// from_json checks the format name and version ("... format version 2, this build reads 1").
void to_json(nlohmann::json& j, const Metadata& m);
void from_json(const nlohmann::json& j, Metadata& m);

// The Metadata in the text of a `.metadata` file: what from_json gives for the parsed text
// (and its errors: nlohmann::json's or from_json's), read from nlohmann::json's SAX events
// without a json tree when the text is as to_json writes it (any spacing and field order):
// several times faster. Does not validate (validate_metadata does).
Metadata metadata_from_json_text(std::string_view text);

namespace detail {
// "[1, 2, 3]": sizes and offsets in messages.
std::string int_list_string(const std::vector<int64_t>& v);
// The SAX reader alone: nullopt where metadata_from_json_text falls back to a json tree.
std::optional<Metadata> parse_metadata_fast(std::string_view text);
}  // namespace detail

}  // namespace checkpoint
}  // namespace dtensor
