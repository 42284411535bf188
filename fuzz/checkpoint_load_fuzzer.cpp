// fuzz/checkpoint_load_fuzzer.cpp: a checkpoint directory (`.metadata` and a data file) read by
// load, as load_full and `dcp convert` do: every key into a None placeholder.
//
// Input: [flags: 1 byte][n: 2 bytes, little-endian][n bytes: .metadata][the rest: __0_0.distcp].
// flags bit 0: LoadOptions::verify_checksums (without it, data whose checksums the fuzzer
// cannot forge still reaches the tensor and object readers).
#include "fuzz/fuzz_util.h"

#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

namespace ckpt = dtensor::checkpoint;
namespace fuzz = dtensor::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::TempDir dir;
  if (size < 3) return -1;
  const bool verify = data[0] & 1;
  const size_t n = std::min(size - 3, size_t(data[1]) | size_t(data[2]) << 8);
  dir.clear();
  fuzz::write_file(dir.file(".metadata"), fuzz::as_text(data + 3, n));
  fuzz::write_file(dir.file("__0_0.distcp"), fuzz::as_text(data + 3 + n, size - 3 - n));
  fuzz::expect_clear_errors(dir.path(), [&] {
    ckpt::StateDict sd;
    for (const auto& [key, entry] : ckpt::read_metadata(dir.path()).entries) sd[key] = c10::IValue();
    ckpt::LoadOptions options;
    options.no_dist = true;
    options.strict = false;
    options.verify_checksums = verify;
    ckpt::load(sd, dir.path(), options);
  });
  return 0;
}
