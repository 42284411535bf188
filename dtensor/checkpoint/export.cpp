// dtensor/checkpoint/export.cpp: checkpoints as torch.save and safetensors files, and
// safetensors files read into sharded state dicts (see export.h).
#include "dtensor/checkpoint/export.h"

#include "dtensor/checkpoint/json_internal.h"
#include "dtensor/checkpoint/load_internal.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <set>

namespace dtensor {
namespace checkpoint {

namespace fs = std::filesystem;

namespace {

// ---- torch.save -------------------------------------------------------------------------------

// `v` with every list a generic one (libtorch pickles int, float, bool and tensor lists by
// calling torch.jit._pickle.build_*list, which torch.load's weights_only mode refuses) and
// every dict's values of type Any, recursively.
c10::IValue plain(const c10::IValue& v) {
  if (v.isList()) {
    c10::impl::GenericList in = v.toList();
    c10::impl::GenericList out(c10::AnyType::get());
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) out.push_back(plain(in.get(i)));
    return out;
  }
  if (v.isGenericDict()) {
    c10::impl::GenericDict in = v.toGenericDict();
    c10::impl::GenericDict out(in.keyType(), c10::AnyType::get());
    for (const auto& kv : in) out.insert(kv.key(), plain(kv.value()));
    return out;
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> elems;
    for (const auto& e : v.toTuple()->elements()) elems.push_back(plain(e));
    return c10::ivalue::Tuple::create(std::move(elems));
  }
  return v;
}

// ---- safetensors ------------------------------------------------------------------------------

const std::vector<std::pair<std::string, std::string>>& safetensors_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"float32", "F32"}, {"float64", "F64"}, {"float16", "F16"}, {"bfloat16", "BF16"}, {"int64", "I64"},
      {"int32", "I32"},   {"int16", "I16"},   {"int8", "I8"},     {"uint8", "U8"},      {"bool", "BOOL"}};
  return names;
}

std::string to_hex(const std::vector<char>& bytes) {
  static const char* hex = "0123456789abcdef";
  std::string h;
  h.reserve(bytes.size() * 2);
  for (char ch : bytes) {
    h += hex[(unsigned char)ch >> 4];
    h += hex[(unsigned char)ch & 15];
  }
  return h;
}

// Empty optional when `h` is not hex of whole bytes.
std::optional<std::vector<char>> from_hex(const std::string& h) {
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

// Writes one safetensors file: `tensors` (key order) and `metadata` strings.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const nlohmann::ordered_json& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  int64_t offset = 0;
  for (const auto& [k, t] : tensors) {
    const int64_t n = int64_t(t.nbytes());
    header[k] = {{"dtype", safetensors_dtype(dtype_name(t.scalar_type()))},
                 {"shape", t.sizes().vec()},
                 {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  header["__metadata__"] = metadata;
  std::string text = header.dump();
  while ((text.size() + 8) % 8) text += ' ';  // data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, "cannot create '", path, "'");
  const uint64_t len = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = (unsigned char)(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(le), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& [k, t] : tensors) out.write(static_cast<const char*>(t.data_ptr()), std::streamsize(t.nbytes()));
  out.flush();
  TORCH_CHECK(out, "cannot write '", path, "'");
}

// The keys of `m` read whole (tensors contiguous on the CPU).
StateDict load_keys(const std::string& checkpoint_dir, const std::vector<std::string>& keys) {
  StateDict sd;
  for (const auto& k : keys) sd[k] = c10::IValue();
  LoadOptions o;
  o.no_dist = true;
  o.strict = false;
  load(sd, checkpoint_dir, o);
  return sd;
}

// One safetensors file's header, as entries of a Metadata whose chunks point into it.
struct SafetensorsFile {
  std::string name;  // relative to the directory of the source
  std::map<std::string, Entry> tensors;
  std::map<std::string, std::string> metadata;
};

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
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "safetensors file '", path, "' has a malformed header: ", e.what());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "safetensors file '", path, "': ", e.msg());
  }
  return f;
}

// The entries of a .safetensors file or of the files a .index.json names, for `state_dict`:
// its non-tensor keys are looked up in the files' "__metadata__".
struct SafetensorsSource {
  Metadata metadata;
  detail::ReadSource source;
};

void read_safetensors_source(const std::string& path, const StateDict& state_dict, SafetensorsSource& out) {
  const std::string dir = fs::path(path).parent_path().string();
  std::vector<SafetensorsFile> files;
  std::map<std::string, std::string> weight_map;
  const bool is_index = path.size() >= 11 && path.compare(path.size() - 11, 11, ".index.json") == 0;
  if (is_index) {
    std::ifstream in(path);
    TORCH_CHECK(in, "cannot open safetensors index '", path, "'");
    try {
      auto j = nlohmann::json::parse(in);
      j.at("weight_map").get_to(weight_map);
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK(false, "safetensors index '", path, "' is not valid: ", e.what());
    }
    std::set<std::string> names;
    for (const auto& [k, f] : weight_map) {
      // Hugging Face's split files lie beside their index.
      TORCH_CHECK(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
                      f.find('\0') == std::string::npos,
                  "safetensors index '", path, "' maps key '", k, "' to '", f,
                  "', which is not a file name beside the index");
      names.insert(f);
    }
    for (const auto& name : names) files.push_back(read_safetensors_header(dir, name));
  } else {
    files.push_back(read_safetensors_header(dir, fs::path(path).filename().string()));
  }
  Metadata& m = out.metadata;
  m.checksum_block_bytes = kDefaultChecksumBlockBytes;
  if (is_index) {
    // The keys the index maps, each from its file (other tensors of the files are not read).
    for (const auto& key_file : weight_map) {
      const std::string& k = key_file.first;
      const std::string& name = key_file.second;  // named: C++17 lambdas cannot capture bindings
      auto f = std::find_if(files.begin(), files.end(), [&](const SafetensorsFile& x) { return x.name == name; });
      auto it = f->tensors.find(k);
      TORCH_CHECK(it != f->tensors.end(), "safetensors index '", path, "' maps key '", k, "' to '", name,
                  "', which does not hold it");
      m.entries[k] = it->second;
    }
  } else {
    m.entries = std::move(files[0].tensors);
  }
  // Objects: the state dict's non-tensor keys found in a file's metadata.
  for (const auto& [k, v] : state_dict) {
    const auto* iv = std::get_if<c10::IValue>(&v);
    if (!iv || iv->isTensor() || m.entries.count(k)) continue;
    for (const auto& f : files) {
      auto it = f.metadata.find(k);
      if (it == f.metadata.end()) continue;
      auto bytes = from_hex(it->second);
      TORCH_CHECK(bytes, "key '", k, "' of the \"__metadata__\" of safetensors file '", (fs::path(dir) / f.name).string(),
                  "' is not a value export_safetensors wrote (not hex)");
      Entry e;
      e.kind = ItemKind::Object;
      StoredChunk sc;
      sc.length = int64_t(bytes->size());
      e.chunks.push_back(sc);
      m.entries[k] = std::move(e);
      out.source.inline_objects[k] = std::move(*bytes);
      break;
    }
  }
  out.source.metadata = &out.metadata;
  out.source.dir = dir.empty() ? "." : dir;
  out.source.verify_checksums = false;
  out.source.what = "the safetensors " + std::string(is_index ? "index" : "file") + " '" + path + "'";
}

}  // namespace

StateDict load_full(const std::string& checkpoint_dir) {
  std::vector<std::string> keys;
  for (const auto& [k, e] : read_metadata(checkpoint_dir).entries) keys.push_back(k);
  return load_keys(checkpoint_dir, keys);
}

void export_torch_save(const std::string& checkpoint_dir, const std::string& out_file) {
  StateDict sd = load_full(checkpoint_dir);
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [k, v] : sd) {
    if (const auto* t = std::get_if<at::Tensor>(&v)) {
      dict.insert(k, *t);
    } else {
      dict.insert(k, plain(std::get<c10::IValue>(v)));
    }
  }
  // torch::jit::pickle_save, without the TorchScript type tags (tag_aggregates = false).
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* p, size_t n) { pickled.insert(pickled.end(), p, p + n); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::ofstream out(out_file, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, "cannot create '", out_file, "'");
  {
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
      out.write(static_cast<const char*>(p), std::streamsize(n));
      return out ? n : size_t(0);
    });
    torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  out.flush();
  TORCH_CHECK(out, "cannot write '", out_file, "'");
}

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

std::vector<std::string> export_safetensors(const std::string& checkpoint_dir, const std::string& out_file,
                                            const SafetensorsExportOptions& options) {
  TORCH_CHECK(options.max_shard_bytes >= 0, "export_safetensors: max_shard_bytes must be >= 0, got ",
              options.max_shard_bytes);
  const Metadata m = read_metadata(checkpoint_dir);
  // The tensor keys of each output file, in key order; objects go to the first file.
  std::vector<std::vector<std::string>> groups(1);
  std::vector<std::string> objects;
  int64_t in_group = 0, total = 0;
  for (const auto& [k, e] : m.entries) {
    if (e.kind == ItemKind::Object) {
      objects.push_back(k);
      continue;
    }
    safetensors_dtype(e.dtype);  // complex: refused before anything is written
    int64_t bytes = element_size(e.dtype);
    for (int64_t s : e.size) bytes *= s;
    if (options.max_shard_bytes > 0 && in_group > 0 && in_group + bytes > options.max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(k);
    in_group += bytes;
    total += bytes;
  }
  const bool split = groups.size() > 1;
  const fs::path out_path(out_file);
  std::string stem = out_path.filename().string();
  if (stem.size() > 12 && stem.compare(stem.size() - 12, 12, ".safetensors") == 0) stem.resize(stem.size() - 12);
  std::vector<std::string> written;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<std::string> keys = groups[g];
    if (g == 0) keys.insert(keys.end(), objects.begin(), objects.end());
    StateDict sd = load_keys(checkpoint_dir, keys);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    meta["format"] = "pt";
    for (const auto& [k, v] : sd) {
      if (const auto* t = std::get_if<at::Tensor>(&v)) {
        tensors.emplace_back(k, t->contiguous());
      } else {
        meta[k] = to_hex(torch::jit::pickle_save(std::get<c10::IValue>(v)));
      }
    }
    std::string path = out_file;
    if (split) {
      char name[64];
      std::snprintf(name, sizeof(name), "-%05zu-of-%05zu.safetensors", g + 1, groups.size());
      path = (out_path.parent_path() / (stem + name)).string();
      for (const auto& [k, t] : tensors) weight_map[k] = fs::path(path).filename().string();
    }
    write_safetensors(path, tensors, meta);
    written.push_back(path);
  }
  if (split) {
    const std::string index = out_file + ".index.json";
    nlohmann::ordered_json j = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    std::ofstream out(index, std::ios::trunc);
    TORCH_CHECK(out, "cannot create '", index, "'");
    out << j.dump(2) << "\n";
    out.flush();
    TORCH_CHECK(out, "cannot write '", index, "'");
    written.push_back(index);
  }
  return written;
}

LoadResult load_safetensors(StateDict& state_dict, const std::string& path, const LoadOptions& options) {
  return detail::load_collective(options, [&] {
    SafetensorsSource s;
    read_safetensors_source(path, state_dict, s);
    return detail::load_local(state_dict, s.source, options);
  });
}

}  // namespace checkpoint
}  // namespace dtensor
