// dtensor/checkpoint/safetensors.cpp: safetensors files read as checkpoints: a single file,
// split files with their index, and the sharded directories of a Hugging Face save (PyTorch's
// HuggingFaceStorageReader reads the same) - for load_safetensors, and for load and
// read_metadata of such a directory. Also the pieces of the format its writers share
// (export.cpp, hf_format.cpp): dtype names, headers, objects' hex.
#include "dtensor/checkpoint/export.h"
#include "dtensor/checkpoint/hf_internal.h"
#include "dtensor/checkpoint/json_internal.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
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

const std::vector<std::pair<std::string, std::string>>& safetensors_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"float32", "F32"}, {"float64", "F64"}, {"float16", "F16"}, {"bfloat16", "BF16"}, {"int64", "I64"},
      {"int32", "I32"},   {"int16", "I16"},   {"int8", "I8"},     {"uint8", "U8"},      {"bool", "BOOL"}};
  return names;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One safetensors file's header: each tensor an Entry whose one chunk points at its bytes
// (placed by the file's DCP_SHARDING_INFO when it has one; the entry's size is the chunk's
// extent), and the "__metadata__" strings.
struct SafetensorsFile {
  std::string name;  // relative to the directory of the source
  std::map<std::string, Entry> tensors;
  std::map<std::string, std::string> metadata;
};

// The chunk offsets DCP_SHARDING_INFO gives each tensor of `f` ({key: {"saved_offsets": [...]}}).
void place_chunks(SafetensorsFile& f, const std::string& info_text) {
  const auto info = nlohmann::json::parse(info_text);
  TORCH_CHECK(info.is_object(), kShardingInfoKey, " is not a JSON object");
  for (auto& [k, e] : f.tensors) {
    TORCH_CHECK(info.contains(k), kShardingInfoKey, " does not place key '", k, "'");
    const auto offsets = detail::json_integers<int64_t>(info.at(k).at(kSavedOffsetsKey),
                                                         ("key '" + k + "': saved_offsets").c_str());
    StoredChunk& sc = e.chunks.at(0);
    TORCH_CHECK(offsets.size() == sc.chunk.sizes.size(), "key '", k, "': saved_offsets ",
                detail::int_list_string(offsets), " do not match its shape ", detail::int_list_string(sc.chunk.sizes));
    for (size_t d = 0; d < offsets.size(); ++d) {
      TORCH_CHECK(offsets[d] >= 0, "key '", k, "': saved_offsets ", detail::int_list_string(offsets),
                  " has a negative offset");
      TORCH_CHECK(!__builtin_add_overflow(offsets[d], sc.chunk.sizes[d], &e.size[d]), "key '", k,
                  "': saved_offsets ", detail::int_list_string(offsets), " overflow");
    }
    sc.chunk.offsets = offsets;
  }
}

SafetensorsFile read_safetensors_header(const std::string& dir, const std::string& name) {
  const std::string path = (fs::path(dir) / name).string();
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, "cannot open safetensors file '", path, "'");
  std::error_code ec;
  const int64_t file_size = int64_t(fs::file_size(path, ec));
  TORCH_CHECK(!ec, "cannot stat '", path, "': ", ec.message());
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  TORCH_CHECK(in.gcount() == 8, "safetensors file '", path, "' is truncated: it has no 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | le[i];
  TORCH_CHECK(n <= uint64_t(file_size - 8), "safetensors file '", path, "' is truncated or not safetensors: its header says ",
              n, " bytes of JSON, the file has ", file_size - 8, " after the length");
  std::string text(size_t(n), '\0');
  in.read(text.data(), std::streamsize(n));
  TORCH_CHECK(in.gcount() == std::streamsize(n), "cannot read the header of '", path, "'");
  const int64_t data_start = 8 + int64_t(n);
  SafetensorsFile f;
  f.name = name;
  try {
    auto header = nlohmann::json::parse(text);
    TORCH_CHECK(header.is_object(), "the header is not a JSON object");
    for (const auto& [k, v] : header.items()) {
      if (k == "__metadata__") {
        for (const auto& [mk, mv] : v.items()) f.metadata[mk] = mv.get<std::string>();
        continue;
      }
      Entry e;
      e.kind = ItemKind::Tensor;
      e.dtype = dtype_from_safetensors(v.at("dtype").get<std::string>());
      e.size = detail::json_integers<int64_t>(v.at("shape"), ("key '" + k + "': shape").c_str());
      auto off = detail::json_integers<int64_t>(v.at("data_offsets"), ("key '" + k + "': data_offsets").c_str());
      TORCH_CHECK(off.size() == 2, "key '", k, "': data_offsets must be [begin, end]");
      // The shape and offsets come from the file: no product or sum may overflow.
      int64_t numel = 1, nbytes = 0;
      for (int64_t s : e.size) {
        TORCH_CHECK(s >= 0, "key '", k, "': negative dim in shape");
        TORCH_CHECK(!__builtin_mul_overflow(numel, s, &numel), "key '", k, "': the shape has more than 2^63 elements");
      }
      TORCH_CHECK(!__builtin_mul_overflow(numel, element_size(e.dtype), &nbytes), "key '", k,
                  "': the shape has more than 2^63 bytes");
      TORCH_CHECK(off[0] >= 0 && off[1] >= off[0] && off[1] - off[0] == nbytes, "key '", k, "': data_offsets [",
                  off[0], ", ", off[1], ") do not hold ", numel, " elements of ", e.dtype);
      TORCH_CHECK(off[1] <= file_size - data_start, "key '", k, "': its bytes end at ", off[1],
                  " after the header, past the end of the file (", file_size - data_start,
                  " bytes after the header): the file is truncated");
      StoredChunk sc;
      sc.chunk = ChunkMeta{std::vector<int64_t>(e.size.size(), 0), e.size};
      sc.file = name;
      sc.offset = data_start + off[0];
      sc.length = off[1] - off[0];
      e.chunks.push_back(std::move(sc));
      f.tensors[k] = std::move(e);
    }
    auto info = f.metadata.find(kShardingInfoKey);
    if (info != f.metadata.end()) place_chunks(f, info->second);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "safetensors file '", path, "' has a malformed header: ", e.what());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "safetensors file '", path, "': ", e.msg());
  }
  return f;
}

// The files of a Hugging Face directory without an index: its .safetensors files, sorted.
std::vector<std::string> safetensors_files_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (name[0] != '.' && ends_with(name, ".safetensors") && it->is_regular_file(type_ec)) names.push_back(name);
  }
  TORCH_CHECK(!ec, "cannot list '", dir, "': ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

// Adds the chunks of `f`'s tensors that `take` accepts to `m`'s entries.
void merge_chunks(Metadata& m, SafetensorsFile& f, const std::function<bool(const std::string&)>& take) {
  for (auto& [k, e] : f.tensors) {
    if (!take(k)) continue;
    auto it = m.entries.find(k);
    if (it == m.entries.end()) {
      m.entries[k] = std::move(e);
      continue;
    }
    Entry& have = it->second;
    const std::string& first = have.chunks.at(0).file;
    TORCH_CHECK(have.dtype == e.dtype, "key '", k, "' is ", have.dtype, " in '", first, "' but ", e.dtype, " in '", f.name,
                "'");
    TORCH_CHECK(have.size.size() == e.size.size(), "key '", k, "' has ", have.size.size(), " dims in '", first, "' but ",
                e.size.size(), " in '", f.name, "'");
    for (size_t d = 0; d < e.size.size(); ++d) have.size[d] = std::max(have.size[d], e.size[d]);
    have.chunks.push_back(std::move(e.chunks.at(0)));
  }
}
}  // namespace

std::string safetensors_dtype(const std::string& dtype) {
  for (const auto& [ours, st] : safetensors_names()) {
    if (ours == dtype) return st;
  }
  TORCH_CHECK(false, "safetensors has no dtype for ", dtype);
}

std::string dtype_from_safetensors(const std::string& st_dtype) {
  for (const auto& [ours, st] : safetensors_names()) {
    if (st == st_dtype) return ours;
  }
  TORCH_CHECK(false, "safetensors dtype '", st_dtype, "' is not supported");
}

std::string detail::to_hex(const std::vector<char>& bytes) {
  static const char* hex = "0123456789abcdef";
  std::string h;
  h.reserve(bytes.size() * 2);
  for (char ch : bytes) {
    h += hex[(unsigned char)ch >> 4];
    h += hex[(unsigned char)ch & 15];
  }
  return h;
}

std::optional<std::vector<char>> detail::from_hex(const std::string& h) {
  if (h.size() % 2) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::vector<char> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    int a = digit(h[2 * i]), b = digit(h[2 * i + 1]);
    if (a < 0 || b < 0) return std::nullopt;
    out[i] = char(a << 4 | b);
  }
  return out;
}

std::string detail::safetensors_header(const std::vector<SafetensorsTensor>& tensors,
                                       const nlohmann::ordered_json& metadata, std::vector<int64_t>* data_offsets) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  int64_t offset = 0;
  if (data_offsets) data_offsets->clear();
  for (const auto& t : tensors) {
    int64_t n = element_size(t.dtype);
    for (int64_t s : t.shape) n *= s;
    header[t.key] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    if (data_offsets) data_offsets->push_back(offset);
    offset += n;
  }
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8) text += ' ';  // data starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);
  return out + text;
}

bool detail::is_huggingface_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec) || fs::exists(fs::path(dir) / ".metadata", ec)) return false;
  if (fs::exists(fs::path(dir) / kIndexFile, ec)) return true;
  try {
    return !safetensors_files_in(dir).empty();
  } catch (const c10::Error&) {
    return false;
  }
}

namespace {

// The files an index maps keys to, each key merged from its file into `m` (other tensors of
// the files are not read).
std::vector<SafetensorsFile> read_indexed_files(const std::string& index_path, const std::string& dir, Metadata& m) {
  std::map<std::string, std::string> weight_map;
  std::ifstream in(index_path);
  TORCH_CHECK(in, "cannot open safetensors index '", index_path, "'");
  try {
    auto j = nlohmann::json::parse(in);
    j.at("weight_map").get_to(weight_map);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "safetensors index '", index_path, "' is not valid: ", e.what());
  }
  std::set<std::string> names;
  for (const auto& [k, f] : weight_map) {
    // Hugging Face's split files lie beside their index.
    TORCH_CHECK(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
                    f.find('\0') == std::string::npos,
                "safetensors index '", index_path, "' maps key '", k, "' to '", f,
                "', which is not a file name beside the index");
    names.insert(f);
  }
  std::vector<SafetensorsFile> files;
  for (const auto& name : names) {
    files.push_back(read_safetensors_header(dir, name));
    merge_chunks(m, files.back(), [&](const std::string& k) {
      auto it = weight_map.find(k);
      return it != weight_map.end() && it->second == name;
    });
  }
  for (const auto& [k, name] : weight_map) {
    TORCH_CHECK(m.entries.count(k), "safetensors index '", index_path, "' maps key '", k, "' to '", name,
                "', which does not hold it");
  }
  return files;
}

// Objects: the state dict's non-tensor keys found in a file's metadata (our hex pickles).
void add_objects(const StateDict& state_dict, const std::vector<SafetensorsFile>& files, const std::string& dir,
                 Metadata& m, detail::ReadSource& source) {
  for (const auto& [k, v] : state_dict) {
    const auto* iv = std::get_if<c10::IValue>(&v);
    if (!iv || iv->isTensor() || m.entries.count(k)) continue;
    for (const auto& f : files) {
      auto it = f.metadata.find(k);
      if (it == f.metadata.end()) continue;
      auto bytes = detail::from_hex(it->second);
      TORCH_CHECK(bytes, "key '", k, "' of the \"__metadata__\" of safetensors file '", (fs::path(dir) / f.name).string(),
                  "' is not a value dtensor-cpp wrote (not hex)");
      Entry e;
      e.kind = ItemKind::Object;
      StoredChunk sc;
      sc.length = int64_t(bytes->size());
      e.chunks.push_back(sc);
      m.entries[k] = std::move(e);
      source.inline_objects[k] = std::move(*bytes);
      break;
    }
  }
}

}  // namespace

void detail::read_safetensors_source(const std::string& path, const StateDict* state_dict, SafetensorsSource& out) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  std::string index_path;
  if (is_dir && fs::exists(fs::path(path) / kIndexFile, ec)) {
    index_path = (fs::path(path) / kIndexFile).string();
  } else if (!is_dir && ends_with(path, ".index.json")) {
    index_path = path;
  }
  const std::string dir = is_dir ? path : fs::path(path).parent_path().string();
  Metadata& m = out.metadata;
  m.checksum_block_bytes = kDefaultChecksumBlockBytes;
  m.checksummed = false;
  std::vector<SafetensorsFile> files;
  if (!index_path.empty()) {
    files = read_indexed_files(index_path, dir, m);
  } else {
    const std::vector<std::string> names =
        is_dir ? safetensors_files_in(path) : std::vector<std::string>{fs::path(path).filename().string()};
    TORCH_CHECK(!names.empty(), "no checkpoint in '", path, "': it has no .metadata, no ", kIndexFile,
                " and no .safetensors files");
    for (const auto& name : names) {
      files.push_back(read_safetensors_header(dir, name));
      merge_chunks(m, files.back(), [](const std::string&) { return true; });
    }
  }
  const std::string what = index_path.empty() ? (is_dir ? "the safetensors files in '" : "the safetensors file '") + path + "'"
                                              : "the safetensors index '" + index_path + "'";
  for (auto& [k, e] : m.entries) {
    std::sort(e.chunks.begin(), e.chunks.end(),
              [](const StoredChunk& a, const StoredChunk& b) { return a.chunk < b.chunk; });
  }
  try {
    validate_metadata(m);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, what, ": ", e.msg());
  }
  for (const auto& f : files) {
    for (const auto& [k, v] : f.metadata) {
      if (k != kShardingInfoKey && k != kVersionKey && k != "format") out.extra_metadata.emplace(k, v);
    }
  }
  if (state_dict) add_objects(*state_dict, files, dir, m, out.source);
  out.source.metadata = &out.metadata;
  out.source.dir = dir.empty() ? "." : dir;
  out.source.verify_checksums = false;
  out.source.what = what;
}

LoadResult load_safetensors(StateDict& state_dict, const std::string& path, const LoadOptions& options) {
  return detail::load_collective(options, [&] {
    detail::SafetensorsSource s;
    detail::read_safetensors_source(path, &state_dict, s);
    return detail::load_local(state_dict, s.source, options);
  });
}

}  // namespace checkpoint
}  // namespace dtensor
