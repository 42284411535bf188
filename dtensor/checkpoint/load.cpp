// dtensor/checkpoint/load.cpp: load and read_metadata (see save_load.h): each rank reads the
// metadata (ours, PyTorch's DCP pickle, or a Hugging Face directory's headers) and only the
// bytes of the chunks that overlap its own, checked against their checksums where the format
// has them.
#include "dtensor/checkpoint/save_load.h"

#include "dtensor/checkpoint/dcp_internal.h"
#include "dtensor/checkpoint/dist_wrapper.h"
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/hf_internal.h"
#include "dtensor/checkpoint/load_internal.h"
#include "dtensor/checkpoint/pickle_internal.h"
#include "dtensor/checkpoint/save_internal.h"
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
#include <set>
#include <sstream>

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

using detail::errno_str;
using detail::join_keys;
using detail::kMetadataFile;
using detail::resolve_group;
using detail::resolve_use_dist;

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

namespace {

// A key of the state dict and its entry in the checkpoint.
struct Match {
  const std::string* fqn;
  StateDictValue* value;
  const Entry* entry;
};

// The keys of both sides in one walk (both maps are sorted by key): the matched ones, and the
// missing and unexpected ones into `res` (an error when strict).
std::vector<Match> match_keys(StateDict& state_dict, const Metadata& m, const detail::ReadSource& src, bool strict,
                              LoadResult& res) {
  std::vector<Match> matched;
  matched.reserve(std::min(state_dict.size(), m.entries.size()));
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
  if (strict && (!res.missing_keys.empty() || !res.unexpected_keys.empty())) {
    std::ostringstream os;
    os << "the state dict and " << src.what << " have different keys (strict load):";
    if (!res.missing_keys.empty()) os << " missing from the checkpoint: " << join_keys(res.missing_keys) << ";";
    if (!res.unexpected_keys.empty()) os << " not in the state dict: " << join_keys(res.unexpected_keys) << ";";
    TORCH_CHECK(false, os.str());
  }
  return matched;
}

// A box of a tensor the load fills.
struct Dest {
  const std::string* fqn;
  const Entry* entry;
  ChunkMeta box;
  at::Tensor target;
};

// What the load reads, planned from every matched key, with every error found before any read.
class LoadPlan {
 public:
  // reader: nullptr plans without reading (plan_load): a None placeholder is neither checked
  // against its files nor allocated.
  explicit LoadPlan(Reader* reader) : reader_(reader) {}
  void add(const Match& mt);
  // Raises every error found, in one message.
  void check() const {
    if (errors_.empty()) return;
    std::ostringstream os;
    for (size_t i = 0; i < errors_.size(); ++i) os << (i ? "; " : "") << errors_[i];
    TORCH_CHECK(false, os.str());
  }
  const std::vector<Dest>& dests() const { return dests_; }
  const std::vector<const Match*>& objects() const { return objects_; }

 private:
  bool check_tensor(const std::string& fqn, const Entry& e, at::ScalarType dtype, c10::IntArrayRef size);
  void add_tensor(const std::string& fqn, const Entry& e, const at::Tensor& t);

  Reader* reader_;
  std::vector<Dest> dests_;
  std::vector<const Match*> objects_;
  std::vector<std::string> errors_;
};

bool LoadPlan::check_tensor(const std::string& fqn, const Entry& e, at::ScalarType dtype, c10::IntArrayRef size) {
  if (e.kind != ItemKind::Tensor) {
    errors_.push_back("key '" + fqn + "' is an object in the checkpoint but a tensor in the state dict");
    return false;
  }
  if (dtype_name(dtype) != e.dtype) {
    errors_.push_back("key '" + fqn + "' has dtype " + dtype_name(dtype) + " in the state dict but " + e.dtype +
                      " in the checkpoint");
    return false;
  }
  if (size != c10::IntArrayRef(e.size)) {
    errors_.push_back("key '" + fqn + "' has shape " + detail::int_list_string(size.vec()) + " in the state dict but " +
                      detail::int_list_string(e.size) + " in the checkpoint");
    return false;
  }
  return true;
}

void LoadPlan::add_tensor(const std::string& fqn, const Entry& e, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "checkpoint: key '", fqn, "' is an undefined tensor");
  if (!check_tensor(fqn, e, t.scalar_type(), t.sizes())) return;
  if (!is_dtensor(t)) {
    dests_.push_back({&fqn, &e, ChunkMeta{std::vector<int64_t>(size_t(t.dim()), 0), t.sizes().vec()}, t});
    return;
  }
  const DTensorSpec& spec = get_spec(t);
  if (spec.has_partial()) {
    errors_.push_back("key '" + fqn + "' is a DTensor with a Partial placement (" + spec.to_string() +
                      "): load into Shard or Replicate placements");
    return;
  }
  auto c = detail::dtensor_chunk(t);
  if (c && c->box.numel() > 0) dests_.push_back({&fqn, &e, std::move(c->box), std::move(c->local)});
}

void LoadPlan::add(const Match& mt) {
  const std::string& fqn = *mt.fqn;
  StateDictValue& v = *mt.value;
  const Entry& e = *mt.entry;
  if (auto* iv = std::get_if<c10::IValue>(&v)) {
    if (iv->isTensor()) {
      v = iv->toTensor();
    } else if (e.kind == ItemKind::Tensor && iv->isNone()) {
      // A None placeholder receives the whole tensor: its chunks' bytes (which tile it) must
      // be in their files before it is allocated.
      if (!reader_) {
        dests_.push_back({&fqn, &e, ChunkMeta{std::vector<int64_t>(e.size.size(), 0), e.size}, at::Tensor()});
        return;
      }
      for (const auto& sc : e.chunks) reader_->check_in_file(fqn, sc);
      v = at::empty(e.size, at::TensorOptions().dtype(dtype_from_name(e.dtype)));
    } else if (e.kind != ItemKind::Object) {
      errors_.push_back("key '" + fqn + "' is a tensor in the checkpoint but a " + iv->tagKind() + " in the state dict");
      return;
    } else {
      objects_.push_back(&mt);
      return;
    }
  }
  if (auto* t = std::get_if<at::Tensor>(&v)) {
    add_tensor(fqn, e, *t);
  } else if (auto* st = std::get_if<sharded::ShardedTensor>(&v)) {
    if (!check_tensor(fqn, e, st->dtype(), st->size())) return;
    for (const auto& shard : st->local_shards()) {
      ChunkMeta box{shard.metadata.shard_offsets(), shard.metadata.shard_sizes()};
      if (box.numel() > 0) dests_.push_back({&fqn, &e, std::move(box), shard.tensor});
    }
  }
}

}  // namespace

LoadResult detail::load_local(StateDict& state_dict, const ReadSource& src, const LoadOptions& opts) {
  const Metadata& m = *src.metadata;
  LoadResult res;
  const std::vector<Match> matched = match_keys(state_dict, m, src, opts.strict, res);
  // Check every key first, then read.
  Reader reader(src.dir, m.checksum_block_bytes, src.verify_checksums && opts.verify_checksums);
  LoadPlan plan(&reader);
  for (const Match& mt : matched) plan.add(mt);
  plan.check();
  c10::AutoGradMode no_grad(false);
  for (const auto& d : plan.dests()) read_into(reader, *d.fqn, *d.entry, d.box, d.target);
  for (const Match* o : plan.objects()) *o->value = read_object(reader, src, *o->fqn, *o->entry);
  return res;
}

PlannedLoad plan_load(const StateDict& state_dict, const Metadata& metadata, const LoadOptions& options) {
  StateDict sd = state_dict;  // match_keys and LoadPlan take values they may replace
  detail::ReadSource src;
  src.metadata = &metadata;
  src.what = "the checkpoint";
  PlannedLoad out;
  const std::vector<Match> matched = match_keys(sd, metadata, src, options.strict, out.keys);
  LoadPlan plan(nullptr);
  for (const Match& mt : matched) plan.add(mt);
  plan.check();
  for (const auto& d : plan.dests()) {
    const int64_t element = element_size(d.entry->dtype);
    for (const auto& sc : d.entry->chunks) {
      auto overlap = chunk_overlap(sc.chunk, d.box);
      if (!overlap) continue;
      const int64_t bytes = overlap->numel() * element;
      out.bytes += bytes;
      out.reads.push_back({*d.fqn, std::move(*overlap), sc.file, bytes});
    }
  }
  for (const Match* o : plan.objects()) out.objects.push_back(*o->fqn);
  return out;
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
