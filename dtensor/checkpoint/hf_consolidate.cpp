// dtensor/checkpoint/hf_consolidate.cpp: the full tensors of a Hugging Face checkpoint written
// from its chunks, in parallel (PyTorch's _consolidate_hf_safetensors.py): the layout of the
// consolidated files, each rank's chunks written in place, and the commit that renames them
// and writes the index. Used by the sharded save (hf_format.cpp) and by
// consolidate_safetensors_files (export.h).
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/hf_internal.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <random>
#include <regex>

namespace dtensor {
namespace checkpoint {

namespace fs = std::filesystem;

namespace detail {

namespace {

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

void pwrite_all(int fd, const char* p, int64_t n, int64_t at, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, size_t(std::min<int64_t>(n, int64_t(1) << 30)), off_t(at));
    if (w < 0 && errno == EINTR) continue;
    TORCH_CHECK(w > 0, "cannot write '", path, "': ", errno_str());
    p += w;
    n -= w;
    at += w;
  }
}

void pread_all(int fd, char* p, int64_t n, int64_t at, const std::string& path, const std::string& fqn) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, size_t(std::min<int64_t>(n, int64_t(1) << 30)), off_t(at));
    if (r < 0 && errno == EINTR) continue;
    TORCH_CHECK(r >= 0, "cannot read '", path, "' (key '", fqn, "'): ", errno_str());
    TORCH_CHECK(r > 0, "safetensors file '", path, "' is truncated: key '", fqn, "' needs bytes up to ", at + n);
    p += r;
    n -= r;
    at += r;
  }
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

}  // namespace

// PyTorch's _gen_file_name: "model-00001-of-00002.safetensors", and with a shard index
// "shard-00003-model-00001-of-00002.safetensors".
std::string hf_file_name(int index, int largest, int shard) {
  char name[96];
  if (shard > 0) {
    std::snprintf(name, sizeof(name), "shard-%05d-model-%05d-of-%05d.safetensors", shard, index, largest);
  } else {
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", index, largest);
  }
  return name;
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
    f.header = safetensors_header(file_tensors, meta, &offsets);
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

ConsolidatedFiles::ConsolidatedFiles(const ConsolidatedLayout& layout, std::string dir, std::string nonce, bool sync)
    : layout_(layout), dir_(std::move(dir)), nonce_(std::move(nonce)), sync_(sync), fds_(layout.files.size(), -1) {}

ConsolidatedFiles::~ConsolidatedFiles() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

void ConsolidatedFiles::write_headers() {
  for (size_t i = 0; i < layout_.files.size(); ++i) {
    const LaidOutFile& f = layout_.files[i];
    const int fd = open(i);
    pwrite_all(fd, f.header.data(), int64_t(f.header.size()), 0, path(i));
    TORCH_CHECK(::ftruncate(fd, off_t(f.size)) == 0, "cannot size '", path(i), "': ", errno_str());
  }
}

void ConsolidatedFiles::write(const std::string& fqn, const ChunkMeta& box, const char* src) {
  const LaidOutTensor& t = layout_.tensors.at(fqn);
  write_box(open(t.file), path(t.file), t, box, src);
}

void ConsolidatedFiles::close() {
  for (size_t i = 0; i < fds_.size(); ++i) {
    if (fds_[i] < 0) continue;
    if (sync_) TORCH_CHECK(::fsync(fds_[i]) == 0, "cannot sync '", path(i), "': ", errno_str());
    const int fd = fds_[i];
    fds_[i] = -1;
    TORCH_CHECK(::close(fd) == 0, "cannot close '", path(i), "': ", errno_str());
  }
}

std::string ConsolidatedFiles::path(size_t i) const { return temp_path(dir_, layout_.files[i].name, nonce_); }

int ConsolidatedFiles::open(size_t i) {
  if (fds_[i] < 0) {
    fds_[i] = ::open(path(i).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    TORCH_CHECK(fds_[i] >= 0, "cannot create '", path(i), "': ", errno_str());
  }
  return fds_[i];
}

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
    TORCH_CHECK(errno == ENOENT, "cannot move '", final_path, "' aside: ", errno_str());
  }
  TORCH_CHECK(::rename(temp_path(dir, name, nonce).c_str(), final_path.c_str()) == 0, "cannot rename '",
              temp_path(dir, name, nonce), "' to '", final_path, "': ", errno_str());
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
  TORCH_CHECK(fd >= 0, "cannot create '", tmp, "': ", errno_str());
  try {
    write_all(fd, text.data(), int64_t(text.size()), tmp);
    if (sync) TORCH_CHECK(::fsync(fd) == 0, "cannot sync '", tmp, "': ", errno_str());
  } catch (...) {
    ::close(fd);
    throw;
  }
  TORCH_CHECK(::close(fd) == 0, "cannot close '", tmp, "': ", errno_str());
  if (sync) fsync_path(dir, /*directory=*/true);
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  TORCH_CHECK(::rename(tmp.c_str(), index_path.c_str()) == 0, "cannot rename '", tmp, "' to '", index_path, "': ",
              errno_str());
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

// Copies this rank's chunks of the input into the output files: chunk j (in key order) is
// rank j % world's.
void copy_chunks_of_rank(const SafetensorsSource& input, const std::string& input_dir, int rank, int world,
                         ConsolidatedFiles& out) {
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
        TORCH_CHECK(fd >= 0, "cannot open '", path, "': ", errno_str());
        it = fds.emplace(sc.file, fd).first;
      }
      buf.resize(size_t(sc.length));
      pread_all(it->second, buf.data(), sc.length, sc.offset, path, k);
      out.write(k, sc.chunk, buf.data());
    }
  }
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

}  // namespace detail

std::vector<std::string> consolidate_safetensors_files(const std::string& input_dir, const std::string& output_dir,
                                                       const std::map<std::string, int>& fqn_to_index_mapping,
                                                       const SaveOptions& options) {
  using namespace detail;  // NOLINT: the helpers of this file
  const bool use_dist = resolve_use_dist(options.no_dist, options.process_group);
  DistWrapper dist(resolve_group(use_dist, options.process_group), use_dist, options.coordinator_rank);
  const int rank = dist.get_rank();
  const int world = dist.get_world_size();
  SafetensorsSource input;
  std::unique_ptr<DirectoryLock> lock;
  const std::vector<nlohmann::json> offers = dist.all_gather("plan", [&] {
    TORCH_CHECK(fs::is_directory(input_dir), "consolidate_safetensors_files: '", input_dir, "' is not a directory");
    read_safetensors_source(input_dir, nullptr, input);
    std::vector<std::string> keys;
    for (const auto& [k, e] : input.metadata.entries) keys.push_back(k);
    check_index_mapping(fqn_to_index_mapping, keys);
    nlohmann::json offer = nlohmann::json::object();
    if (dist.is_coordinator()) {
      std::error_code ec;
      fs::create_directories(output_dir, ec);
      TORCH_CHECK(!ec && fs::is_directory(output_dir), "cannot create '", output_dir, "': ", ec.message());
      lock = std::make_unique<DirectoryLock>(
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
      copy_chunks_of_rank(input, input_dir, rank, world, out);
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
        if (options.sync_files) fsync_path(output_dir, /*directory=*/true);
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
