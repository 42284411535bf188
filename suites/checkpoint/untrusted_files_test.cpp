// The checkpoint readers on bad files (docs/fuzzing.md): the inputs the fuzz targets found
// (fuzz/regressions/), each giving a c10::Error that names the file and what is wrong instead
// of undefined behaviour, an unbounded allocation or another exception type. One process, no
// process group.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/crc32.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::error_of;

// A fresh directory under the test's temporary directory.
std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dtensor-untrusted-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// `.metadata` text with the given entries (JSON) and checksum block.
std::string metadata_text(const std::string& entries, const std::string& block = "1048576") {
  return R"({"format": "dtensor-cpp-dcp", "version": 1, "save_id": 0, "world_size": 1, "checksum": "crc32",)"
         R"( "checksum_block_bytes": )" +
         block + R"(, "entries": )" + entries + "}";
}

std::string chunk(const std::string& offsets, const std::string& sizes, const std::string& offset,
                  const std::string& length, const std::string& crc32, const std::string& file = "__0_0.distcp") {
  return R"({"offsets": )" + offsets + R"(, "sizes": )" + sizes + R"(, "file": ")" + file + R"(", "offset": )" +
         offset + R"(, "length": )" + length + R"(, "crc32": )" + crc32 + "}";
}

std::string tensor_entry(const std::string& dtype, const std::string& size, const std::string& chunk_json) {
  return R"({"kind": "tensor", "dtype": ")" + dtype + R"(", "size": )" + size + R"(, "chunks": [)" + chunk_json + "]}";
}

std::string object_entry(const std::string& chunk_json) {
  return R"({"kind": "object", "chunks": [)" + chunk_json + "]}";
}

struct BadFile {
  std::string name;
  std::string text;      // the file's bytes
  std::string expected;  // part of the error
};

TEST(CheckpointReaders, MetadataWithOutOfRangeNumbersIsRejectedNamingTheFile) {
  const std::string crc_float = tensor_entry("int64", "[3]", chunk("[0]", "[3]", "0", "24", "[2.76777e+20]"));
  const std::vector<BadFile> cases = {
      {"size whose element count overflows",
       metadata_text(R"({"w": )" + tensor_entry("float32", "[4611686018427387904, 4]",
                                              chunk("[0, 0]", "[4611686018427387904, 4]", "0", "0", "[]")) + "}"),
       "key 'w': size [4611686018427387904, 4] is negative or has more than 2^63 elements"},
      {"chunk whose end overflows",
       metadata_text(R"({"w": )" + tensor_entry("float32", "[1]", chunk("[9223372036854775807]", "[1]", "0", "4", "[1]")) + "}"),
       "key 'w': chunk offsets=[9223372036854775807] sizes=[1] is out of bounds of size [1]"},
      {"length whose block count overflows",
       metadata_text(R"({"w": )" + tensor_entry("float32", "[1]", chunk("[0]", "[1]", "0", "9223372036854775807", "[1]")) + "}",
                     "16"),
       "has 1 checksums for 576460752303423488 blocks"},
      {"byte range that overflows",
       metadata_text(R"({"w": )" + tensor_entry("float32", "[1]", chunk("[0]", "[1]", "9223372036854775807", "4", "[1]")) + "}"),
       "key 'w' has an invalid byte range (offset 9223372036854775807, length 4)"},
      {"crc32 out of range, as a float", metadata_text(R"({"b": )" + crc_float + "}"),
       "checkpoint metadata: crc32 must be an integer in [0, 4294967295], got 2.76777e+20"},
      {"checksum block near 2^63",
       metadata_text(R"({"w": )" + tensor_entry("float32", "[1]", chunk("[0]", "[1]", "0", "4", "[1]")) + "}",
                     "9223372036854775792"),
       "checksum_block_bytes 9223372036854775792 is not a positive multiple of 16 of at most 1099511627776"},
      {"data file outside the directory",
       metadata_text(R"({"w": )" + tensor_entry("uint8", "[4]", chunk("[0]", "[4]", "0", "4", "[1]", "../../etc/hostname")) + "}"),
       "key 'w' is stored in '../../etc/hostname', which is not a file name of the checkpoint directory"},
      {"object without a data file", metadata_text(R"({"o": )" + object_entry(chunk("[]", "[]", "0", "4", "[1]", "")) + "}"),
       "key 'o' is stored in '', which is not a file name of the checkpoint directory"},
  };
  const std::string dir = fresh_dir("metadata");
  const std::string path = (fs::path(dir) / ".metadata").string();
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    write_file(path, c.text);
    const std::string err = error_of([&] { read_metadata(dir); });
    EXPECT_PRED2(contains, err, "checkpoint metadata file '" + path + "' is not valid: ");
    EXPECT_PRED2(contains, err, c.expected);
  }
}

// Sizes in a valid `.metadata` that its data file does not hold: load checks them against the
// file before allocating (a None placeholder's tensor, an object's bytes), and libtorch's
// unpickler errors name the key and file.
TEST(CheckpointReaders, LoadChecksSizesAgainstTheDataFileBeforeAllocating) {
  const std::string data = "abcd";
  const std::string crc = "[" + std::to_string(crc32(data.data(), data.size())) + "]";
  const std::vector<BadFile> cases = {
      {"a 2 GiB tensor in 4 bytes",
       metadata_text(R"({"w": )" + tensor_entry("float32", "[536870912]", chunk("[0]", "[536870912]", "0", "2147483648", "[0]")) + "}",
                     "2147483648"),
       "' is truncated: key 'w' (chunk offsets=[0] sizes=[536870912]) needs bytes [0, 2147483648) of it, the file ends at 4"},
      {"a 1 TiB object in 4 bytes",
       metadata_text(R"({"o": )" + object_entry(chunk("[]", "[]", "0", "1099511627776", "[0]")) + "}", "1099511627776"),
       "' is truncated: key 'o' (chunk offsets=[] sizes=[]) needs bytes [0, 1099511627776) of it, the file ends at 4"},
      {"an object that is not a pickle", metadata_text(R"({"o": )" + object_entry(chunk("[]", "[]", "0", "4", crc)) + "}"),
       "cannot read the value of key 'o' from data file '"},
  };
  const std::string dir = fresh_dir("load");
  const std::string file = (fs::path(dir) / "__0_0.distcp").string();
  write_file(file, data);
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    write_file((fs::path(dir) / ".metadata").string(), c.text);
    StateDict sd{{"w", c10::IValue()}, {"o", c10::IValue()}};
    LoadOptions options;
    options.no_dist = true;
    options.strict = false;
    const std::string err = error_of([&] { load(sd, dir, options); });
    EXPECT_PRED2(contains, err, "data file '" + file);
    EXPECT_PRED2(contains, err, c.expected);
  }
}

// A stored value whose pickle declares a string longer than the pickle: libtorch 1.13's
// unpickler would reserve the 4 GiB first; the check before it names the key and file.
TEST(CheckpointReaders, PickledValueLengthsAreCheckedBeforeLibtorchReadsThem) {
  const std::vector<char> saved = torch::jit::pickle_save(c10::IValue(std::string("abcde")));
  std::string data(saved.begin(), saved.end());
  const std::string binunicode("X\x05\0\0\0abcde", 10);
  const size_t at = data.find(binunicode);
  ASSERT_NE(at, std::string::npos);
  data.replace(at + 1, 4, std::string("\xf0\xff\xff\xff", 4));
  const std::string dir = fresh_dir("pickle");
  const std::string file = (fs::path(dir) / "__0_0.distcp").string();
  write_file(file, data);
  const std::string crc = "[" + std::to_string(crc32(data.data(), data.size())) + "]";
  write_file((fs::path(dir) / ".metadata").string(),
             metadata_text(R"({"o": )" + object_entry(chunk("[]", "[]", "0", std::to_string(data.size()), crc)) + "}"));
  StateDict sd{{"o", c10::IValue()}};
  LoadOptions options;
  options.no_dist = true;
  EXPECT_PRED2(contains, error_of([&] { load(sd, dir, options); }),
               "cannot read the value of key 'o' from data file '" + file + "' (bytes [0, " +
                   std::to_string(data.size()) + ")): the pickle's a string at byte ");
  EXPECT_PRED2(contains, error_of([&] { load(sd, dir, options); }), "needs 4294967280 bytes");
}

// A safetensors file: 8-byte little-endian header length, the header.
std::string safetensors_bytes(const std::string& header) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  return out + header;
}

TEST(CheckpointReaders, SafetensorsHeaderSizesNeverOverflow) {
  const std::vector<BadFile> cases = {
      {"header length of 2^64 - 1", std::string(8, '\xff') + "{}",
       "is truncated or not safetensors: its header says 18446744073709551615 bytes of JSON, the file has 2"},
      {"shape whose element count overflows",
       safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})"),
       "key 'w': the shape has more than 2^63 elements"},
      {"data_offsets whose difference overflows",
       safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [1, -9223372036854775808]}})"),
       "key 'w': data_offsets [1, -9223372036854775808) do not hold 0 elements of float32"},
      {"data end that overflows",
       safetensors_bytes(
           R"({"w": {"dtype": "F32", "shape": [2305843009213693950], "data_offsets": [0, 9223372036854775800]}})"),
       "key 'w': its bytes end at 9223372036854775800 after the header, past the end of the file"},
      {"shape as a float out of range",
       safetensors_bytes(R"({"w": {"dtype": "F32", "shape": [1e300], "data_offsets": [0, 0]}})"),
       "key 'w': shape must be an integer in"},
  };
  const std::string dir = fresh_dir("safetensors");
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    write_file(path, c.text);
    StateDict sd{{"w", c10::IValue()}};
    LoadOptions options;
    options.no_dist = true;
    options.strict = false;
    const std::string err = error_of([&] { load_safetensors(sd, path, options); });
    EXPECT_PRED2(contains, err, "safetensors file '" + path + "'");
    EXPECT_PRED2(contains, err, c.expected);
  }
}

TEST(CheckpointReaders, SafetensorsMetadataValueErrorsNameTheFile) {
  const std::string dir = fresh_dir("safetensors_metadata");
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  write_file(path, safetensors_bytes(R"({"__metadata__": {"format": "pt", "step": "0g"}})"));
  StateDict sd{{"step", c10::IValue()}};
  LoadOptions options;
  options.no_dist = true;
  EXPECT_PRED2(contains, error_of([&] { load_safetensors(sd, path, options); }),
               "key 'step' of the \"__metadata__\" of safetensors file '" + path +
                   "' is not a value dtensor-cpp wrote (not hex)");
}

TEST(CheckpointReaders, SafetensorsIndexNamesOnlyFilesBesideIt) {
  const std::string dir = fresh_dir("index");
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  write_file(index, R"({"weight_map": {"w": "../model.safetensors"}})");
  StateDict sd{{"w", c10::IValue()}};
  LoadOptions options;
  options.no_dist = true;
  EXPECT_PRED2(contains, error_of([&] { load_safetensors(sd, index, options); }),
               "safetensors index '" + index +
                   "' maps key 'w' to '../model.safetensors', which is not a file name beside the index");
}

// A save into a directory that already holds things writes new files, never into what is there:
// not into the data files of a checkpoint whose `.metadata` cannot be read, not through a link
// that has a data file's name (whose target lies outside the directory).
TEST(CheckpointDirectories, ASaveReplacesNothingTheDirectoryHolds) {
  SaveOptions o;
  o.no_dist = true;
  const std::string dir = fresh_dir("occupied");
  const std::string outside = (fs::path(fresh_dir("outside")) / "target").string();
  fs::create_symlink(outside, fs::path(dir) / "__0_3.distcp");
  write_file((fs::path(dir) / "__0_2.distcp").string(), "live data");
  write_file((fs::path(dir) / ".metadata").string(), "{not json");
  StateDict sd{{"w", at::arange(6, at::kFloat)}};
  // (Once committed, the save removes the older data files: the commit replaced their checkpoint.)
  const Metadata m = save(sd, dir, o);
  EXPECT_EQ(m.files(), std::vector<std::string>{"__0_4.distcp"});
  EXPECT_FALSE(fs::exists(outside)) << "the save wrote through the link";
  StateDict back{{"w", at::zeros({6})}};
  LoadOptions lo;
  lo.no_dist = true;
  load(back, dir, lo);
  EXPECT_TRUE(at::equal(std::get<at::Tensor>(back.at("w")), at::arange(6, at::kFloat)));
}

}  // namespace
}  // namespace checkpoint
}  // namespace dtensor
