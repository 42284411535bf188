// dtensor/checkpoint/save_load.cpp: save, load and async_save (see save_load.h).
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

namespace dtensor {
namespace checkpoint {

namespace fs = std::filesystem;

std::string detail::join_keys(const std::vector<std::string>& keys) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < keys.size(); ++i) os << (i ? ", " : "") << "'" << keys[i] << "'";
  os << "]";
  return os.str();
}

namespace {

using detail::join_keys;

const char* kMetadataFile = ".metadata";

std::string sizes_str(const std::vector<int64_t>& v) { return detail::int_list_string(v); }


// ---- what this rank holds -------------------------------------------------------------------

using detail::errno_str;
using detail::fsync_path;
using detail::LocalItem;
using detail::resolve_group;
using detail::resolve_use_dist;
using detail::write_all;
using detail::WriteResult;

// A DTensor's chunk on this rank: {box, local tensor}; nullopt when this rank is not in its
// mesh. Partial placements must have been reduced.
struct DTensorChunk {
  ChunkMeta box;
  at::Tensor local;
};
std::optional<DTensorChunk> dtensor_chunk(const at::Tensor& t) {
  const DTensorSpec& spec = get_spec(t);
  if (!spec.mesh.get_coordinate()) return std::nullopt;
  auto [shape, offset] = compute_local_shape_and_global_offset(t.sizes(), spec.mesh, spec.placements);
  return DTensorChunk{ChunkMeta{offset, shape}, local_tensor(t)};
}

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

// `src` into `dst` (contiguous, CPU, same dtype and shape).
void copy_into(at::Tensor& dst, const at::Tensor& src) {
  if (src.device().is_cpu() && src.is_contiguous() && src.scalar_type() == dst.scalar_type()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
  } else {
    dst.copy_(src);
  }
}

}  // namespace

struct StagingBuffers::Impl {
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false;  // an async_save stages into or writes from the buffers
  // Written only by the holder (busy); under `mu` so that nbytes() may read it meanwhile.
  std::map<std::pair<std::string, ChunkMeta>, at::Tensor> buffers;
  // The layout last staged (layout_of), read by the staging cache only while not busy.
  std::string layout;

  void acquire() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return !busy; });
    busy = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu);
      busy = false;
    }
    cv.notify_all();
  }
};

namespace {

// Every staged chunk's key, box and dtype: two state dicts with the same layout stage into the
// same buffers.
std::string layout_of(const std::vector<LocalItem>& items) {
  std::ostringstream os;
  for (const auto& li : items) {
    if (li.data.defined()) os << li.item.fqn << '\0' << li.item.chunk.to_string() << li.item.dtype << '\n';
  }
  return os.str();
}

// Copies of every tensor's data on the CPU (async_save's staging), in `reuse`'s buffers when
// it has ones of the same key, chunk, dtype and shape; `reuse` (held by the caller) then holds
// this save's buffers, and only those.
std::vector<LocalItem> stage(std::vector<LocalItem> items, StagingBuffers::Impl* reuse) {
  std::map<std::pair<std::string, ChunkMeta>, at::Tensor> kept;
  c10::AutoGradMode no_grad(false);
  for (auto& li : items) {
    if (!li.data.defined()) continue;
    const at::Tensor src = li.data.detach();
    at::Tensor buf;
    if (reuse) {
      auto it = reuse->buffers.find({li.item.fqn, li.item.chunk});
      if (it != reuse->buffers.end() && it->second.scalar_type() == src.scalar_type() &&
          it->second.sizes() == src.sizes()) {
        buf = it->second;
      }
    }
    if (!buf.defined()) buf = at::empty(src.sizes(), src.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous));
    copy_into(buf, src);
    li.data = buf;
    if (reuse) kept[{li.item.fqn, li.item.chunk}] = buf;
  }
  if (reuse) {
    std::lock_guard<std::mutex> lk(reuse->mu);
    reuse->buffers = std::move(kept);
    reuse->layout = layout_of(items);
  }
  return items;
}

// The process's staging cache (SaveOptions::cache_staging). Never destroyed: background saves
// may still hold sets when the process exits.
struct StagingCache {
  std::mutex mu;
  std::vector<std::shared_ptr<StagingBuffers>> sets;
};
StagingCache& staging_cache() {
  static auto* cache = new StagingCache;
  return *cache;
}

// A set of the cache, acquired (busy): a free one that staged `layout` last, else any free one,
// else a new one.
std::shared_ptr<StagingBuffers> take_cached_staging(const std::string& layout) {
  StagingCache& c = staging_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  std::shared_ptr<StagingBuffers> any_free;
  for (const auto& s : c.sets) {
    StagingBuffers::Impl& im = s->impl();
    std::lock_guard<std::mutex> slk(im.mu);
    if (im.busy) continue;
    if (im.layout == layout) {
      im.busy = true;
      return s;
    }
    if (!any_free) any_free = s;
  }
  if (!any_free) {
    any_free = std::make_shared<StagingBuffers>();
    c.sets.push_back(any_free);
  }
  std::lock_guard<std::mutex> slk(any_free->impl().mu);
  any_free->impl().busy = true;
  return any_free;
}


// ---- files ------------------------------------------------------------------------------------


std::string data_file_name(int rank, int64_t save_id) {
  return "__" + std::to_string(rank) + "_" + std::to_string(save_id) + ".distcp";
}


// Writes this rank's share (`plan`) of `local` to its data file.
std::vector<WriteResult> write_items(const std::vector<LocalItem>& local, const SavePlan& plan,
                                     const std::string& dir, int rank, int64_t save_id, const SaveOptions& opts) {
  std::vector<WriteResult> results;
  if (plan.items.empty()) return results;
  std::map<std::pair<std::string, ChunkMeta>, const LocalItem*> by_key;
  for (const auto& li : local) by_key[{li.item.fqn, li.item.chunk}] = &li;

  const std::string name = data_file_name(rank, save_id);
  const std::string path = (fs::path(dir) / name).string();
  detail::save_fault_point(detail::SaveFaultPoint::kBeforeData, rank);
  // O_EXCL: a new file, never one already there (a committed checkpoint's data file, or a link
  // leading out of the directory: O_EXCL does not follow it). next_save_id chose a name no
  // entry of the directory has.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::error_code ec;
    const std::string why = errno != EEXIST ? errno_str()
                            : fs::is_directory(fs::symlink_status(path, ec)) ? "a directory is in its way"
                                                                              : "a file of that name appeared meanwhile";
    TORCH_CHECK(false, "cannot create data file '", path, "': ", why);
  }
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};

  const int64_t block = opts.checksum_block_bytes;
  const bool dcp = opts.format == CheckpointFormat::kPyTorchDcp;
  int64_t offset = 0;
  bool first_block = true;
  for (const auto& w : plan.items) {
    auto it = by_key.find({w.fqn, w.chunk});
    TORCH_CHECK(it != by_key.end(), "the global plan gave rank ", rank, " key '", w.fqn, "' chunk ",
                w.chunk.to_string(), ", which it does not hold");
    const LocalItem& li = *it->second;
    std::vector<char> pickled;
    at::Tensor contiguous;
    const char* bytes = nullptr;
    int64_t n = 0;
    StoredChunk sc;
    sc.chunk = w.kind == ItemKind::Tensor ? w.chunk : ChunkMeta{};
    sc.file = name;
    sc.offset = offset;
    if (w.kind == ItemKind::Object) {
      pickled = torch::jit::pickle_save(li.object);
      bytes = pickled.data();
      n = int64_t(pickled.size());
      sc.length = n;
    } else {
      contiguous = li.data.detach().to(at::kCPU).contiguous();
      if (dcp) {
        // A torch.save stream of the chunk alone (a view would bring its whole storage).
        if (contiguous.storage_offset() != 0 || int64_t(contiguous.storage().nbytes()) != int64_t(contiguous.nbytes()))
          contiguous = contiguous.clone();
        pickled = torch::jit::pickle_save(contiguous);
        bytes = pickled.data();
        n = int64_t(pickled.size());
        sc.offset = offset + (contiguous.nbytes() > 0 ? int64_t(detail::tensor_bytes_offset(pickled)) : 0);
        sc.length = int64_t(contiguous.nbytes());
        sc.stream_offset = offset;
        sc.stream_length = n;
      } else {
        bytes = static_cast<const char*>(contiguous.data_ptr());
        n = int64_t(contiguous.nbytes());
        sc.length = n;
      }
    }
    // Checksum and write one block at a time (the block is still in the cache when written).
    for (int64_t b = 0; b < n; b += block) {
      const int64_t len = std::min(block, n - b);
      if (!dcp) sc.crc32.push_back(crc32(bytes + b, size_t(len)));
      write_all(fd, bytes + b, len, path);
      if (first_block) detail::save_fault_point(detail::SaveFaultPoint::kMidData, rank);
      first_block = false;
    }
    offset += n;
    results.push_back({w, sc});
    if (opts.on_item_written) opts.on_item_written(w.fqn, n);
  }
  if (opts.sync_files) TORCH_CHECK(::fsync(fd) == 0, "cannot sync '", path, "': ", errno_str());
  closer.fd = -1;
  TORCH_CHECK(::close(fd) == 0, "cannot close '", path, "': ", errno_str());
  detail::save_fault_point(detail::SaveFaultPoint::kAfterData, rank);
  return results;
}

// The metadata of a save from every rank's write results (every rank builds the same).
Metadata build_metadata(const std::vector<std::vector<WriteResult>>& all, int64_t save_id, const SaveOptions& opts) {
  Metadata m;
  m.save_id = save_id;
  m.world_size = int(all.size());
  m.checksum_block_bytes = opts.checksum_block_bytes;
  m.checksummed = opts.format == CheckpointFormat::kDtensorCpp;
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

// ---- reading ----------------------------------------------------------------------------------

class Reader {
 public:
  // Checked reads go in pieces of this many bytes (a quarter of a core's L2 cache here).
  static constexpr int64_t kPiece = int64_t(256) << 10;

  // verify: check each block read against the chunk's checksums (false: chunks without any).
  Reader(std::string dir, int64_t block, bool verify) : dir_(std::move(dir)), block_(block), verify_(verify) {}
  ~Reader() {
    for (auto& [name, file] : files_) ::close(file.fd);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // Bytes [from, to) of the stored chunk into `out` (to - from bytes), verifying the checksum
  // of every block that holds them. The blocks that lie wholly inside the range are read
  // straight into `out` and checked there; the partial blocks at either end go through a
  // scratch buffer.
  void read(const std::string& fqn, const StoredChunk& sc, int64_t from, int64_t to, char* out) {
    if (to <= from) return;
    const OpenFile& file = open_file(fqn, sc);
    const int fd = file.fd;
    const std::string& path = file.path;
    if (!verify_) {
      read_exact(fd, path, fqn, sc, from, to, out);
      return;
    }
    const int64_t first_block = from / block_;
    const int64_t end_block = (to + block_ - 1) / block_;
    // Whole blocks inside [from, to): [mid_lo, mid_hi) (the chunk's last block ends at its end).
    const int64_t mid_lo = (from % block_ == 0) ? from : (first_block + 1) * block_;
    const int64_t mid_hi = (to == sc.length || to % block_ == 0) ? to : (to / block_) * block_;
    // One block at a time, in pieces of at most kPiece bytes, each checksummed right after it is
    // read while it is still in the core's cache (a whole block read first would have left
    // the cache by the time the checksum reaches its end).
    for (int64_t b = mid_lo; b < mid_hi; b += block_) {
      const int64_t n = std::min(block_, mid_hi - b);
      char* p = out + (b - from);
      uint32_t c = 0;
      for (int64_t s = 0; s < n; s += kPiece) {
        const int64_t len = std::min(kPiece, n - s);
        read_exact(fd, path, fqn, sc, b + s, b + s + len, p + s);
        c = crc32(p + s, size_t(len), c);
      }
      check(path, fqn, sc, b, n, c);
    }
    for (int64_t blk = first_block; blk < end_block; ++blk) {
      const int64_t bs = blk * block_;
      const int64_t be = std::min(bs + block_, sc.length);
      if (mid_lo < mid_hi && bs >= mid_lo && be <= mid_hi) continue;  // read above
      scratch_.resize(size_t(be - bs));
      read_exact(fd, path, fqn, sc, bs, be, scratch_.data());
      check(path, fqn, sc, bs, be - bs, crc32(scratch_.data(), size_t(be - bs)));
      const int64_t lo = std::max(bs, from), hi = std::min(be, to);
      std::memcpy(out + (lo - from), scratch_.data() + (lo - bs), size_t(hi - lo));
    }
  }

  // Throws unless the stored chunk's bytes lie inside its file: called before allocating
  // memory for them, whose size comes from the metadata (NOTE: [Sizes from files]).
  void check_in_file(const std::string& fqn, const StoredChunk& sc) {
    const OpenFile& file = open_file(fqn, sc);
    TORCH_CHECK(sc.offset + sc.length <= file.size, "data file '", file.path, "' is truncated: key '", fqn,
                "' (chunk ", sc.chunk.to_string(), ") needs bytes [", sc.offset, ", ", sc.offset + sc.length,
                ") of it, the file ends at ", file.size);
  }

 private:
  struct OpenFile {
    int fd;
    std::string path;
    int64_t size;  // when opened
  };

  void read_exact(int fd, const std::string& path, const std::string& fqn, const StoredChunk& sc, int64_t lo,
                  int64_t hi, char* p) {
    int64_t got = 0;
    while (got < hi - lo) {
      ssize_t r = ::pread(fd, p + got, size_t(hi - lo - got), off_t(sc.offset + lo + got));
      if (r < 0 && errno == EINTR) continue;
      TORCH_CHECK(r >= 0, "cannot read '", path, "' (key '", fqn, "'): ", errno_str());
      if (r == 0) break;
      got += r;
    }
    TORCH_CHECK(got == hi - lo, "data file '", path, "' is truncated: key '", fqn, "' (chunk ", sc.chunk.to_string(),
                ") needs bytes [", sc.offset + lo, ", ", sc.offset + hi, ") of it, the file ends at ",
                sc.offset + lo + got);
  }

  // `c`: the CRC-32 of the block at [b, b + n) of the chunk.
  void check(const std::string& path, const std::string& fqn, const StoredChunk& sc, int64_t b, int64_t n,
             uint32_t c) {
    const uint32_t want = sc.crc32.at(size_t(b / block_));
    TORCH_CHECK(c == want, "checksum mismatch in data file '", path, "': key '", fqn, "' (chunk ", sc.chunk.to_string(),
                "), bytes [", sc.offset + b, ", ", sc.offset + b + n, ") have crc32 ", c, ", the metadata says ", want,
                " (the file is corrupted)");
  }

  // The chunk's file, opened once.
  const OpenFile& open_file(const std::string& fqn, const StoredChunk& sc) {
    auto it = files_.find(sc.file);
    if (it != files_.end()) return it->second;
    std::string path = (fs::path(dir_) / sc.file).string();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    TORCH_CHECK(fd >= 0, "cannot open data file '", path, "' (key '", fqn, "'): ", errno_str());
    struct stat st;
    const std::string why = ::fstat(fd, &st) != 0 ? errno_str() : S_ISREG(st.st_mode) ? "" : "not a regular file";
    if (!why.empty()) {
      ::close(fd);
      TORCH_CHECK(false, "cannot read data file '", path, "' (key '", fqn, "'): ", why);
    }
    return files_.emplace(sc.file, OpenFile{fd, std::move(path), int64_t(st.st_size)}).first->second;
  }

  std::string dir_;
  int64_t block_;
  bool verify_;
  std::map<std::string, OpenFile> files_;
  std::vector<char> scratch_;
};

// Copies the part of the saved entry `e` that overlaps `box` into `target` (which holds box).
// An overlap that is one run of bytes in the stored chunk and in a contiguous CPU target (the
// same layout, or row blocks of it) is read straight into the target's memory; others are
// read into a buffer and copied with strides. (The overlap is computed in place, as
// chunk_overlap does, without allocating: this runs for every stored chunk of every key.)
void read_into(Reader& reader, const std::string& fqn, const Entry& e, const ChunkMeta& box, const at::Tensor& target) {
  const at::ScalarType dtype = dtype_from_name(e.dtype);
  const int64_t esize = int64_t(c10::elementSize(dtype));
  const size_t nd = box.offsets.size();
  c10::SmallVector<int64_t, 8> lo(nd), len(nd), strides(nd);
  for (const auto& sc : e.chunks) {
    if (sc.chunk.offsets.size() != nd) continue;
    bool overlaps = true, whole_box = true;
    for (size_t d = 0; d < nd && overlaps; ++d) {
      lo[d] = std::max(sc.chunk.offsets[d], box.offsets[d]);
      const int64_t hi = std::min(sc.chunk.offsets[d] + sc.chunk.sizes[d], box.offsets[d] + box.sizes[d]);
      overlaps = hi > lo[d];
      len[d] = hi - lo[d];
      whole_box = whole_box && lo[d] == box.offsets[d] && len[d] == box.sizes[d];
    }
    if (!overlaps) continue;
    int64_t numel = 1, first = 0, last = 0;
    for (size_t i = nd; i-- > 0;) {
      strides[i] = (i + 1 < nd) ? strides[i + 1] * sc.chunk.sizes[i + 1] : 1;
      const int64_t in_chunk = lo[i] - sc.chunk.offsets[i];
      first += in_chunk * strides[i];
      last += (in_chunk + len[i] - 1) * strides[i];
      numel *= len[i];
    }
    at::Tensor dst = target;
    if (!whole_box) {  // a part of the target (no views when it is the whole: the same layout)
      for (size_t d = 0; d < nd; ++d) dst = dst.narrow(int64_t(d), lo[d] - box.offsets[d], len[d]);
    }
    if (last - first + 1 == numel && dst.device().is_cpu() && dst.scalar_type() == dtype && dst.is_contiguous()) {
      reader.read(fqn, sc, first * esize, (last + 1) * esize, static_cast<char*>(dst.data_ptr()));
      if (!dst.is_inference()) dst.unsafeGetTensorImpl()->bump_version();
      continue;
    }
    at::Tensor buf = at::empty({last - first + 1}, at::TensorOptions().dtype(dtype));
    reader.read(fqn, sc, first * esize, (last + 1) * esize, static_cast<char*>(buf.data_ptr()));
    dst.copy_(buf.as_strided(c10::IntArrayRef(len.data(), nd), c10::IntArrayRef(strides.data(), nd), 0));
  }
}

// libtorch's unpickler (torch::jit::pickle_load) on stored bytes; its errors (c10::Error,
// std::runtime_error, ...) as a c10::Error that names the key and `where` the bytes are.
c10::IValue unpickle(const std::vector<char>& bytes, const std::string& fqn, const std::string& where) {
  detail::check_pickled_value(bytes.data(), bytes.size(), "cannot read the value of key '" + fqn + "' from " + where);
  try {
    return torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot read the value of key '", fqn, "' from ", where, ": ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cannot read the value of key '", fqn, "' from ", where, ": ", e.what());
  }
}

c10::IValue read_object(Reader& reader, const detail::ReadSource& src, const std::string& fqn, const Entry& e) {
  const StoredChunk& sc = e.chunks.at(0);
  if (sc.file.empty()) {
    auto it = src.inline_objects.find(fqn);
    TORCH_CHECK(it != src.inline_objects.end(), "key '", fqn, "' of ", src.what, " has no data file");
    return unpickle(it->second, fqn, src.what);
  }
  reader.check_in_file(fqn, sc);
  std::vector<char> bytes(size_t(sc.length));
  reader.read(fqn, sc, 0, sc.length, bytes.data());
  return unpickle(bytes, fqn,
                  "data file '" + (fs::path(src.dir) / sc.file).string() + "' (bytes [" + std::to_string(sc.offset) +
                      ", " + std::to_string(sc.offset + sc.length) + "))");
}

}  // namespace

LoadResult detail::load_local(StateDict& state_dict, const ReadSource& src, const LoadOptions& opts) {
  const Metadata& m = *src.metadata;
  LoadResult res;
  // The keys of both sides in one walk (both maps are sorted by key): the matched ones, the
  // missing and the unexpected ones.
  struct Match {
    const std::string* fqn;
    StateDictValue* value;
    const Entry* entry;
  };
  std::vector<Match> matched;
  matched.reserve(std::min(state_dict.size(), m.entries.size()));
  {
    auto s = state_dict.begin();
    auto e = m.entries.begin();
    while (s != state_dict.end() || e != m.entries.end()) {
      if (e == m.entries.end() || (s != state_dict.end() && s->first < e->first)) {
        res.missing_keys.push_back((s++)->first);
      } else if (s == state_dict.end() || e->first < s->first) {
        res.unexpected_keys.push_back((e++)->first);
      } else {
        matched.push_back({&s->first, &s->second, &e->second});
        ++s;
        ++e;
      }
    }
  }
  if (opts.strict && (!res.missing_keys.empty() || !res.unexpected_keys.empty())) {
    std::ostringstream os;
    os << "the state dict and " << src.what << " have different keys (strict load):";
    if (!res.missing_keys.empty()) os << " missing from the checkpoint: " << join_keys(res.missing_keys) << ";";
    if (!res.unexpected_keys.empty()) os << " not in the state dict: " << join_keys(res.unexpected_keys) << ";";
    TORCH_CHECK(false, os.str());
  }

  // Check every key first, then read.
  struct Dest {
    const std::string* fqn;
    const Entry* entry;
    ChunkMeta box;
    at::Tensor target;
  };
  std::vector<Dest> dests;
  dests.reserve(matched.size());
  std::vector<const Match*> objects;
  std::vector<std::string> errors;
  Reader reader(src.dir, m.checksum_block_bytes, src.verify_checksums && opts.verify_checksums);
  auto check_tensor = [&](const std::string& fqn, const Entry& e, at::ScalarType dtype, c10::IntArrayRef size) {
    if (e.kind != ItemKind::Tensor) {
      errors.push_back("key '" + fqn + "' is an object in the checkpoint but a tensor in the state dict");
      return false;
    }
    if (dtype_name(dtype) != e.dtype) {
      errors.push_back("key '" + fqn + "' has dtype " + dtype_name(dtype) + " in the state dict but " + e.dtype +
                       " in the checkpoint");
      return false;
    }
    if (size != c10::IntArrayRef(e.size)) {
      errors.push_back("key '" + fqn + "' has shape " + sizes_str(size.vec()) + " in the state dict but " +
                       sizes_str(e.size) + " in the checkpoint");
      return false;
    }
    return true;
  };
  for (const Match& mt : matched) {
    const std::string& fqn = *mt.fqn;
    StateDictValue& v = *mt.value;
    const Entry& e = *mt.entry;
    if (auto* iv = std::get_if<c10::IValue>(&v)) {
      if (iv->isTensor()) {
        v = iv->toTensor();
      } else if (e.kind == ItemKind::Tensor && iv->isNone()) {
        // A None placeholder receives the whole tensor: its chunks' bytes (which tile it) must
        // be in their files before it is allocated.
        for (const auto& sc : e.chunks) reader.check_in_file(fqn, sc);
        v = at::empty(e.size, at::TensorOptions().dtype(dtype_from_name(e.dtype)));
      } else {
        if (e.kind != ItemKind::Object) {
          errors.push_back("key '" + fqn + "' is a tensor in the checkpoint but a " + iv->tagKind() +
                           " in the state dict");
        } else {
          objects.push_back(&mt);
        }
        continue;
      }
    }
    if (auto* t = std::get_if<at::Tensor>(&v)) {
      TORCH_CHECK(t->defined(), "checkpoint: key '", fqn, "' is an undefined tensor");
      if (!check_tensor(fqn, e, t->scalar_type(), t->sizes())) continue;
      if (is_dtensor(*t)) {
        const DTensorSpec& spec = get_spec(*t);
        if (spec.has_partial()) {
          errors.push_back("key '" + fqn + "' is a DTensor with a Partial placement (" + spec.to_string() +
                           "): load into Shard or Replicate placements");
          continue;
        }
        auto c = dtensor_chunk(*t);
        if (c && c->box.numel() > 0) dests.push_back({&fqn, &e, std::move(c->box), std::move(c->local)});
      } else {
        dests.push_back({&fqn, &e, ChunkMeta{zeros_like_dims(size_t(t->dim())), t->sizes().vec()}, *t});
      }
    } else if (auto* st = std::get_if<sharded::ShardedTensor>(&v)) {
      if (!check_tensor(fqn, e, st->dtype(), st->size())) continue;
      for (const auto& shard : st->local_shards()) {
        ChunkMeta box{shard.metadata.shard_offsets(), shard.metadata.shard_sizes()};
        if (box.numel() > 0) dests.push_back({&fqn, &e, std::move(box), shard.tensor});
      }
    }
  }
  if (!errors.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < errors.size(); ++i) os << (i ? "; " : "") << errors[i];
    TORCH_CHECK(false, os.str());
  }

  c10::AutoGradMode no_grad(false);
  for (const auto& d : dests) read_into(reader, *d.fqn, *d.entry, d.box, d.target);
  for (const Match* o : objects) *o->value = read_object(reader, src, *o->fqn, *o->entry);
  return res;
}

namespace {

std::vector<std::string> merged(const std::vector<LoadResult>& all, bool missing) {
  std::set<std::string> s;
  for (const auto& r : all) {
    const auto& v = missing ? r.missing_keys : r.unexpected_keys;
    s.insert(v.begin(), v.end());
  }
  return {s.begin(), s.end()};
}

}  // namespace

void to_json(nlohmann::json& j, const LoadResult& r) {
  j = {{"missing_keys", r.missing_keys}, {"unexpected_keys", r.unexpected_keys}};
}
void from_json(const nlohmann::json& j, LoadResult& r) {
  j.at("missing_keys").get_to(r.missing_keys);
  j.at("unexpected_keys").get_to(r.unexpected_keys);
}

Metadata read_metadata(const std::string& checkpoint_dir) {
  if (detail::is_huggingface_checkpoint(checkpoint_dir)) {
    detail::SafetensorsSource s;
    detail::read_safetensors_source(checkpoint_dir, nullptr, s);
    return std::move(s.metadata);
  }
  const std::string path = (fs::path(checkpoint_dir) / kMetadataFile).string();
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "no checkpoint in '", checkpoint_dir, "': cannot open its metadata file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  Metadata m;
  try {
    m = detail::is_dcp_metadata(text) ? detail::read_dcp_metadata(checkpoint_dir, text)
                                      : metadata_from_json_text(text);
    validate_metadata(m);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "checkpoint metadata file '", path, "' is not valid: ", e.what());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint metadata file '", path, "' is not valid: ", e.msg());
  }
  return m;
}

Metadata save(const StateDict& state_dict, const std::string& checkpoint_dir, const SaveOptions& options) {
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  comm::GroupPtr group = resolve_group(use_dist, options.process_group);
  std::vector<LocalItem> local;
  std::exception_ptr collect_error;
  try {
    local = collect_local_items(state_dict);
  } catch (...) {
    collect_error = std::current_exception();
  }
  // A rank that failed still takes part in the plan step, which reports the error everywhere.
  return save_items(local, collect_error, checkpoint_dir, options, use_dist, group);
}

StagingBuffers::StagingBuffers() : impl_(std::make_unique<Impl>()) {}
StagingBuffers::~StagingBuffers() = default;

int64_t StagingBuffers::nbytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  int64_t n = 0;
  for (const auto& [k, t] : impl_->buffers) n += int64_t(t.nbytes());
  return n;
}

int64_t staging_cache_bytes() {
  StagingCache& c = staging_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  int64_t n = 0;
  for (const auto& s : c.sets) n += s->nbytes();
  return n;
}

void release_staging_cache() {
  StagingCache& c = staging_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  // Sets in use stay alive (their save holds them) until their write ends.
  c.sets.clear();
}

std::future<Metadata> async_save(const StateDict& state_dict, const std::string& checkpoint_dir,
                                 const SaveOptions& options) {
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  comm::GroupPtr group = resolve_group(use_dist, options.process_group);
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

LoadResult detail::load_collective(const LoadOptions& options, const std::function<LoadResult()>& local) {
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  comm::GroupPtr group = resolve_group(use_dist, options.process_group);
  DistWrapper dist(group, use_dist, options.coordinator_rank);
  // Usually no rank failed and none has keys to report: then the step is one all_reduce.
  auto all = dist.all_gather_unless_quiet("read", local, [](const LoadResult& r) {
    return r.missing_keys.empty() && r.unexpected_keys.empty();
  });
  if (!all) return LoadResult{};
  return LoadResult{merged(*all, /*missing=*/true), merged(*all, /*missing=*/false)};
}

LoadResult load(StateDict& state_dict, const std::string& checkpoint_dir, const LoadOptions& options) {
  // One round of collectives: every rank reads the metadata itself (as PyTorch's readers do)
  // and its shards.
  if (detail::is_huggingface_checkpoint(checkpoint_dir)) return load_safetensors(state_dict, checkpoint_dir, options);
  return detail::load_collective(options, [&] {
    const Metadata m = read_metadata(checkpoint_dir);
    detail::ReadSource src;
    src.metadata = &m;
    src.dir = checkpoint_dir;
    src.verify_checksums = m.checksummed;
    src.what = "the checkpoint '" + checkpoint_dir + "'";
    return detail::load_local(state_dict, src, options);
  });
}

}  // namespace checkpoint
}  // namespace dtensor
