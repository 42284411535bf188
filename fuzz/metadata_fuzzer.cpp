// fuzz/metadata_fuzzer.cpp: the `.metadata` file of a checkpoint directory.
//
// Input: the file's bytes. Calls read_metadata (the SAX reader, the json-tree fallback,
// validate_metadata). Also checks the SAX reader's promise (planner.h): where it reads the
// text itself, it gives what nlohmann::json + from_json give.
#include "fuzz/fuzz_util.h"

#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"

#include <nlohmann/json.hpp>

namespace ckpt = dtensor::checkpoint;
namespace fuzz = dtensor::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fuzz::TempDir dir;
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::write_file(dir.file(".metadata"), text);
  fuzz::expect_clear_errors(dir.file(".metadata"), [&] { ckpt::read_metadata(dir.path()); });

  std::optional<ckpt::Metadata> fast;
  try {
    fast = ckpt::detail::parse_metadata_fast(text);
  } catch (const std::exception& e) {
    fuzz::finding(std::string("parse_metadata_fast threw: ") + e.what());
  }
  if (!fast) return 0;
  nlohmann::json slow;
  try {
    slow = nlohmann::json::parse(text).get<ckpt::Metadata>();
  } catch (const std::exception& e) {
    fuzz::finding(std::string("the SAX reader accepts a text that nlohmann::json + from_json reject: ") + e.what());
  }
  if (nlohmann::json(*fast) != slow)
    fuzz::finding("the SAX reader and nlohmann::json disagree:\n" + nlohmann::json(*fast).dump() + "\n" +
                  slow.dump());
  return 0;
}
