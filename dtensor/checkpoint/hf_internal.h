// dtensor/checkpoint/hf_internal.h: safetensors files and Hugging Face checkpoint directories
// (hf_format.cpp): writing their headers, reading them as Metadata, and the sharded save
// (save with CheckpointFormat::kHuggingFace). Internal: the checkpoint sources only.
#pragma once

#include "dtensor/checkpoint/dist_wrapper.h"
#include "dtensor/checkpoint/load_internal.h"
#include "dtensor/checkpoint/save_internal.h"

#include <nlohmann/json.hpp>

#include <exception>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace detail {

// The names of PyTorch's _hf_utils.py: the index of a consolidated checkpoint, and the
// "__metadata__" keys of a sharded one's files (where each file's chunks lie in the full
// tensors: {key: {"saved_offsets": [...]}} as JSON text; the layout's version).
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kShardingInfoKey = "DCP_SHARDING_INFO";
constexpr const char* kSavedOffsetsKey = "saved_offsets";
constexpr const char* kVersionKey = "DCP_VERSION";

// Hex of bytes (an object's pickle in a safetensors "__metadata__", which holds strings only),
// and back (nullopt when `h` is not hex of whole bytes).
std::string to_hex(const std::vector<char>& bytes);
std::optional<std::vector<char>> from_hex(const std::string& h);

// One tensor of a safetensors file: its key, our dtype name and its shape.
struct SafetensorsTensor {
  std::string key;
  std::string dtype;
  std::vector<int64_t> shape;
};

// What precedes a safetensors file's data: the 8-byte little-endian length, then the header
// JSON ({key: {"dtype", "shape", "data_offsets"}} in the order given, then "__metadata__"),
// padded with spaces so that the data starts 8-byte aligned. The tensors' bytes follow in
// that order, back to back; `data_offsets` (optional) gets each one's offset after the header.
std::string safetensors_header(const std::vector<SafetensorsTensor>& tensors, const nlohmann::ordered_json& metadata,
                               std::vector<int64_t>* data_offsets = nullptr);

// Whether `dir` holds a Hugging Face checkpoint rather than ours or PyTorch's DCP: no
// `.metadata`, and a `model.safetensors.index.json` or `.safetensors` files.
bool is_huggingface_checkpoint(const std::string& dir);

// The tensors of a safetensors source as the entries of a Metadata, each chunk pointing at its
// bytes in its file. `path`: a .safetensors file, an .index.json, or a directory (its
// model.safetensors.index.json when it has one, else every .safetensors file in it: the
// chunks of a sharded save, placed by their "DCP_SHARDING_INFO"). The state dict's non-tensor
// keys (when given) are looked up in the files' "__metadata__" as objects. Throws naming the
// file for anything malformed, chunks that overlap or leave elements uncovered included.
struct SafetensorsSource {
  Metadata metadata;
  ReadSource source;  // source.metadata points at `metadata`
  // The "__metadata__" strings of the files other than DCP's own ("DCP_SHARDING_INFO",
  // "DCP_VERSION") and "format" (consolidation keeps them: objects, a user's notes).
  std::map<std::string, std::string> extra_metadata;
};
void read_safetensors_source(const std::string& path, const StateDict* state_dict, SafetensorsSource& out);

// save's steps for CheckpointFormat::kHuggingFace (collective over `dist`).
Metadata save_huggingface(const std::vector<LocalItem>& local, std::exception_ptr local_error, const std::string& dir,
                          const SaveOptions& opts, const DistWrapper& dist);

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
