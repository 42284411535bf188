// dtensor/checkpoint/export.cpp: checkpoints as torch.save and safetensors files, and
// safetensors files read into sharded state dicts (see export.h).
#include "dtensor/checkpoint/export.h"

#include "dtensor/checkpoint/json_internal.h"
#include "dtensor/checkpoint/hf_internal.h"

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

// Writes one safetensors file: `tensors` (key order) and `metadata` strings.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const nlohmann::ordered_json& metadata) {
  std::vector<detail::SafetensorsTensor> laid_out;
  for (const auto& [k, t] : tensors) laid_out.push_back({k, dtype_name(t.scalar_type()), t.sizes().vec()});
  const std::string header = detail::safetensors_header(laid_out, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, "cannot create '", path, "'");
  out.write(header.data(), std::streamsize(header.size()));
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
        meta[k] = detail::to_hex(torch::jit::pickle_save(std::get<c10::IValue>(v)));
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


}  // namespace checkpoint
}  // namespace dtensor
