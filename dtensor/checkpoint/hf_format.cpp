// dtensor/checkpoint/hf_format.cpp: the sharded Hugging Face save of every rank in parallel
// (save with CheckpointFormat::kHuggingFace), in the layout of PyTorch's hf_storage.py: each
// rank's shard files, then, when consolidating, its chunks in place in the full tensors' files
// (hf_consolidate.cpp). Reading them is safetensors.cpp's.
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/hf_internal.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <set>

namespace dtensor {
namespace checkpoint {

namespace fs = std::filesystem;
using detail::kSavedOffsetsKey;
using detail::kShardingInfoKey;
using detail::kVersionKey;
using detail::after_commit;
using detail::check_index_mapping;
using detail::commit_consolidated;
using detail::ConsolidatedFiles;
using detail::ConsolidatedLayout;
using detail::consolidated_layout;
using detail::fresh_nonce;
using detail::hf_file_name;
using detail::layout_metadata;
using detail::put_in_place;
using detail::remove_stale;
using detail::SafetensorsTensor;
using detail::temp_path;
using detail::unlink_temps;

namespace {

constexpr const char* kShardedDir = "sharded";

// One rank's shard files: its chunks of each output file index; a rank holding several chunks
// of one key (a ShardedTensor with several local shards) writes them to successive shard
// files, each holding one chunk per key, as DCP_SHARDING_INFO can only say.
std::vector<detail::WriteResult> write_shard_files(const std::vector<detail::LocalItem>& local, const SavePlan& plan,
                                                   const std::map<std::string, std::string>& object_hex,
                                                   const std::string& shard_dir, int rank, int world,
                                                   const std::string& nonce, const SaveOptions& opts,
                                                   std::vector<std::string>& created) {
  std::vector<detail::WriteResult> results;
  if (plan.items.empty()) return results;
  std::map<std::pair<std::string, ChunkMeta>, const detail::LocalItem*> by_key;
  for (const auto& li : local) by_key[{li.item.fqn, li.item.chunk}] = &li;
  int largest = 1;
  for (const auto& [k, i] : opts.fqn_to_index_mapping) largest = std::max(largest, i);
  // (slot, file index) -> items; a key's n-th chunk on this rank goes to slot n.
  std::map<std::pair<int, int>, std::vector<const WriteItem*>> files;
  std::map<std::string, int> chunks_of;
  std::vector<const WriteItem*> objects;
  for (const auto& w : plan.items) {
    if (w.kind == ItemKind::Object) {
      objects.push_back(&w);
      continue;
    }
    const int index = opts.fqn_to_index_mapping.empty() ? 1 : opts.fqn_to_index_mapping.at(w.fqn);
    files[{chunks_of[w.fqn]++, index}].push_back(&w);
  }
  if (files.empty()) files[{0, 1}];  // objects alone
  bool objects_placed = false;
  for (const auto& [slot_index, items] : files) {
    const std::string name = hf_file_name(slot_index.second, largest, slot_index.first * world + rank + 1);
    nlohmann::json info = nlohmann::json::object();
    std::vector<SafetensorsTensor> tensors;
    for (const WriteItem* w : items) {
      info[w->fqn] = {{kSavedOffsetsKey, w->chunk.offsets}};
      tensors.push_back({w->fqn, w->dtype, w->chunk.sizes});
    }
    nlohmann::ordered_json meta = {{kShardingInfoKey, info.dump()}, {kVersionKey, "1.0"}, {"format", "pt"}};
    if (!objects_placed) {
      for (const WriteItem* w : objects) {
        meta[w->fqn] = object_hex.at(w->fqn);
        StoredChunk sc;
        sc.file = name;
        results.push_back({*w, sc});
      }
      objects_placed = true;
    }
    std::vector<int64_t> offsets;
    const std::string header = detail::safetensors_header(tensors, meta, &offsets);
    const std::string path = temp_path(shard_dir, name, nonce);
    detail::NewFile file(path, "");
    created.push_back(path);
    file.write(header.data(), int64_t(header.size()));
    for (size_t i = 0; i < items.size(); ++i) {
      const WriteItem& w = *items[i];
      auto it = by_key.find({w.fqn, w.chunk});
      TORCH_CHECK(it != by_key.end(), "the global plan gave rank ", rank, " key '", w.fqn, "' chunk ",
                  w.chunk.to_string(), ", which it does not hold");
      const at::Tensor data = it->second->data.detach().to(at::kCPU).contiguous();
      file.write(static_cast<const char*>(data.data_ptr()), int64_t(data.nbytes()));
      StoredChunk sc;
      sc.chunk = w.chunk;
      sc.file = name;
      sc.offset = int64_t(header.size()) + offsets[i];
      sc.length = int64_t(data.nbytes());
      results.push_back({w, sc});
      if (opts.on_item_written) opts.on_item_written(w.fqn, sc.length);
    }
    file.close(opts.sync_files);
  }
  return results;
}

}  // namespace

// NOTE: [Sharded Hugging Face save]
// The steps of save with CheckpointFormat::kHuggingFace, as our format's (NOTE: [Crash
// consistency of save]) where the layout allows:
//   1. "plan": all_gather of the local plans, each with the hex of the rank's objects' pickles;
//      the coordinator creates the directories, locks the checkpoint directory and draws the
//      save's nonce. Every rank merges the plans (deduplicating replicated chunks) and, when
//      consolidating, lays out the full tensors' files (every rank computes the same).
//   2. "write": each rank writes its shard files under private names (`.<name>.<nonce>.tmp`,
//      created new) and, when consolidating, its chunks' bytes in place into the consolidated
//      files' private names (which the coordinator also gives their headers and sizes).
//   3. "commit": the coordinator renames the shard files, then the consolidated files, then
//      writes the index, and removes the checkpoint files of earlier saves that this one did
//      not write (shards of a larger world would otherwise be read as this save's chunks).
// File names are fixed by the layout, so the commit replaces files one rename at a time: a
// crash during it can leave a mix of this save's files and the previous one's (PyTorch's
// writer overwrites them in place while writing). A failure before it removes every private
// file.
namespace {

// What the plan step of a sharded save agrees on.
struct HfSavePlan {
  std::string nonce;
  std::vector<SavePlan> plans;                       // every rank's share
  std::map<std::string, std::string> object_hex;     // objects' pickles, from the rank saving each
  std::optional<ConsolidatedLayout> layout;          // when consolidating
};

// Step 1 of NOTE: [Sharded Hugging Face save]. `lock`: the coordinator's, held until the end.
HfSavePlan plan_hf_save(const std::vector<detail::LocalItem>& local, std::exception_ptr local_error,
                        const std::string& dir, const std::string& shard_dir, const SaveOptions& opts,
                        const DistWrapper& dist, std::unique_ptr<detail::DirectoryLock>& lock) {
  const std::vector<nlohmann::json> offers = dist.all_gather("plan", [&] {
    if (local_error) std::rethrow_exception(local_error);
    SavePlan p;
    nlohmann::json objects = nlohmann::json::object();
    std::vector<std::string> tensor_keys;
    for (const auto& li : local) {
      const std::string& k = li.item.fqn;
      TORCH_CHECK(k != "__metadata__" && k != kShardingInfoKey && k != kVersionKey && k != "format", "key '", k,
                  "' cannot be saved in Hugging Face's format: safetensors headers use that name");
      if (li.item.kind == ItemKind::Object) {
        objects[k] = detail::to_hex(torch::jit::pickle_save(li.object));
      } else {
        try {
          safetensors_dtype(li.item.dtype);
        } catch (const c10::Error&) {
          TORCH_CHECK(false, "key '", k, "' is ", li.item.dtype, ", which safetensors has no dtype for");
        }
        tensor_keys.push_back(k);
      }
      p.items.push_back(li.item);
    }
    check_index_mapping(opts.fqn_to_index_mapping, tensor_keys);
    nlohmann::json offer{{"plan", p}, {"objects", objects}};
    if (dist.is_coordinator()) {
      std::error_code ec;
      fs::create_directories(shard_dir, ec);
      TORCH_CHECK(!ec && fs::is_directory(shard_dir), "cannot create checkpoint directory '", shard_dir, "': ",
                  ec.message());
      lock = std::make_unique<detail::DirectoryLock>(dir, "coordinator rank " + std::to_string(dist.get_rank()) +
                                                              " of " + std::to_string(dist.get_world_size()));
      offer["nonce"] = fresh_nonce();
    }
    return offer;
  });
  HfSavePlan out;
  out.nonce = offers.at(size_t(dist.coordinator_rank())).at("nonce").get<std::string>();
  out.plans = dist.on_every_rank("plan", [&] {
    std::vector<SavePlan> all;
    for (const auto& o : offers) all.push_back(o.at("plan").get<SavePlan>());
    std::vector<SavePlan> global = create_global_save_plan(all);
    std::map<std::string, std::pair<std::string, std::vector<int64_t>>> tensors;
    for (size_t r = 0; r < global.size(); ++r) {
      for (const auto& w : global[r].items) {
        if (w.kind == ItemKind::Object) {
          out.object_hex[w.fqn] = offers[r].at("objects").at(w.fqn).get<std::string>();
        } else {
          tensors[w.fqn] = {w.dtype, w.global_size};
        }
      }
    }
    if (opts.enable_consolidation) out.layout = consolidated_layout(tensors, opts.fqn_to_index_mapping, out.object_hex);
    return global;
  });
  return out;
}

// This rank's part of step 2: its chunks into the consolidated files, in place.
void write_consolidated_chunks(const std::vector<detail::LocalItem>& local, const SavePlan& plan,
                               const ConsolidatedLayout& layout, const std::string& dir, const std::string& nonce,
                               bool coordinator, bool sync) {
  ConsolidatedFiles out(layout, dir, nonce, sync);
  if (coordinator) out.write_headers();
  std::map<std::pair<std::string, ChunkMeta>, const detail::LocalItem*> by_key;
  for (const auto& li : local) by_key[{li.item.fqn, li.item.chunk}] = &li;
  for (const auto& w : plan.items) {
    if (w.kind != ItemKind::Tensor) continue;
    const at::Tensor data = by_key.at({w.fqn, w.chunk})->data.detach().to(at::kCPU).contiguous();
    out.write(w.fqn, w.chunk, static_cast<const char*>(data.data_ptr()));
  }
  out.close();
}

// Step 3, the coordinator's. Returns "" or the error of a step after the files are in place.
std::string commit_hf_save(const std::vector<std::vector<detail::WriteResult>>& written, const HfSavePlan& plan,
                           const std::string& dir, const std::string& shard_dir, const SaveOptions& opts) {
  std::set<std::string> shards;
  for (const auto& rank_results : written) {
    for (const auto& r : rank_results) shards.insert(r.stored.file);
  }
  std::vector<std::string> displaced;
  for (const auto& name : shards) put_in_place(shard_dir, name, plan.nonce, displaced);
  std::set<std::string> models;
  if (plan.layout) {
    if (opts.sync_files) detail::fsync_path(shard_dir, /*directory=*/true);
    commit_consolidated(*plan.layout, dir, plan.nonce, opts.sync_files, displaced);
    for (const auto& f : plan.layout->files) models.insert(f.name);
  }
  return after_commit([&] {
    for (const auto& p : displaced) ::unlink(p.c_str());
    if (opts.sync_files) detail::fsync_path(dir, /*directory=*/true);
    if (opts.sync_files && plan.layout) detail::fsync_path(shard_dir, /*directory=*/true);
    remove_stale(shard_dir, &shards, {}, /*keep_index=*/plan.layout.has_value());
    if (plan.layout) remove_stale(dir, nullptr, models, /*keep_index=*/true);
  });
}

// The tensors of a sharded save (objects are in "__metadata__": read with a state dict).
Metadata sharded_metadata(const std::vector<std::vector<detail::WriteResult>>& written) {
  Metadata m;
  m.world_size = int(written.size());
  m.checksummed = false;
  for (const auto& rank_results : written) {
    for (const auto& r : rank_results) {
      if (r.item.kind != ItemKind::Tensor) continue;
      Entry& e = m.entries[r.item.fqn];
      e.dtype = r.item.dtype;
      e.size = r.item.global_size;
      e.chunks.push_back(r.stored);
    }
  }
  for (auto& [k, e] : m.entries) {
    std::sort(e.chunks.begin(), e.chunks.end(),
              [](const StoredChunk& a, const StoredChunk& b) { return a.chunk < b.chunk; });
  }
  return m;
}

}  // namespace

Metadata detail::save_huggingface(const std::vector<LocalItem>& local, std::exception_ptr local_error,
                                  const std::string& dir, const SaveOptions& opts, const DistWrapper& dist) {
  const int rank = dist.get_rank();
  const std::string shard_dir = opts.enable_consolidation ? (fs::path(dir) / kShardedDir).string() : dir;
  std::unique_ptr<DirectoryLock> lock;
  const HfSavePlan plan = plan_hf_save(local, local_error, dir, shard_dir, opts, dist, lock);
  std::vector<std::string> created;  // this rank's private files
  std::vector<std::vector<WriteResult>> written;
  std::string after_commit_error;
  try {
    written = dist.all_gather("write", [&] {
      const SavePlan& mine = plan.plans.at(size_t(rank));
      auto results = write_shard_files(local, mine, plan.object_hex, shard_dir, rank, dist.get_world_size(),
                                       plan.nonce, opts, created);
      if (plan.layout) {
        write_consolidated_chunks(local, mine, *plan.layout, dir, plan.nonce, dist.is_coordinator(), opts.sync_files);
      }
      return results;
    });
    after_commit_error = dist.broadcast("commit", [&] { return commit_hf_save(written, plan, dir, shard_dir, opts); });
  } catch (const CheckpointException&) {
    for (const auto& p : created) ::unlink(p.c_str());
    if (plan.layout && dist.is_coordinator()) unlink_temps(*plan.layout, dir, plan.nonce);
    throw;
  }
  if (!after_commit_error.empty()) {
    throw CheckpointException("commit",
                              {{dist.coordinator_rank(), WrappedException{"c10::Error", after_commit_error}}});
  }
  return plan.layout ? layout_metadata(*plan.layout) : sharded_metadata(written);
}

}  // namespace checkpoint
}  // namespace dtensor
