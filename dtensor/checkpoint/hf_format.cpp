// dtensor/checkpoint/hf_format.cpp: Hugging Face checkpoints written: the sharded save of
// every rank in parallel (save with CheckpointFormat::kHuggingFace) and the consolidation of
// shards into full tensors (consolidate_safetensors_files), in the layout of PyTorch's
// hf_storage.py and _consolidate_hf_safetensors.py. Reading them is safetensors.cpp's.
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/hf_internal.h"
#include "dtensor/checkpoint/json_internal.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <set>

namespace dtensor {
namespace checkpoint {

namespace fs = std::filesystem;
using detail::kIndexFile;
using detail::kSavedOffsetsKey;
using detail::kShardingInfoKey;
using detail::kVersionKey;
using detail::SafetensorsTensor;

namespace {

constexpr const char* kShardedDir = "sharded";

// PyTorch's _gen_file_name: "model-00001-of-00002.safetensors", and with a shard index
// "shard-00003-model-00001-of-00002.safetensors".
std::string hf_file_name(int index, int largest, int shard = 0) {
  char name[96];
  if (shard > 0) {
    std::snprintf(name, sizeof(name), "shard-%05d-model-%05d-of-%05d.safetensors", shard, index, largest);
  } else {
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", index, largest);
  }
  return name;
}

bool is_shard_file(const std::string& name) {
  static const std::regex re(R"(shard-\d{5,}-model-\d{5,}-of-\d{5,}\.safetensors)");
  return std::regex_match(name, re);
}
bool is_model_file(const std::string& name) {
  static const std::regex re(R"(model-\d{5,}-of-\d{5,}\.safetensors)");
  return std::regex_match(name, re);
}

// A private file of a save that died before its commit (the save holding the directory's lock
// removes them: no other save writes there meanwhile).
bool is_private_file(const std::string& name) {
  static const std::regex re(R"(\.(shard-.*|model-.*|model\.safetensors\.index\.json)\.[0-9a-f]{16}(-old)?\.tmp)");
  return std::regex_match(name, re);
}

// The private name a file is written under until the commit renames it.
std::string temp_path(const std::string& dir, const std::string& name, const std::string& nonce) {
  return (fs::path(dir) / ("." + name + "." + nonce + ".tmp")).string();
}

std::string fresh_nonce() {
  std::random_device rd;
  char s[24];
  std::snprintf(s, sizeof(s), "%08x%08x", unsigned(rd()), unsigned(rd()));
  return s;
}

void pwrite_all(int fd, const char* p, int64_t n, int64_t at, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, size_t(std::min<int64_t>(n, int64_t(1) << 30)), off_t(at));
    if (w < 0 && errno == EINTR) continue;
    TORCH_CHECK(w > 0, "cannot write '", path, "': ", detail::errno_str());
    p += w;
    n -= w;
    at += w;
  }
}

void pread_all(int fd, char* p, int64_t n, int64_t at, const std::string& path, const std::string& fqn) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, size_t(std::min<int64_t>(n, int64_t(1) << 30)), off_t(at));
    if (r < 0 && errno == EINTR) continue;
    TORCH_CHECK(r >= 0, "cannot read '", path, "' (key '", fqn, "'): ", detail::errno_str());
    TORCH_CHECK(r > 0, "safetensors file '", path, "' is truncated: key '", fqn, "' needs bytes up to ", at + n);
    p += r;
    n -= r;
    at += r;
  }
}

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

// Fails unless every index is at least 1 and (when given) every tensor key has one.
void check_index_mapping(const std::map<std::string, int>& mapping, const std::vector<std::string>& tensor_keys) {
  for (const auto& [k, i] : mapping) {
    TORCH_CHECK(i >= 1, "fqn_to_index_mapping gives key '", k, "' file index ", i, ": file indices count from 1");
  }
  if (mapping.empty()) return;
  for (const auto& k : tensor_keys) {
    TORCH_CHECK(mapping.count(k), "key '", k, "' is not in fqn_to_index_mapping, which must give every tensor its file");
  }
}

// Every rank computes the same layout: keys in order within each file, files by index, the
// first file's "__metadata__" holding `first_metadata` beside "format": "pt".
ConsolidatedLayout consolidated_layout(const std::map<std::string, std::pair<std::string, std::vector<int64_t>>>& tensors,
                                       const std::map<std::string, int>& mapping,
                                       const std::map<std::string, std::string>& first_metadata) {
  int largest = 1;
  for (const auto& [k, i] : mapping) largest = std::max(largest, i);
  std::map<int, std::vector<SafetensorsTensor>> by_index;
  for (const auto& [k, t] : tensors) {
    by_index[mapping.empty() ? 1 : mapping.at(k)].push_back({k, t.first, t.second});
  }
  if (by_index.empty()) by_index[1];  // objects alone: one file of metadata
  ConsolidatedLayout layout;
  for (const auto& [index, file_tensors] : by_index) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    meta["format"] = "pt";
    if (layout.files.empty()) {
      for (const auto& [k, v] : first_metadata) meta[k] = v;
    }
    std::vector<int64_t> offsets;
    LaidOutFile f;
    f.name = hf_file_name(index, largest);
    f.header = detail::safetensors_header(file_tensors, meta, &offsets);
    f.size = int64_t(f.header.size());
    for (size_t i = 0; i < file_tensors.size(); ++i) {
      const auto& t = file_tensors[i];
      int64_t bytes = element_size(t.dtype);
      for (int64_t s : t.shape) bytes *= s;
      layout.tensors[t.key] = {layout.files.size(), int64_t(f.header.size()) + offsets[i], t.dtype, t.shape};
      f.size += bytes;
      layout.total_size += bytes;
    }
    layout.files.push_back(std::move(f));
  }
  return layout;
}

// The chunk `box` of a full tensor laid out at `t` (its elements contiguous at `src`) into
// the file `fd`: one write per run of elements that is contiguous in both.
void write_box(int fd, const std::string& path, const LaidOutTensor& t, const ChunkMeta& box, const char* src) {
  if (box.numel() == 0) return;
  const int64_t nd = int64_t(t.shape.size());
  const int64_t elsize = element_size(t.dtype);
  // Dims [whole, nd) of the box span the full tensor's; the run also takes dim whole - 1.
  int64_t whole = nd;
  while (whole > 0 && box.sizes[size_t(whole - 1)] == t.shape[size_t(whole - 1)]) --whole;
  std::vector<int64_t> stride(size_t(nd), 1);
  for (int64_t d = nd - 2; d >= 0; --d) stride[size_t(d)] = stride[size_t(d + 1)] * t.shape[size_t(d + 1)];
  const int64_t run = whole > 0 ? box.sizes[size_t(whole - 1)] * stride[size_t(whole - 1)] : box.numel();
  const int64_t outer = whole > 1 ? whole - 1 : 0;  // dims iterated over
  std::vector<int64_t> idx(size_t(outer), 0);
  const int64_t runs = box.numel() / run;
  for (int64_t r = 0; r < runs; ++r) {
    int64_t elem = 0;
    for (int64_t d = 0; d < nd; ++d) {
      const int64_t i = d < outer ? idx[size_t(d)] : 0;
      elem += (box.offsets[size_t(d)] + i) * stride[size_t(d)];
    }
    pwrite_all(fd, src + r * run * elsize, run * elsize, t.offset + elem * elsize, path);
    for (int64_t d = outer - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < box.sizes[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
  }
}

// The output files of a consolidation, open under their private names (created by whichever
// rank comes first; the coordinator writes the headers and sets the sizes).
class ConsolidatedFiles {
 public:
  ConsolidatedFiles(const ConsolidatedLayout& layout, std::string dir, std::string nonce, bool sync)
      : layout_(layout), dir_(std::move(dir)), nonce_(std::move(nonce)), sync_(sync), fds_(layout.files.size(), -1) {}
  ~ConsolidatedFiles() {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  ConsolidatedFiles(const ConsolidatedFiles&) = delete;
  ConsolidatedFiles& operator=(const ConsolidatedFiles&) = delete;

  void write_headers() {
    for (size_t i = 0; i < layout_.files.size(); ++i) {
      const LaidOutFile& f = layout_.files[i];
      const int fd = open(i);
      pwrite_all(fd, f.header.data(), int64_t(f.header.size()), 0, path(i));
      TORCH_CHECK(::ftruncate(fd, off_t(f.size)) == 0, "cannot size '", path(i), "': ", detail::errno_str());
    }
  }
  void write(const std::string& fqn, const ChunkMeta& box, const char* src) {
    const LaidOutTensor& t = layout_.tensors.at(fqn);
    write_box(open(t.file), path(t.file), t, box, src);
  }
  void close() {
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (fds_[i] < 0) continue;
      if (sync_) TORCH_CHECK(::fsync(fds_[i]) == 0, "cannot sync '", path(i), "': ", detail::errno_str());
      const int fd = fds_[i];
      fds_[i] = -1;
      TORCH_CHECK(::close(fd) == 0, "cannot close '", path(i), "': ", detail::errno_str());
    }
  }

 private:
  std::string path(size_t i) const { return temp_path(dir_, layout_.files[i].name, nonce_); }
  int open(size_t i) {
    if (fds_[i] < 0) {
      fds_[i] = ::open(path(i).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      TORCH_CHECK(fds_[i] >= 0, "cannot create '", path(i), "': ", detail::errno_str());
    }
    return fds_[i];
  }

  const ConsolidatedLayout& layout_;
  std::string dir_, nonce_;
  bool sync_;
  std::vector<int> fds_;
};

// Renames the private file of `name` (in `dir`) to `name`. A file already there (an earlier
// save's) is renamed aside first, to be removed after the commit (its path is added to
// `displaced`): replacing it by the rename itself makes ext4 write the new file's data out
// within the rename (its auto_da_alloc heuristic for files replaced by rename), ~30 ms per
// 64 MiB here, one file after another on the coordinator.
void put_in_place(const std::string& dir, const std::string& name, const std::string& nonce,
                  std::vector<std::string>& displaced) {
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string aside = temp_path(dir, name, nonce + "-old");
  if (::rename(final_path.c_str(), aside.c_str()) == 0) {
    displaced.push_back(aside);
  } else {
    TORCH_CHECK(errno == ENOENT, "cannot move '", final_path, "' aside: ", detail::errno_str());
  }
  TORCH_CHECK(::rename(temp_path(dir, name, nonce).c_str(), final_path.c_str()) == 0, "cannot rename '",
              temp_path(dir, name, nonce), "' to '", final_path, "': ", detail::errno_str());
}

// The coordinator's commit of a consolidation: renames the files into place, then writes the
// index (the last file: a reader that finds it finds the files it names).
void commit_consolidated(const ConsolidatedLayout& layout, const std::string& dir, const std::string& nonce,
                         bool sync, std::vector<std::string>& displaced) {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (const auto& [k, t] : layout.tensors) weight_map[k] = layout.files[t.file].name;
  for (const auto& f : layout.files) put_in_place(dir, f.name, nonce, displaced);
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", layout.total_size}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  const std::string tmp = temp_path(dir, kIndexFile, nonce);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create '", tmp, "': ", detail::errno_str());
  try {
    detail::write_all(fd, text.data(), int64_t(text.size()), tmp);
    if (sync) TORCH_CHECK(::fsync(fd) == 0, "cannot sync '", tmp, "': ", detail::errno_str());
  } catch (...) {
    ::close(fd);
    throw;
  }
  TORCH_CHECK(::close(fd) == 0, "cannot close '", tmp, "': ", detail::errno_str());
  if (sync) detail::fsync_path(dir, /*directory=*/true);
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  TORCH_CHECK(::rename(tmp.c_str(), index_path.c_str()) == 0, "cannot rename '", tmp, "' to '", index_path, "': ",
              detail::errno_str());
}

// Removes the checkpoint files of `dir` that an earlier save left and this one did not write
// (a loader would take their chunks for this save's): shards not in `*shards` (nullptr: none
// of them), consolidated files not in `models`, and the index unless `keep_index`.
void remove_stale(const std::string& dir, const std::set<std::string>* shards, const std::set<std::string>& models,
                  bool keep_index) {
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    std::error_code type_ec;
    if (!de.is_regular_file(type_ec)) continue;
    if (is_private_file(name) || (shards && is_shard_file(name) && !shards->count(name)) || (is_model_file(name) && !models.count(name)) ||
        (name == kIndexFile && !keep_index)) {
      fs::remove(de.path(), type_ec);
    }
  }
}

void unlink_temps(const ConsolidatedLayout& layout, const std::string& dir, const std::string& nonce) {
  for (const auto& f : layout.files) ::unlink(temp_path(dir, f.name, nonce).c_str());
  ::unlink(temp_path(dir, kIndexFile, nonce).c_str());
}

// The Metadata of a consolidated layout (each tensor one chunk in its file).
Metadata layout_metadata(const ConsolidatedLayout& layout) {
  Metadata m;
  m.checksummed = false;
  for (const auto& [k, t] : layout.tensors) {
    Entry& e = m.entries[k];
    e.dtype = t.dtype;
    e.size = t.shape;
    StoredChunk sc;
    sc.chunk = ChunkMeta{std::vector<int64_t>(t.shape.size(), 0), t.shape};
    sc.file = layout.files[t.file].name;
    sc.offset = t.offset;
    sc.length = sc.chunk.numel() * element_size(t.dtype);
    e.chunks.push_back(std::move(sc));
  }
  return m;
}

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
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    TORCH_CHECK(fd >= 0, "cannot create '", path, "': ", detail::errno_str());
    created.push_back(path);
    struct Closer {
      int fd;
      ~Closer() {
        if (fd >= 0) ::close(fd);
      }
    } closer{fd};
    detail::write_all(fd, header.data(), int64_t(header.size()), path);
    for (size_t i = 0; i < items.size(); ++i) {
      const WriteItem& w = *items[i];
      auto it = by_key.find({w.fqn, w.chunk});
      TORCH_CHECK(it != by_key.end(), "the global plan gave rank ", rank, " key '", w.fqn, "' chunk ",
                  w.chunk.to_string(), ", which it does not hold");
      const at::Tensor data = it->second->data.detach().to(at::kCPU).contiguous();
      detail::write_all(fd, static_cast<const char*>(data.data_ptr()), int64_t(data.nbytes()), path);
      StoredChunk sc;
      sc.chunk = w.chunk;
      sc.file = name;
      sc.offset = int64_t(header.size()) + offsets[i];
      sc.length = int64_t(data.nbytes());
      results.push_back({w, sc});
      if (opts.on_item_written) opts.on_item_written(w.fqn, sc.length);
    }
    if (opts.sync_files) TORCH_CHECK(::fsync(fd) == 0, "cannot sync '", path, "': ", detail::errno_str());
    closer.fd = -1;
    TORCH_CHECK(::close(fd) == 0, "cannot close '", path, "': ", detail::errno_str());
  }
  return results;
}

// The commit's errors after the files are in place are reported, not thrown (as our format's).
std::string after_commit(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    return (c10_error ? c10_error->msg() : std::string(e.what())) +
           " (after the commit: the checkpoint is in place, but may not survive a power loss)";
  }
  return "";
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

std::vector<std::string> consolidate_safetensors_files(const std::string& input_dir, const std::string& output_dir,
                                                       const std::map<std::string, int>& fqn_to_index_mapping,
                                                       const SaveOptions& options) {
  const bool use_dist = detail::resolve_use_dist(options.no_dist, options.process_group);
  DistWrapper dist(detail::resolve_group(use_dist, options.process_group), use_dist, options.coordinator_rank);
  const int rank = dist.get_rank();
  const int world = dist.get_world_size();
  detail::SafetensorsSource input;
  std::unique_ptr<detail::DirectoryLock> lock;
  const std::vector<nlohmann::json> offers = dist.all_gather("plan", [&] {
    TORCH_CHECK(fs::is_directory(input_dir), "consolidate_safetensors_files: '", input_dir, "' is not a directory");
    detail::read_safetensors_source(input_dir, nullptr, input);
    std::vector<std::string> keys;
    for (const auto& [k, e] : input.metadata.entries) keys.push_back(k);
    check_index_mapping(fqn_to_index_mapping, keys);
    nlohmann::json offer = nlohmann::json::object();
    if (dist.is_coordinator()) {
      std::error_code ec;
      fs::create_directories(output_dir, ec);
      TORCH_CHECK(!ec && fs::is_directory(output_dir), "cannot create '", output_dir, "': ", ec.message());
      lock = std::make_unique<detail::DirectoryLock>(
          output_dir, "consolidation coordinator rank " + std::to_string(rank) + " of " + std::to_string(world));
      offer["nonce"] = fresh_nonce();
    }
    return offer;
  });
  const std::string nonce = offers.at(size_t(dist.coordinator_rank())).at("nonce").get<std::string>();
  const ConsolidatedLayout layout = dist.on_every_rank("plan", [&] {
    std::map<std::string, std::pair<std::string, std::vector<int64_t>>> tensors;
    for (const auto& [k, e] : input.metadata.entries) tensors[k] = {e.dtype, e.size};
    return consolidated_layout(tensors, fqn_to_index_mapping, input.extra_metadata);
  });
  try {
    dist.all_gather("write", [&] {
      ConsolidatedFiles out(layout, output_dir, nonce, options.sync_files);
      if (dist.is_coordinator()) out.write_headers();
      // Chunk j (in key order) is rank j % world's.
      int64_t j = 0;
      std::vector<char> buf;
      std::map<std::string, int> fds;
      struct Closer {
        std::map<std::string, int>& fds;
        ~Closer() {
          for (const auto& [n, fd] : fds) ::close(fd);
        }
      } closer{fds};
      for (const auto& [k, e] : input.metadata.entries) {
        for (const auto& sc : e.chunks) {
          if (j++ % world != rank) continue;
          const std::string path = (fs::path(input_dir) / sc.file).string();
          auto it = fds.find(sc.file);
          if (it == fds.end()) {
            const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
            TORCH_CHECK(fd >= 0, "cannot open '", path, "': ", detail::errno_str());
            it = fds.emplace(sc.file, fd).first;
          }
          buf.resize(size_t(sc.length));
          pread_all(it->second, buf.data(), sc.length, sc.offset, path, k);
          out.write(k, sc.chunk, buf.data());
        }
      }
      out.close();
      return true;
    });
    const std::string error = dist.broadcast("commit", [&] {
      std::vector<std::string> displaced;
      commit_consolidated(layout, output_dir, nonce, options.sync_files, displaced);
      std::set<std::string> models;
      for (const auto& f : layout.files) models.insert(f.name);
      return after_commit([&] {
        for (const auto& p : displaced) ::unlink(p.c_str());
        if (options.sync_files) detail::fsync_path(output_dir, /*directory=*/true);
        // Shards in the output directory are the input's (consolidating in place) and stay.
        remove_stale(output_dir, nullptr, models, /*keep_index=*/true);
      });
    });
    if (!error.empty()) {
      throw CheckpointException("commit", {{dist.coordinator_rank(), WrappedException{"c10::Error", error}}});
    }
  } catch (const CheckpointException&) {
    if (dist.is_coordinator()) unlink_temps(layout, output_dir, nonce);
    throw;
  }
  std::vector<std::string> out;
  for (const auto& f : layout.files) out.push_back((fs::path(output_dir) / f.name).string());
  out.push_back((fs::path(output_dir) / kIndexFile).string());
  return out;
}

}  // namespace checkpoint
}  // namespace dtensor
