// dtensor/checkpoint/save_load.cpp: save and async_save (see save_load.h); load is load.cpp's.
#include "dtensor/checkpoint/save_load.h"

#include "dtensor/checkpoint/dcp_internal.h"
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/dist_wrapper.h"
#include "dtensor/checkpoint/hf_internal.h"
#include "dtensor/checkpoint/load_internal.h"
#include "dtensor/checkpoint/pickle_internal.h"
#include "dtensor/checkpoint/save_internal.h"
#include "dtensor/placement/placement.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <string_view>
#include <unordered_map>

namespace dtensor {
namespace checkpoint {

namespace fs = std::filesystem;

std::optional<detail::DTensorChunk> detail::dtensor_chunk(const at::Tensor& t) {
  const DTensorSpec& spec = get_spec(t);
  if (!spec.mesh.get_coordinate()) return std::nullopt;
  auto [shape, offset] = compute_local_shape_and_global_offset(t.sizes(), spec.mesh, spec.placements);
  return DTensorChunk{ChunkMeta{offset, shape}, local_tensor(t)};
}

namespace {

using detail::kMetadataFile;

// ---- what this rank holds -------------------------------------------------------------------

using detail::errno_str;
using detail::fsync_path;
using detail::layout_of;
using detail::LocalItem;
using detail::NewFile;
using detail::resolve_group;
using detail::resolve_use_dist;
using detail::stage;
using detail::take_cached_staging;
using detail::write_all;
using detail::WriteResult;

using detail::dtensor_chunk;

std::vector<int64_t> zeros_like_dims(size_t n) { return std::vector<int64_t>(n, 0); }

WriteItem tensor_item(const std::string& fqn, const at::Tensor& global_like, std::vector<int64_t> global_size,
                      ChunkMeta box) {
  WriteItem w;
  w.fqn = fqn;
  w.kind = ItemKind::Tensor;
  w.dtype = dtype_name(global_like.scalar_type());
  w.global_size = std::move(global_size);
  w.chunk = std::move(box);
  w.nbytes = w.chunk.numel() * int64_t(global_like.element_size());
  return w;
}

// Collective for DTensors with Partial placements (they are reduced to Replicate first).
std::vector<LocalItem> collect_local_items(const StateDict& state_dict) {
  std::vector<LocalItem> items;
  auto add_tensor = [&](const std::string& fqn, at::Tensor t) {
    std::vector<int64_t> global(t.sizes().begin(), t.sizes().end());
    bool empty_tensor = t.numel() == 0;
    if (is_dtensor(t)) {
      const DTensorSpec& spec = get_spec(t);
      if (spec.has_partial()) {
        std::vector<Placement> ps = spec.placements;
        for (auto& p : ps) {
          if (std::holds_alternative<Partial>(p)) p = Replicate{};
        }
        t = redistribute(t, spec.mesh, ps);
      }
      auto c = dtensor_chunk(t);
      if (!c) return;
      if (empty_tensor) c->box = ChunkMeta{zeros_like_dims(global.size()), global};
      if (c->box.numel() == 0 && !empty_tensor) return;
      items.push_back({tensor_item(fqn, t, global, c->box), c->local, {}});
      return;
    }
    items.push_back({tensor_item(fqn, t, global, ChunkMeta{zeros_like_dims(global.size()), global}), t, {}});
  };
  for (const auto& [fqn, value] : state_dict) {
    if (const auto* t = std::get_if<at::Tensor>(&value)) {
      TORCH_CHECK(t->defined(), "checkpoint: key '", fqn, "' is an undefined tensor");
      add_tensor(fqn, *t);
    } else if (const auto* st = std::get_if<sharded::ShardedTensor>(&value)) {
      std::vector<int64_t> global = st->size();
      for (const auto& shard : st->local_shards()) {
        ChunkMeta box{shard.metadata.shard_offsets(), shard.metadata.shard_sizes()};
        if (box.numel() == 0) continue;
        items.push_back({tensor_item(fqn, shard.tensor, global, box), shard.tensor, {}});
      }
    } else {
      const auto& iv = std::get<c10::IValue>(value);
      if (iv.isTensor()) {
        add_tensor(fqn, iv.toTensor());
        continue;
      }
      WriteItem w;
      w.fqn = fqn;
      w.kind = ItemKind::Object;
      LocalItem li;
      li.item = w;
      li.object = iv;
      items.push_back(std::move(li));
    }
  }
  return items;
}


}  // namespace


namespace {



// ---- files ------------------------------------------------------------------------------------


std::string data_file_name(int rank, int64_t save_id) {
  return "__" + std::to_string(rank) + "_" + std::to_string(save_id) + ".distcp";
}


// One item's bytes as its file holds them, and where they lie in it.
struct ItemBytes {
  std::vector<char> pickled;  // an object's pickle, or (DCP) the chunk's torch.save stream
  at::Tensor contiguous;      // a tensor chunk, on the CPU
  const char* data = nullptr;
  int64_t n = 0;
  StoredChunk sc;
};

// The bytes of item `w` (from `li`) written at `offset` of data file `name`.
ItemBytes item_bytes(const WriteItem& w, const LocalItem& li, const std::string& name, int64_t offset, bool dcp) {
  ItemBytes b;
  b.sc.chunk = w.kind == ItemKind::Tensor ? w.chunk : ChunkMeta{};
  b.sc.file = name;
  b.sc.offset = offset;
  if (w.kind == ItemKind::Object) {
    b.pickled = torch::jit::pickle_save(li.object);
    b.data = b.pickled.data();
    b.n = int64_t(b.pickled.size());
    b.sc.length = b.n;
    return b;
  }
  b.contiguous = li.data.detach().to(at::kCPU).contiguous();
  if (!dcp) {
    b.data = static_cast<const char*>(b.contiguous.data_ptr());
    b.n = int64_t(b.contiguous.nbytes());
    b.sc.length = b.n;
    return b;
  }
  // A torch.save stream of the chunk alone (a view would bring its whole storage).
  if (b.contiguous.storage_offset() != 0 || int64_t(b.contiguous.storage().nbytes()) != int64_t(b.contiguous.nbytes()))
    b.contiguous = b.contiguous.clone();
  b.pickled = torch::jit::pickle_save(b.contiguous);
  b.data = b.pickled.data();
  b.n = int64_t(b.pickled.size());
  b.sc.offset = offset + (b.contiguous.nbytes() > 0 ? int64_t(detail::tensor_bytes_offset(b.pickled)) : 0);
  b.sc.length = int64_t(b.contiguous.nbytes());
  b.sc.stream_offset = offset;
  b.sc.stream_length = b.n;
  return b;
}

// Writes this rank's share (`plan`) of `local` to its data file.
std::vector<WriteResult> write_items(const std::vector<LocalItem>& local, const SavePlan& plan,
                                     const std::string& dir, int rank, int64_t save_id, const SaveOptions& opts) {
  std::vector<WriteResult> results;
  if (plan.items.empty()) return results;
  std::map<std::pair<std::string, ChunkMeta>, const LocalItem*> by_key;
  for (const auto& li : local) by_key[{li.item.fqn, li.item.chunk}] = &li;

  const std::string name = data_file_name(rank, save_id);
  detail::save_fault_point(detail::SaveFaultPoint::kBeforeData, rank);
  // next_save_id chose a name no entry of the directory has.
  NewFile file((fs::path(dir) / name).string(), "data file ");
  const int64_t block = opts.checksum_block_bytes;
  const bool dcp = opts.format == CheckpointFormat::kPyTorchDcp;
  int64_t offset = 0;
  bool first_block = true;
  for (const auto& w : plan.items) {
    auto it = by_key.find({w.fqn, w.chunk});
    TORCH_CHECK(it != by_key.end(), "the global plan gave rank ", rank, " key '", w.fqn, "' chunk ",
                w.chunk.to_string(), ", which it does not hold");
    ItemBytes b = item_bytes(w, *it->second, name, offset, dcp);
    // Checksum and write one block at a time (the block is still in the cache when written).
    for (int64_t at = 0; at < b.n; at += block) {
      const int64_t len = std::min(block, b.n - at);
      if (!dcp) b.sc.crc32.push_back(crc32(b.data + at, size_t(len)));
      file.write(b.data + at, len);
      if (first_block) detail::save_fault_point(detail::SaveFaultPoint::kMidData, rank);
      first_block = false;
    }
    offset += b.n;
    results.push_back({w, b.sc});
    if (opts.on_item_written) opts.on_item_written(w.fqn, b.n);
  }
  file.close(opts.sync_files);
  detail::save_fault_point(detail::SaveFaultPoint::kAfterData, rank);
  return results;
}

// The metadata of a save from every rank's write results (every rank builds the same).
// `planned`: results of plan_save, without checksums.
Metadata build_metadata(const std::vector<std::vector<WriteResult>>& all, int64_t save_id, const SaveOptions& opts,
                        bool planned = false) {
  Metadata m;
  m.save_id = save_id;
  m.world_size = int(all.size());
  m.checksum_block_bytes = opts.checksum_block_bytes;
  m.checksummed = !planned && opts.format == CheckpointFormat::kDtensorCpp;
  for (const auto& rank_results : all) {
    for (const auto& r : rank_results) {
      Entry& e = m.entries[r.item.fqn];
      e.kind = r.item.kind;
      e.dtype = r.item.dtype;
      e.size = r.item.global_size;
      e.chunks.push_back(r.stored);
    }
  }
  for (auto& [fqn, e] : m.entries) {
    std::sort(e.chunks.begin(), e.chunks.end(),
              [](const StoredChunk& a, const StoredChunk& b) { return a.chunk < b.chunk; });
  }
  validate_metadata(m);
  return m;
}

// NOTE: [Crash consistency of save]
// A save must leave the directory's checkpoint loadable whatever happens to it: a rank killed
// (kill -9, a machine lost) at any point, a full disk, a read-only directory, another job
// saving into the same directory. The steps, in order:
//   1. The coordinator locks the directory (detail::DirectoryLock: flock on `.lock`, which
//      names the holder). A second save into it fails at once, naming the job that holds the
//      lock; a lock left by a job that died is not held (the kernel drops it) and is taken
//      over.
//   2. The save id is above every id the directory knows: the committed `.metadata`'s, those
//      of the files it names, and those of every data file present (debris of saves that
//      died). A new save never writes a file the committed checkpoint reads.
//   3. Each rank writes and fsyncs its data file `__<rank>_<id>.distcp`.
//   4. When every rank has written, the coordinator writes `.metadata.tmp`, fsyncs it and the
//      directory (the data files' entries are durable before the metadata can be), and
//      renames it to `.metadata`: the commit. Then it fsyncs the directory again and removes
//      the files no longer named.
// A save that fails before the rename (any rank's error: every rank raises) removes what it
// wrote: each rank its data file, the coordinator `.metadata.tmp`. A save that dies (a rank
// killed: the others see a failed collective, not an agreed error) leaves its files: a rank
// cannot tell whether the coordinator renamed before it died, or whether it still will. That
// debris is ignored by the next save (step 2) and removed by its commit (step 4); the previous
// checkpoint is untouched either way. A failure after the rename leaves the new checkpoint
// committed and its files in place.

// The coordinator's commit (NOTE: [Crash consistency of save], step 4). Returns "" when done,
// else the error of a step after the rename (the checkpoint is committed); throws, having
// removed `.metadata.tmp`, when the metadata could not be put in place.
std::string commit(const Metadata& m, const std::string& dir, const SaveOptions& opts, int rank) {
  const std::string tmp = (fs::path(dir) / (std::string(kMetadataFile) + ".tmp")).string();
  const std::string final_path = (fs::path(dir) / kMetadataFile).string();
  try {
    // Compact JSON: parsed on every rank of every load.
    std::string text = opts.format == CheckpointFormat::kPyTorchDcp ? detail::dcp_metadata_pickle(m) : nlohmann::json(m).dump();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TORCH_CHECK(fd >= 0, "cannot create '", tmp, "': ", errno_str());
    try {
      write_all(fd, text.data(), int64_t(text.size()), tmp);
      if (opts.sync_files) TORCH_CHECK(::fsync(fd) == 0, "cannot sync '", tmp, "': ", errno_str());
    } catch (...) {
      ::close(fd);
      throw;
    }
    TORCH_CHECK(::close(fd) == 0, "cannot close '", tmp, "': ", errno_str());
    if (opts.sync_files) fsync_path(dir, /*directory=*/true);
    detail::save_fault_point(detail::SaveFaultPoint::kBeforeRename, rank);
    TORCH_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0, "cannot rename '", tmp, "' to '", final_path,
                "': ", errno_str());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Committed: from here on an error is reported, not thrown (the ranks keep their files).
  std::string error;
  try {
    detail::save_fault_point(detail::SaveFaultPoint::kAfterRename, rank);
    if (opts.sync_files) fsync_path(dir, /*directory=*/true);
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    error = (c10_error ? c10_error->msg() : std::string(e.what())) +
            " (after the commit: the checkpoint is in place, but may not survive a power loss)";
  }
  // The commit is done; what follows only frees space.
  auto files = m.files();
  std::set<std::string> keep(files.begin(), files.end());
  static const std::regex data_file(R"(__\d+_\d+\.distcp)");
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    std::string name = de.path().filename().string();
    if (std::regex_match(name, data_file) && !keep.count(name) && de.is_regular_file(ec)) fs::remove(de.path(), ec);
  }
  return error;
}

// The save id of `name` when it is a data file's name (`__<rank>_<id>.distcp`), else -1.
int64_t save_id_of_file(const std::string& name) {
  static const std::regex data_file(R"(__\d+_(\d{1,18})\.distcp)");
  std::smatch match;
  if (!std::regex_match(name, match, data_file)) return -1;
  return std::stoll(match[1].str());
}

// NOTE: [Crash consistency of save], step 2.
int64_t next_save_id(const std::string& dir) {
  int64_t last = 0;
  try {
    const Metadata m = read_metadata(dir);
    last = m.save_id;
    for (const auto& f : m.files()) last = std::max(last, save_id_of_file(f));
  } catch (const std::exception&) {
    // No committed checkpoint (or none readable): the data files present decide.
  }
  // Every file and link counts, a link whatever it leads to: the id is above their names, so
  // the new data files replace nothing. (A directory with a data file's name is not skipped:
  // creating the file fails, naming it.)
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->symlink_status(type_ec).type() == fs::file_type::directory) continue;
    last = std::max(last, save_id_of_file(it->path().filename().string()));
  }
  TORCH_CHECK(!ec, "cannot list checkpoint directory '", dir, "': ", ec.message());
  return last + 1;
}

// `local_error`: this rank failed to collect its items; it fails the plan step on every rank.
//
// Three rounds of object collectives (each costs a few messages between every rank; on small
// hosts their latency is much of a save's time, so there are as few as the steps need):
//   1. "plan": all_gather of the local plans (the coordinator's also carries the save id, and
//      creating and locking the directory is part of its step); every rank then merges them
//      into the same global plan (deterministic) and takes its part;
//   2. "write": each rank writes its part; all_gather of the write results, from which every
//      rank builds the same metadata;
//   3. "commit": the coordinator writes the metadata (only reached when every write succeeded);
//      a broadcast tells every rank whether it did.
// A failure before the commit removes the files the save wrote (NOTE: [Crash consistency of
// save]).
Metadata save_items(const std::vector<LocalItem>& local, std::exception_ptr local_error, const std::string& dir,
                    const SaveOptions& opts, bool use_dist, const comm::GroupPtr& group) {
  if (opts.format == CheckpointFormat::kHuggingFace) {
    return detail::save_huggingface(local, local_error, dir, opts, DistWrapper(group, use_dist, opts.coordinator_rank));
  }
  TORCH_CHECK(opts.checksum_block_bytes > 0 && opts.checksum_block_bytes % 16 == 0 &&
                  opts.checksum_block_bytes <= kMaxChecksumBlockBytes,
              "SaveOptions.checksum_block_bytes must be a positive multiple of 16 of at most ", kMaxChecksumBlockBytes,
              ", got ", opts.checksum_block_bytes);
  DistWrapper dist(group, use_dist, opts.coordinator_rank);
  const int rank = dist.get_rank();

  // Held by the coordinator until the save is committed or failed (NOTE: [Crash consistency
  // of save], step 1).
  std::unique_ptr<detail::DirectoryLock> lock;
  std::vector<nlohmann::json> offers = dist.all_gather("plan", [&] {
    if (local_error) std::rethrow_exception(local_error);
    SavePlan p;
    for (const auto& li : local) p.items.push_back(li.item);
    nlohmann::json offer{{"plan", p}};
    if (dist.is_coordinator()) {
      std::error_code ec;
      fs::create_directories(dir, ec);
      TORCH_CHECK(!ec && fs::is_directory(dir), "cannot create checkpoint directory '", dir, "': ", ec.message());
      lock = std::make_unique<detail::DirectoryLock>(
          dir, "coordinator rank " + std::to_string(rank) + " of " + std::to_string(dist.get_world_size()));
      offer["save_id"] = next_save_id(dir);
    }
    return offer;
  });
  const int64_t save_id = offers.at(size_t(dist.coordinator_rank())).at("save_id").get<int64_t>();
  const SavePlan plan = dist.on_every_rank("plan", [&] {
    std::vector<SavePlan> all;
    all.reserve(offers.size());
    for (const auto& o : offers) all.push_back(o.at("plan").get<SavePlan>());
    return create_global_save_plan(all).at(size_t(rank));
  });

  // A failure that every rank agrees on (a CheckpointException: some rank's write, or the
  // coordinator's commit before the rename, failed) removes this rank's data file. A failed
  // collective (a peer died, the network broke) does not: the coordinator may have committed
  // before it died or may still commit, and the next save removes what this one left
  // (NOTE: [Crash consistency of save]). unlink leaves a directory in the file's way.
  const std::string own_file = (fs::path(dir) / data_file_name(rank, save_id)).string();
  std::string after_commit_error;
  Metadata m;
  try {
    std::vector<std::vector<WriteResult>> written =
        dist.all_gather("write", [&] { return write_items(local, plan, dir, rank, save_id, opts); });
    m = dist.on_every_rank("commit", [&] { return build_metadata(written, save_id, opts); });
    after_commit_error = dist.broadcast("commit", [&] { return commit(m, dir, opts, rank); });
  } catch (const CheckpointException&) {
    if (!plan.items.empty()) ::unlink(own_file.c_str());
    throw;
  }
  if (!after_commit_error.empty()) {
    throw CheckpointException("commit",
                              {{dist.coordinator_rank(), WrappedException{"c10::Error", after_commit_error}}});
  }
  return m;
}

bool is_fake_world(const comm::GroupPtr& group) { return group && group->backend() == "fake"; }

// This rank's items, or the error collecting them.
std::pair<std::vector<LocalItem>, std::exception_ptr> collect_or_error(const StateDict& state_dict) {
  try {
    return {collect_local_items(state_dict), nullptr};
  } catch (...) {
    return {{}, std::current_exception()};
  }
}

// A fake world's ranks hold no data (or, on CPU tensors, only this rank's): nothing to write.
void refuse_fake_world(const comm::GroupPtr& group, const char* what) {
  TORCH_CHECK(!is_fake_world(group), "checkpoint::", what, ": the process group is a fake world (backend 'fake', ",
              "rank ", group->rank(), " of ", group->size(), "): it has no other ranks' data to write; ",
              "checkpoint::plan_save plans the save without writing");
}

}  // namespace

Metadata save(const StateDict& state_dict, const std::string& checkpoint_dir, const SaveOptions& options) {
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  comm::GroupPtr group = resolve_group(use_dist, options.process_group);
  refuse_fake_world(group, "save");
  // A rank that failed still takes part in the plan step, which reports the error everywhere.
  auto [local, collect_error] = collect_or_error(state_dict);
  return save_items(local, collect_error, checkpoint_dir, options, use_dist, group);
}


// NOTE: [Checkpoint plans]
// plan_save runs save's planning step (collect_local_items, the all_gather of the local plans,
// create_global_save_plan) and lays each rank's part out as write_items would, without
// writing. On a real group the other ranks' plans come from the all_gather. On a fake world
// (comm::FakeGroup) its all_gather would give this rank's plan N times, so every other rank's
// plan is derived instead from what the state dict says of it:
//   - a DTensor: the box compute_local_shape_and_global_offset gives at that rank's mesh
//     coordinate (nothing for a rank outside the mesh), as collect_local_items takes at its own;
//   - a ShardedTensor: the shards its metadata places on that rank;
//   - a plain tensor or an object: the same on every rank (save's assumption for them); an
//     object's stored size is this rank's pickle's.
// The test that plan_save on a fake world gives each real rank's plan, and that the real save
// commits the planned metadata, is suites/checkpoint/plan_test.cpp.
//
// Cost: the coordinator's merge is O(N x items) for N ranks (as save's is on a real job); on a
// fake world every rank's plan is built in this one process.

namespace {

// The flat position in `mesh` of each global rank, per mesh (the same mesh tensor is shared by
// every DTensor on it).
class MeshPositions {
 public:
  // The coordinate of global rank `g` in `mesh`, nullopt when it is not in it.
  std::optional<std::vector<int64_t>> coordinate(const DeviceMesh& mesh, int g) {
    const at::Tensor& ranks = mesh.mesh();
    auto [it, inserted] = by_mesh_.try_emplace(ranks.unsafeGetTensorImpl());
    if (inserted) {
      const int64_t* r = ranks.data_ptr<int64_t>();
      const comm::GroupPtr& world = mesh.world();
      for (int64_t i = 0; i < ranks.numel(); ++i) {
        const int global = world ? world->global_ranks().at(size_t(r[i])) : int(r[i]);
        it->second.emplace(global, i);
      }
    }
    auto pos = it->second.find(g);
    if (pos == it->second.end()) return std::nullopt;
    std::vector<int64_t> coord(size_t(mesh.ndim()));
    int64_t flat = pos->second;
    for (int64_t d = mesh.ndim() - 1; d >= 0; --d) {
      coord[size_t(d)] = flat % mesh.size(d);
      flat /= mesh.size(d);
    }
    return coord;
  }

 private:
  std::unordered_map<const void*, std::unordered_map<int, int64_t>> by_mesh_;
};

// This rank's items by key.
using ItemsByKey = std::unordered_map<std::string_view, std::vector<const WriteItem*>>;

// The items global rank `g` offers to save, derived from the state dict's specs (NOTE:
// [Checkpoint plans]); `own_items` are this rank's, whose plain tensors and objects every rank
// offers alike.
SavePlan derived_plan(const StateDict& state_dict, int g, const ItemsByKey& own_items, MeshPositions& positions) {
  SavePlan p;
  auto add_dtensor = [&](const std::string& fqn, const at::Tensor& t) {
    const DTensorSpec& spec = get_spec(t);
    const auto coord = positions.coordinate(spec.mesh, g);
    if (!coord) return;
    std::vector<Placement> ps = spec.placements;
    for (auto& pl : ps) {
      if (std::holds_alternative<Partial>(pl)) pl = Replicate{};
    }
    const std::vector<int64_t> global(t.sizes().begin(), t.sizes().end());
    auto [shape, offset] = compute_local_shape_and_global_offset(t.sizes(), spec.mesh.shape(), ps, coord);
    ChunkMeta box{offset, shape};
    if (t.numel() == 0) box = ChunkMeta{zeros_like_dims(global.size()), global};
    if (box.numel() == 0 && t.numel() != 0) return;
    p.items.push_back(tensor_item(fqn, t, global, std::move(box)));
  };
  for (const auto& [fqn, value] : state_dict) {
    const at::Tensor* t = std::get_if<at::Tensor>(&value);
    const auto* iv = std::get_if<c10::IValue>(&value);
    at::Tensor from_ivalue;
    if (iv && iv->isTensor()) {
      from_ivalue = iv->toTensor();
      t = &from_ivalue;
    }
    if (t && is_dtensor(*t)) {
      add_dtensor(fqn, *t);
    } else if (const auto* st = std::get_if<sharded::ShardedTensor>(&value)) {
      const std::vector<int64_t> global = st->size();
      const auto& props = st->metadata().tensor_properties;
      const at::Tensor like = at::empty({0}, at::TensorOptions().dtype(props.dtype).device(c10::kMeta));
      for (const auto& sm : st->metadata().shards_metadata) {
        if (!sm.placement() || sm.placement()->rank() != std::optional<int>(g)) continue;
        ChunkMeta box{sm.shard_offsets(), sm.shard_sizes()};
        if (box.numel() == 0) continue;
        p.items.push_back(tensor_item(fqn, like, global, std::move(box)));
      }
    } else {
      // A plain tensor or an object: this rank's item, offered by every rank.
      auto it = own_items.find(fqn);
      if (it == own_items.end()) continue;
      for (const WriteItem* w : it->second) p.items.push_back(*w);
    }
  }
  return p;
}

// The results write_items would give for `plan` on `rank` (objects sized by `object_bytes`).
std::vector<WriteResult> planned_results(const SavePlan& plan, int rank, const std::map<std::string, int64_t>& object_bytes) {
  std::vector<WriteResult> out;
  const std::string name = data_file_name(rank, /*save_id=*/1);
  int64_t offset = 0;
  for (const auto& w : plan.items) {
    StoredChunk sc;
    sc.file = name;
    sc.offset = offset;
    if (w.kind == ItemKind::Object) {
      sc.length = object_bytes.at(w.fqn);
    } else {
      sc.chunk = w.chunk;
      sc.length = w.nbytes;
    }
    offset += sc.length;
    out.push_back({w, std::move(sc)});
  }
  return out;
}

}  // namespace

PlannedSave plan_save(const StateDict& state_dict, const SaveOptions& options) {
  TORCH_CHECK(options.format == CheckpointFormat::kDtensorCpp,
              "checkpoint::plan_save plans the dtensor-cpp format (CheckpointFormat::kDtensorCpp) only: the byte "
              "layout of PyTorch's DCP and of safetensors files depends on the data");
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  comm::GroupPtr group = resolve_group(use_dist, options.process_group);
  DistWrapper dist(group, use_dist, options.coordinator_rank);
  const int rank = dist.get_rank();
  std::vector<LocalItem> local;
  std::exception_ptr collect_error;
  std::tie(local, collect_error) = collect_or_error(state_dict);  // captured below: no bindings
  // This rank's offer: its items and the pickled size of each of its objects.
  using Offer = std::pair<SavePlan, std::map<std::string, int64_t>>;
  auto own_offer = [&] {
    if (collect_error) std::rethrow_exception(collect_error);
    Offer o;
    for (const auto& li : local) {
      o.first.items.push_back(li.item);
      if (li.item.kind == ItemKind::Object)
        o.second[li.item.fqn] = int64_t(torch::jit::pickle_save(li.object).size());
    }
    return o;
  };
  std::vector<SavePlan> plans;
  std::vector<std::map<std::string, int64_t>> object_bytes;
  if (use_dist && is_fake_world(group)) {
    Offer own;
    try {
      own = own_offer();
    } catch (...) {
      throw CheckpointException("plan", {{rank, wrap_exception(std::current_exception())}});
    }
    MeshPositions positions;
    ItemsByKey own_items;
    for (const auto& w : own.first.items) own_items[w.fqn].push_back(&w);
    const std::vector<int>& global_ranks = group->global_ranks();
    plans.reserve(global_ranks.size());
    for (int r = 0; r < int(global_ranks.size()); ++r) {
      plans.push_back(r == rank ? own.first : derived_plan(state_dict, global_ranks[size_t(r)], own_items, positions));
    }
    object_bytes.assign(plans.size(), own.second);
  } else {
    std::vector<nlohmann::json> offers = dist.all_gather("plan", [&] {
      Offer o = own_offer();
      return nlohmann::json{{"plan", o.first}, {"object_bytes", o.second}};
    });
    for (const auto& o : offers) {
      plans.push_back(o.at("plan").get<SavePlan>());
      object_bytes.push_back(o.at("object_bytes").get<std::map<std::string, int64_t>>());
    }
  }
  return dist.on_every_rank("plan", [&] {
    std::vector<SavePlan> global = create_global_save_plan(plans);
    PlannedSave out;
    std::vector<std::vector<WriteResult>> results;
    for (int r = 0; r < int(global.size()); ++r) {
      results.push_back(planned_results(global[size_t(r)], r, object_bytes[size_t(r)]));
      int64_t bytes = 0;
      for (const auto& wr : results.back()) bytes += wr.stored.length;
      out.bytes_per_rank.push_back(bytes);
    }
    out.metadata = build_metadata(results, /*save_id=*/1, options, /*planned=*/true);
    out.plan = std::move(global.at(size_t(rank)));
    return out;
  });
}


std::future<Metadata> async_save(const StateDict& state_dict, const std::string& checkpoint_dir,
                                 const SaveOptions& options) {
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  comm::GroupPtr group = resolve_group(use_dist, options.process_group);
  refuse_fake_world(group, "async_save");
  std::vector<LocalItem> staged;
  std::exception_ptr stage_error;
  try {
    staged = collect_local_items(state_dict);
  } catch (...) {
    stage_error = std::current_exception();
  }
  // The buffers are held (busy) from here until the background write is done (released by
  // the guard below).
  std::shared_ptr<StagingBuffers> staging = options.staging;
  if (staging) {
    staging->impl().acquire();
  } else if (options.cache_staging && !stage_error) {
    staging = take_cached_staging(layout_of(staged));
  }
  std::shared_ptr<StagingBuffers> release;
  if (staging) release.reset(staging.get(), [staging](StagingBuffers* s) { s->impl().release(); });
  if (!stage_error) {
    try {
      staged = stage(std::move(staged), staging ? &staging->impl() : nullptr);
    } catch (...) {
      stage_error = std::current_exception();
    }
  }
  return std::async(std::launch::async, [staged = std::move(staged), stage_error, checkpoint_dir, options, use_dist,
                                         group, release]() mutable {
    auto done = std::move(release);  // released when this returns or throws
    return save_items(staged, stage_error, checkpoint_dir, options, use_dist, group);
  });
}

}  // namespace checkpoint
}  // namespace dtensor
