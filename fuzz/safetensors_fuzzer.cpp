// fuzz/safetensors_fuzzer.cpp: a .safetensors file read by load_safetensors.
//
// Input: the file's bytes (8-byte little-endian header length, the JSON header, the data). The
// state dict asks for every key the header seems to name (a None placeholder each: tensors
// whole, and values pickled in "__metadata__"), found by a lenient look at the header here; the
// reader itself parses everything again.
#include "fuzz/fuzz_util.h"

#include "dtensor/checkpoint/export.h"

#include <nlohmann/json.hpp>

namespace ckpt = dtensor::checkpoint;
namespace fuzz = dtensor::fuzz;

namespace {

// The keys of the header's JSON, and of its "__metadata__" (but "format"); none when it is not
// a JSON object.
ckpt::StateDict placeholders(const uint8_t* data, size_t size) {
  ckpt::StateDict sd;
  if (size < 8) return sd;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | data[i];
  if (n > size - 8) return sd;
  const auto header = nlohmann::json::parse(data + 8, data + 8 + n, nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return sd;
  for (const auto& [key, value] : header.items()) {
    if (key != "__metadata__") {
      sd[key] = c10::IValue();
    } else if (value.is_object()) {
      for (const auto& [mkey, mvalue] : value.items()) {
        if (mkey != "format") sd[mkey] = c10::IValue();
      }
    }
  }
  return sd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  fuzz::write_file(path, fuzz::as_text(data, size));
  fuzz::expect_clear_errors(path, [&] {
    ckpt::StateDict sd = placeholders(data, size);
    ckpt::LoadOptions options;
    options.no_dist = true;
    options.strict = false;
    ckpt::load_safetensors(sd, path, options);
  });
  return 0;
}
