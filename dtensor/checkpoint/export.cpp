// dtensor/checkpoint/export.cpp: checkpoints as torch.save and safetensors files.
#include "dtensor/checkpoint/export.h"

#include "dtensor/checkpoint/save_load.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fstream>

namespace dtensor {
namespace checkpoint {

namespace {

void write_file(const std::string& path, const char* data, size_t n, const char* more = nullptr, size_t m = 0) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, "cannot create '", path, "'");
  out.write(data, std::streamsize(n));
  if (more) out.write(more, std::streamsize(m));
  out.flush();
  TORCH_CHECK(out, "cannot write '", path, "'");
}

}  // namespace

StateDict load_full(const std::string& checkpoint_dir) {
  Metadata m = read_metadata(checkpoint_dir);
  StateDict sd;
  for (const auto& [k, e] : m.entries) sd[k] = c10::IValue();
  LoadOptions o;
  o.no_dist = true;
  load(sd, checkpoint_dir, o);
  return sd;
}

void export_torch_save(const std::string& checkpoint_dir, const std::string& out_file) {
  StateDict sd = load_full(checkpoint_dir);
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [k, v] : sd) {
    if (const auto* t = std::get_if<at::Tensor>(&v)) {
      dict.insert(k, *t);
    } else {
      dict.insert(k, std::get<c10::IValue>(v));
    }
  }
  std::vector<char> bytes = torch::jit::pickle_save(c10::IValue(dict));
  write_file(out_file, bytes.data(), bytes.size());
}

std::string safetensors_dtype(const std::string& dtype) {
  static const std::map<std::string, std::string> names = {
      {"float32", "F32"}, {"float64", "F64"}, {"float16", "F16"}, {"bfloat16", "BF16"}, {"int64", "I64"},
      {"int32", "I32"},   {"int16", "I16"},   {"int8", "I8"},     {"uint8", "U8"},      {"bool", "BOOL"}};
  auto it = names.find(dtype);
  TORCH_CHECK(it != names.end(), "safetensors has no dtype for ", dtype);
  return it->second;
}

void export_safetensors(const std::string& checkpoint_dir, const std::string& out_file) {
  StateDict sd = load_full(checkpoint_dir);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  std::vector<at::Tensor> tensors;
  int64_t offset = 0;
  for (const auto& [k, v] : sd) {
    if (const auto* t = std::get_if<at::Tensor>(&v)) {
      at::Tensor c = t->contiguous();
      std::string dt = safetensors_dtype(dtype_name(c.scalar_type()));
      int64_t n = int64_t(c.nbytes());
      header[k] = {{"dtype", dt}, {"shape", c.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
      offset += n;
      tensors.push_back(c);
    } else {
      std::vector<char> bytes = torch::jit::pickle_save(std::get<c10::IValue>(v));
      static const char* hex = "0123456789abcdef";
      std::string h;
      for (char ch : bytes) {
        h += hex[(unsigned char)ch >> 4];
        h += hex[(unsigned char)ch & 15];
      }
      meta[k] = h;
    }
  }
  meta["format"] = "pt";
  header["__metadata__"] = meta;
  std::string text = header.dump();
  while ((text.size() + 8) % 8) text += ' ';  // data starts 8-byte aligned
  std::ofstream out(out_file, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out, "cannot create '", out_file, "'");
  uint64_t len = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = (unsigned char)(len >> (8 * i));
  out.write(reinterpret_cast<const char*>(le), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const auto& t : tensors) out.write(static_cast<const char*>(t.data_ptr()), std::streamsize(t.nbytes()));
  out.flush();
  TORCH_CHECK(out, "cannot write '", out_file, "'");
}

}  // namespace checkpoint
}  // namespace dtensor
