// dtensor/checkpoint/hf_internal.h: safetensors files and Hugging Face checkpoint directories
// (hf_format.cpp): writing their headers, reading them as Metadata, and the sharded save
// (save with CheckpointFormat::kHuggingFace). Internal: the checkpoint sources only.
#pragma once

#include "dtensor/checkpoint/dist_wrapper.h"
#include "dtensor/checkpoint/load_internal.h"
#include "dtensor/checkpoint/save_internal.h"

#include <nlohmann/json.hpp>

#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>
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

// ---- writing (hf_consolidate.cpp) -------------------------------------------------------------

// PyTorch's _gen_file_name: "model-00001-of-00002.safetensors", and with a shard index
// "shard-00003-model-00001-of-00002.safetensors".
std::string hf_file_name(int index, int largest, int shard = 0);
// The private name a file is written under until the commit renames it
// (`<dir>/.<name>.<nonce>.tmp`), and a fresh nonce (16 hex digits).
std::string temp_path(const std::string& dir, const std::string& name, const std::string& nonce);
std::string fresh_nonce();
// Fails unless every index is at least 1 and (when the mapping is not empty) every tensor key
// has one.
void check_index_mapping(const std::map<std::string, int>& mapping, const std::vector<std::string>& tensor_keys);

// The full tensors of a consolidated save: which file each lies in and where.
struct LaidOutTensor {
  size_t file = 0;
  int64_t offset = 0;  // of its first byte in the file
  std::string dtype;
  std::vector<int64_t> shape;
};
struct LaidOutFile {
  std::string name;
  std::string header;
  int64_t size = 0;
};
struct ConsolidatedLayout {
  std::vector<LaidOutFile> files;
  std::map<std::string, LaidOutTensor> tensors;
  int64_t total_size = 0;  // tensor bytes (the index's "total_size")
};

// Every rank computes the same layout: keys in order within each file, files by index
// (`mapping`; empty: one file), the first file's "__metadata__" holding `first_metadata`
// beside "format": "pt".
ConsolidatedLayout consolidated_layout(const std::map<std::string, std::pair<std::string, std::vector<int64_t>>>& tensors,
                                       const std::map<std::string, int>& mapping,
                                       const std::map<std::string, std::string>& first_metadata);

// The output files of a consolidation, open under their private names (created by whichever
// rank comes first; the coordinator writes the headers and sets the sizes).
class ConsolidatedFiles {
 public:
  ConsolidatedFiles(const ConsolidatedLayout& layout, std::string dir, std::string nonce, bool sync);
  ~ConsolidatedFiles();
  ConsolidatedFiles(const ConsolidatedFiles&) = delete;
  ConsolidatedFiles& operator=(const ConsolidatedFiles&) = delete;
  // The coordinator's: every file's header, and its size.
  void write_headers();
  // The chunk `box` of key `fqn`, its elements contiguous at `src`, into its place (one write
  // per run of elements contiguous in both).
  void write(const std::string& fqn, const ChunkMeta& box, const char* src);
  // Syncs (when asked) and closes the files this rank opened.
  void close();

 private:
  std::string path(size_t i) const;
  int open(size_t i);

  const ConsolidatedLayout& layout_;
  std::string dir_, nonce_;
  bool sync_;
  std::vector<int> fds_;
};

// Renames the private file of `name` (in `dir`) to `name`; a file already there is renamed
// aside first, its new path added to `displaced` (to remove after the commit).
void put_in_place(const std::string& dir, const std::string& name, const std::string& nonce,
                  std::vector<std::string>& displaced);
// The coordinator's commit of a consolidation: renames the files into place, then writes the
// index (the last file: a reader that finds it finds the files it names).
void commit_consolidated(const ConsolidatedLayout& layout, const std::string& dir, const std::string& nonce, bool sync,
                         std::vector<std::string>& displaced);
// Removes the checkpoint files of `dir` that an earlier save left and this one did not write
// (a loader would take their chunks for this save's): private files of saves that died, shards
// not in `*shards` (nullptr: none of them), consolidated files not in `models`, and the index
// unless `keep_index`.
void remove_stale(const std::string& dir, const std::set<std::string>* shards, const std::set<std::string>& models,
                  bool keep_index);
// Removes the private files of a consolidation that failed.
void unlink_temps(const ConsolidatedLayout& layout, const std::string& dir, const std::string& nonce);
// The Metadata of a consolidated layout (each tensor one chunk in its file).
Metadata layout_metadata(const ConsolidatedLayout& layout);
// Runs `fn`, the part of a commit after the files are in place: its error is returned, with
// a note that the checkpoint is in place, not thrown (as our format's commit).
std::string after_commit(const std::function<void()>& fn);

// save's steps for CheckpointFormat::kHuggingFace (collective over `dist`).
Metadata save_huggingface(const std::vector<LocalItem>& local, std::exception_ptr local_error, const std::string& dir,
                          const SaveOptions& opts, const DistWrapper& dist);

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
