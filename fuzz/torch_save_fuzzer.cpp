// fuzz/torch_save_fuzzer.cpp: a non-tensor value of a checkpoint, stored as libtorch pickles
// it (torch::jit::pickle_save: the torch.save zip format, a pickle and its tensors' records).
//
// Input: the value's stored bytes. The target writes them as the data file of a checkpoint
// whose `.metadata` (with the bytes' true checksums) holds one object, and loads it.
#include "fuzz/fuzz_util.h"

#include "dtensor/checkpoint/crc32.h"
#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

#include <nlohmann/json.hpp>

namespace ckpt = dtensor::checkpoint;
namespace fuzz = dtensor::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::TempDir dir;
  ckpt::Metadata m;
  ckpt::StoredChunk sc;
  sc.file = "__0_0.distcp";
  sc.length = int64_t(size);
  for (size_t b = 0; b < size; b += size_t(m.checksum_block_bytes))
    sc.crc32.push_back(ckpt::crc32(data + b, std::min(size - b, size_t(m.checksum_block_bytes))));
  ckpt::Entry e;
  e.kind = ckpt::ItemKind::Object;
  e.chunks.push_back(sc);
  m.entries["value"] = e;
  fuzz::write_file(dir.file(".metadata"), nlohmann::json(m).dump());
  fuzz::write_file(dir.file(sc.file), fuzz::as_text(data, size));
  fuzz::expect_clear_errors(dir.path(), [&] {
    ckpt::StateDict sd{{"value", c10::IValue()}};
    ckpt::LoadOptions options;
    options.no_dist = true;
    ckpt::load(sd, dir.path(), options);
  });
  return 0;
}
