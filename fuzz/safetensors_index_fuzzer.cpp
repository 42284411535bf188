// fuzz/safetensors_index_fuzzer.cpp: the .index.json of a split safetensors export, read by
// load_safetensors.
//
// Input: the index's bytes. Beside it lie two small valid files, model-00001-of-00002.safetensors
// (key "a", float32 [2]) and model-00002-of-00002.safetensors (key "b", int64 [1]); the state
// dict asks for "a", "b" and every key the index's "weight_map" seems to name.
#include "fuzz/fuzz_util.h"

#include "dtensor/checkpoint/export.h"

#include <nlohmann/json.hpp>

namespace ckpt = dtensor::checkpoint;
namespace fuzz = dtensor::fuzz;

namespace {

// A safetensors file of one tensor `key` whose data is `bytes`.
std::string safetensors_file(const std::string& key, const std::string& dtype, int64_t numel, const std::string& bytes) {
  std::string header = nlohmann::json{{key, {{"dtype", dtype}, {"shape", {numel}}, {"data_offsets", {0, bytes.size()}}}},
                                      {"__metadata__", {{"format", "pt"}}}}
                           .dump();
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return out + header + bytes;
}

const fuzz::TempDir& files() {
  static const fuzz::TempDir dir;
  static const bool written = [] {
    fuzz::write_file(dir.file("model-00001-of-00002.safetensors"),
                     safetensors_file("a", "F32", 2, std::string("\0\0\x80\x3f\0\0\0\x40", 8)));
    fuzz::write_file(dir.file("model-00002-of-00002.safetensors"),
                     safetensors_file("b", "I64", 1, std::string("\x07\0\0\0\0\0\0\0", 8)));
    return true;
  }();
  (void)written;
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fuzz::TempDir& dir = files();
  const std::string path = dir.file("model.safetensors.index.json");
  fuzz::write_file(path, fuzz::as_text(data, size));
  ckpt::StateDict sd{{"a", c10::IValue()}, {"b", c10::IValue()}};
  const auto index = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (index.is_object() && index.contains("weight_map") && index["weight_map"].is_object()) {
    for (const auto& [key, file] : index["weight_map"].items()) sd[key] = c10::IValue();
  }
  // Errors name the index or the file it led to: both in `dir`.
  fuzz::expect_clear_errors(dir.path(), [&] {
    ckpt::LoadOptions options;
    options.no_dist = true;
    options.strict = false;
    ckpt::load_safetensors(sd, path, options);
  });
  return 0;
}
