// dtensor/checkpoint/load_internal.h: the reading step of load, shared by load (checkpoint
// directories) and load_safetensors (export.h). Internal: not part of the API.
#pragma once

#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace detail {

// Where the entries of `metadata` are: their files relative to `dir`.
struct ReadSource {
  const Metadata* metadata = nullptr;
  std::string dir;
  // false: the stored chunks carry no checksums (a safetensors file) and are read unchecked.
  bool verify_checksums = true;
  // Objects whose pickled bytes are not in a data file (safetensors' "__metadata__"): key ->
  // bytes. Their entries' chunk has an empty file name.
  std::map<std::string, std::vector<char>> inline_objects;
  // What the messages call the source ("the checkpoint '<dir>'").
  std::string what;
};

// A DTensor's chunk on this rank: {box, local tensor}; nullopt when this rank is not in its
// mesh. Partial placements must have been reduced.
struct DTensorChunk {
  ChunkMeta box;
  at::Tensor local;
};
std::optional<DTensorChunk> dtensor_chunk(const at::Tensor& t);

// "['a', 'b']" (the key lists of error messages).
std::string join_keys(const std::vector<std::string>& keys);

// Not collective: checks the state dict against the entries (keys as LoadOptions::strict says,
// kinds, dtypes, global shapes) and fills it from the overlapping bytes. Throws naming the keys.
LoadResult load_local(StateDict& state_dict, const ReadSource& source, const LoadOptions& options);

// Collective over the group of `options` (or one process): runs `local` (load_local on this
// rank's source) inside one step (DistWrapper::all_gather_unless_quiet), so that any rank's
// failure is raised on every rank as a CheckpointException, and merges the ranks' missing and
// unexpected keys. When no rank failed and none has such keys, that is one all_reduce.
LoadResult load_collective(const LoadOptions& options, const std::function<LoadResult()>& local);

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
