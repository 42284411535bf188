// dtensor/checkpoint/save_load.h
//
// Distributed checkpoint save and load (torch.distributed.checkpoint.save / load, DESIGN.md
// D10). Collective: every rank of the group calls them with its own state dict.
//
//   StateDict sd{{"w", w_dtensor}, {"b", bias}, {"step", c10::IValue(int64_t(10))}};
//   dtensor::checkpoint::save(sd, "/ckpt/step10");                  // every rank
//   ...
//   StateDict dest{{"w", other_layout_dtensor}, {"b", at::empty({16})}, {"step", c10::IValue()}};
//   dtensor::checkpoint::load(dest, "/ckpt/step10");                // filled in place
//
// A state dict maps names to plain tensors (the same on every rank; one copy is written),
// DTensors (any mesh and placements, uneven shards; Partial placements are reduced first),
// ShardedTensors, and other values (c10::IValue: numbers, strings, bytes as strings, lists,
// nested dicts). Load reads each destination shard from the saved chunks that overlap it,
// whatever layout, mesh or world size saved them (resharding), and reads only the checksum
// blocks that hold those bytes.
//
// Save: each rank plans its chunks, the coordinator merges the plans (one writer per
// replicated chunk, the least-loaded rank) and validates them (in bounds, no overlap, every
// element covered), each rank writes its file `__<rank>_<save_id>.distcp`, and when every
// rank has finished the coordinator writes `.metadata` (to a temporary name, then renamed: the
// commit) and removes the files of older saves. A save that fails or dies before the commit
// leaves the previous checkpoint of the directory loadable (a failed one removes its files).
// One save into a directory at a time: another save into it while one runs (from any job)
// raises, naming the job that saves (README, "Crash consistency").
//
// Errors: a failure on any rank (cannot write, missing or truncated file, checksum mismatch,
// unknown or missing key, shape or dtype mismatch, inconsistent plans) raises one
// CheckpointException on EVERY rank, naming each failing rank and its error (with the keys and
// files concerned); no rank waits for another that failed.
#pragma once

#include "dtensor/checkpoint/api.h"
#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/utils.h"
#include "dtensor/comm/group.h"

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {

class StagingBuffers;

// What save writes. kDtensorCpp: our format (JSON `.metadata`, every chunk's raw bytes with
// CRC-32 checksums; docs/checkpoint.md, "On-disk format"). kPyTorchDcp: PyTorch's distributed
// checkpoint as its FileSystemWriter writes it (a pickled `.metadata`, each chunk and object a
// torch.save stream in `__<rank>_<id>.distcp`), which PyTorch's dcp.load reads into its own
// DTensors, FSDP2 and TP models; no checksums (DCP has none). kHuggingFace: safetensors in
// Hugging Face's layout, as PyTorch's HuggingFaceStorageWriter with save_distributed=True
// writes it: every rank writes its own chunks to `shard-<n>-model-<i>-of-<N>.safetensors`
// (each header's "__metadata__" says where its chunks lie in the full tensors, as
// "DCP_SHARDING_INFO"); with SaveOptions::enable_consolidation the full tensors are also
// written, in parallel, to `model-<i>-of-<N>.safetensors` beside a `model.safetensors.index.json`
// (the shards then go to the `sharded/` subdirectory). Tensors only, besides objects kept as
// their pickles' hex in "__metadata__"; no checksums. load reads all three.
enum class CheckpointFormat { kDtensorCpp, kPyTorchDcp, kHuggingFace };

struct SaveOptions {
  // The group the ranks save over; nullptr: the default group. Without a process group
  // initialised (or with no_dist) the save is a single process's.
  comm::GroupPtr process_group = nullptr;
  bool no_dist = false;
  int coordinator_rank = 0;
  // fsync data files, the metadata file and the directory before the commit counts as done.
  bool sync_files = true;
  int64_t checksum_block_bytes = kDefaultChecksumBlockBytes;
  CheckpointFormat format = CheckpointFormat::kDtensorCpp;
  // kHuggingFace only (PyTorch's HuggingFaceStorageWriter arguments of the same names):
  //   fqn_to_index_mapping: the output file (1..N) of every tensor key; empty: one file.
  //   enable_consolidation: also write the full tensors and the index (see CheckpointFormat).
  std::map<std::string, int> fqn_to_index_mapping;
  bool enable_consolidation = false;
  // Called on the writing rank after each chunk or object is written (progress reporting).
  std::function<void(const std::string& fqn, int64_t bytes)> on_item_written;
  // async_save only: the CPU buffers to stage into, kept for the next async_save given the same
  // object. nullptr: the process's staging cache (cache_staging) or fresh buffers. See
  // StagingBuffers.
  std::shared_ptr<StagingBuffers> staging;
  // async_save without `staging`: true (default) stages into the process's staging cache, whose
  // buffers stay allocated for the next async_save (a training loop that saves every N steps
  // allocates them once; release_staging_cache() frees them); false: fresh buffers, freed when
  // the background write ends.
  bool cache_staging = true;
};

// Staging buffers for async_save, reused across saves (PyTorch: the async stager's cached CPU
// state dict). The first async_save given them allocates one buffer per local chunk; later ones
// with the same layout only copy into them (no allocation, no fresh pages to fault in), which
// is most of the time the caller is blocked. A buffer whose chunk changed shape or dtype is
// replaced, and chunks no longer saved are dropped. An async_save given buffers that a previous
// async_save is still writing from waits for that write to finish first.
//
//   auto staging = std::make_shared<StagingBuffers>();
//   SaveOptions o;
//   o.staging = staging;
//   for (...) { train(); fut = async_save(sd, dir_of(step), o); }
class StagingBuffers {
 public:
  StagingBuffers();
  ~StagingBuffers();
  StagingBuffers(const StagingBuffers&) = delete;
  StagingBuffers& operator=(const StagingBuffers&) = delete;
  // Bytes held.
  int64_t nbytes() const;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct LoadOptions {
  comm::GroupPtr process_group = nullptr;
  bool no_dist = false;
  int coordinator_rank = 0;
  // Keys of the state dict the checkpoint lacks (missing) and keys of the checkpoint the state
  // dict lacks (unexpected) are errors; with false they are reported in LoadResult and skipped.
  bool strict = true;
  // Check every block read against its CRC-32 (a corrupted file is an error naming the file, key
  // and bytes). false: read without checking (trusted storage: PyTorch's DCP has no checksums),
  // which saves the checksum's time (README, "Distributed checkpoint": load figures).
  bool verify_checksums = true;
};

struct LoadResult {
  std::vector<std::string> missing_keys;     // in the state dict, not in the checkpoint (any rank)
  std::vector<std::string> unexpected_keys;  // in the checkpoint, not in the state dict (any rank)
};

// Collective. Returns the metadata written (on every rank).
Metadata save(const StateDict& state_dict, const std::string& checkpoint_dir, const SaveOptions& options = {});

// Collective. Fills `state_dict` in place: tensors are copied into (DTensors: into their local
// shards), objects are replaced by the saved values.
LoadResult load(StateDict& state_dict, const std::string& checkpoint_dir, const LoadOptions& options = {});

// ---- planning without data (NOTE: [Checkpoint plans] in save_load.cpp) ---------------------
//
// What save and load would do, computed from the tensors' specs alone: nothing is written or
// read, so a state dict of meta tensors on a fake world (comm::FakeGroup: one process playing
// rank r of N) plans the checkpoint of a model no machine holds, as the real ranks would.
//
//   auto world = std::make_shared<comm::FakeGroup>(/*rank=*/300, /*world_size=*/512);
//   ... a model built on meta, fully_shard-ed on a "meta" mesh over `world` ...
//   SaveOptions o;
//   o.process_group = world;
//   PlannedSave p = checkpoint::plan_save(state_dict, o);  // rank 300's part, every rank's bytes
//   PlannedLoad l = checkpoint::plan_load(state_dict, p.metadata);

struct PlannedSave {
  // What this rank would write: its part of the global plan (one writer per replicated chunk),
  // in the order save writes it.
  SavePlan plan;
  // The bytes each rank of the group would write to its data file (index: the group's rank).
  std::vector<int64_t> bytes_per_rank;
  // The metadata save would commit into an empty directory (save id 1): every key's chunks,
  // their files and byte ranges. Without checksums (checksummed false): a plan has no bytes.
  Metadata metadata;
};

// Collective over options.process_group like save (one all_gather of the local plans), or,
// on a fake group, not collective: every other rank's plan is derived from the specs of the
// state dict's DTensors and ShardedTensors (plain tensors and objects: the same on every rank,
// as save assumes). A Partial DTensor is reduced first, as save does. For
// CheckpointFormat::kDtensorCpp (other formats' byte layouts need the data); errors are save's.
PlannedSave plan_save(const StateDict& state_dict, const SaveOptions& options = {});

struct PlannedLoad {
  // One read: the box of key `fqn` that this rank's destination takes from one stored chunk
  // (in `file`), and its bytes.
  struct Read {
    std::string fqn;
    ChunkMeta box;
    std::string file;
    int64_t bytes = 0;
  };
  std::vector<Read> reads;           // by key, then destination, then stored chunk
  std::vector<std::string> objects;  // the object keys this rank reads
  int64_t bytes = 0;                 // tensor bytes read (the sum of reads' bytes)
  LoadResult keys;                   // missing and unexpected keys (strict: an error instead)
};

// Not collective: what load would read into `state_dict` on this rank from a checkpoint with
// `metadata` (read_metadata's, or plan_save's), with load's checks (keys, dtypes, shapes) and
// their errors, without reading or allocating (a None placeholder plans the whole tensor).
PlannedLoad plan_load(const StateDict& state_dict, const Metadata& metadata, const LoadOptions& options = {});

// Not collective: the parsed `.metadata` of a checkpoint directory (throws naming the path).
Metadata read_metadata(const std::string& checkpoint_dir);

// Collective (like save). Copies this rank's share of the state to CPU staging buffers (a
// Partial DTensor is reduced first; options.staging: into those, reused), then writes it on a
// background thread: the caller may change its tensors as soon as this returns. The future gives save's result or rethrows its
// CheckpointException. The background save uses the group's collectives: make no other
// collective on that group until the future is ready (or pass a dedicated process_group).
std::future<Metadata> async_save(const StateDict& state_dict, const std::string& checkpoint_dir,
                                 const SaveOptions& options = {});

// async_save's staging cache (SaveOptions::cache_staging, on by default). It holds one set of
// StagingBuffers per async_save in flight at once (one in a loop that waits for each save's
// future before the next): an async_save takes the free set staged last with the same keys,
// chunks, shapes and dtypes, else any free set (its buffers follow the new layout: a chunk whose
// shape or dtype changed gets a new buffer, chunks no longer saved are dropped), else a new set.
// It never waits for another save. Not collective.
//   Bytes the cache holds (every set, in use or not).
int64_t staging_cache_bytes();
//   Frees the sets no save is writing from (those in use are freed when their write ends).
void release_staging_cache();

}  // namespace checkpoint
}  // namespace dtensor
