// dtensor/checkpoint/export.h and tools/dcp: a checkpoint saved by the ranks exported to a
// torch.save file (read back with libtorch's pickle_load, and with Python's torch.load in its
// weights_only mode when python3-torch is installed) and to safetensors, one file and split
// with a .index.json (parsed here byte by byte, and read with Python's safetensors when
// installed); safetensors files imported into sharded state dicts (load_safetensors);
// `dcp list` and `dcp convert`.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/export.h"
#include "dtensor/comm/comm.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/build_paths.h"
#include "suites/testing/checkpoint_errors.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

namespace dtensor {
namespace {

namespace paths = testing::build_paths;
namespace dcp = checkpoint;
namespace fs = std::filesystem;
using testing::contains;

class CheckpointExport : public testing::MultiProcessTest {};

// The checkpoint of these tests, saved by every rank of the test into `dir` (on a (n / 2)x2 mesh:
// the world size must be even); the expected whole values.
std::map<std::string, at::Tensor> expected_tensors() {
  return {{"w", at::arange(35, at::kFloat).view({7, 5})},
          {"bf", at::arange(6, at::kBFloat16)},
          {"ids", at::arange(5, at::kLong) * 3},
          {"mask", at::arange(4, at::kLong).remainder(2).to(at::kBool)}};
}

void save_example(const testing::MultiRankTest& t, const std::string& dir) {
  auto mesh = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  auto e = expected_tensors();
  dcp::StateDict sd{{"w", distribute_tensor(e["w"], mesh, {Shard{0}, Shard{1}})},
                    {"bf", e["bf"]},
                    {"ids", distribute_tensor(e["ids"], mesh, {Replicate{}, Shard{0}})},
                    {"mask", e["mask"]},
                    {"step", c10::IValue(int64_t(9))},
                    {"sizes", c10::IValue(std::vector<int64_t>{3, 4})}};
  dcp::save(sd, dir);
}

// The probe uses the interpreter the checks run (/usr/bin/python3, where Debian's python3-torch
// and python3-safetensors live), not whichever python3 comes first in PATH (pyenv's has none).
bool python_has(const std::string& module) {
  return std::system(("/usr/bin/python3 -c 'import " + module + "' >/dev/null 2>&1").c_str()) == 0;
}

// Runs `script` (written to <base>/<name>) with /usr/bin/python3 on `args`: it must exit 0
// printing `ok`.
void expect_python_check(const std::string& base, const std::string& name, const std::string& script,
                         const std::vector<std::string>& args, const std::string& ok) {
  std::ofstream(base + "/" + name) << script;
  std::vector<std::string> argv{base + "/" + name};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = testing::run_program("/usr/bin/python3", argv);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_PRED2(contains, r.output, ok);
}

// The bytes of one safetensors file: its header and where its data starts.
struct Safetensors {
  std::string bytes;
  nlohmann::json header;
  const char* data = nullptr;
};
Safetensors parse_safetensors(const std::string& path) {
  Safetensors f;
  f.bytes = testing::read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | (unsigned char)f.bytes[size_t(i)];
  EXPECT_EQ((8 + n) % 8, 0u) << path;
  f.header = nlohmann::json::parse(f.bytes.substr(8, n));
  f.data = f.bytes.data() + 8 + n;
  return f;
}

const std::map<std::string, std::string> kSafetensorsDtype = {
    {"w", "F32"}, {"bf", "BF16"}, {"ids", "I64"}, {"mask", "BOOL"}};

// Tensor `k` of a parsed file equals `t` (dtype name, shape, bytes).
void expect_safetensors_tensor(const Safetensors& f, const std::string& k, const at::Tensor& t) {
  const auto& h = f.header.at(k);
  EXPECT_EQ(h.at("dtype"), kSafetensorsDtype.at(k));
  EXPECT_EQ(h.at("shape").get<std::vector<int64_t>>(), t.sizes().vec());
  auto off = h.at("data_offsets").get<std::vector<int64_t>>();
  ASSERT_EQ(off[1] - off[0], int64_t(t.nbytes())) << k;
  EXPECT_EQ(std::memcmp(f.data + off[0], t.data_ptr(), t.nbytes()), 0) << k;
}

DTENSOR_TEST_F(CheckpointExport, TorchSaveAndSafetensorsFiles) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // save_example's mesh
  std::string base;
  std::unique_ptr<testing::TempDir> tmp;
  if (rank() == 0) tmp = std::make_unique<testing::TempDir>();
  base = comm::all_gather_object(group(), tmp ? tmp->path() : std::string())[0];
  const std::string ckpt = base + "/ckpt";
  save_example(*this, ckpt);
  group().barrier();
  if (rank() == 0) {
    auto expected = expected_tensors();
    // torch.save file, read back by libtorch.
    dcp::export_torch_save(ckpt, base + "/model.pt");
    std::string bytes = testing::read_file(base + "/model.pt");
    auto dict = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
    EXPECT_EQ(dict.size(), 6u);
    for (const auto& [k, t] : expected) EXPECT_TRUE(at::equal(dict.at(k).toTensor(), t)) << k;
    EXPECT_EQ(dict.at("step").toInt(), 9);

    EXPECT_EQ(dict.at("sizes").toList().size(), 2u);

    // safetensors, parsed here.
    auto files = dcp::export_safetensors(ckpt, base + "/model.safetensors");
    EXPECT_EQ(files, std::vector<std::string>{base + "/model.safetensors"});
    Safetensors st = parse_safetensors(base + "/model.safetensors");
    for (const auto& [k, t] : expected) expect_safetensors_tensor(st, k, t);
    EXPECT_EQ(st.header.at("__metadata__").at("format"), "pt");
    EXPECT_TRUE(st.header.at("__metadata__").contains("step"));
    EXPECT_EQ(size_t(st.data - st.bytes.data()) + 140 + 12 + 40 + 4, st.bytes.size());  // w, bf, ids, mask

    // Split at 64 bytes (key order bf 12, ids 40, mask 4 | w 140): two files and the index.
    fs::create_directories(base + "/split");
    dcp::SafetensorsExportOptions split;
    split.max_shard_bytes = 64;
    files = dcp::export_safetensors(ckpt, base + "/split/model.safetensors", split);
    const std::vector<std::string> names{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                         "model.safetensors.index.json"};
    ASSERT_EQ(files.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(files[i], base + "/split/" + names[i]);
    auto index = nlohmann::json::parse(testing::read_file(files[2]));
    EXPECT_EQ(index.at("metadata").at("total_size"), 196);
    EXPECT_EQ(index.at("weight_map"), nlohmann::json({{"bf", names[0]}, {"ids", names[0]}, {"mask", names[0]}, {"w", names[1]}}));
    Safetensors part1 = parse_safetensors(files[0]), part2 = parse_safetensors(files[1]);
    for (const char* k : {"bf", "ids", "mask"}) expect_safetensors_tensor(part1, k, expected[k]);
    expect_safetensors_tensor(part2, "w", expected["w"]);
    EXPECT_TRUE(part1.header.at("__metadata__").contains("step"));  // objects: in the first file
    EXPECT_FALSE(part2.header.at("__metadata__").contains("step"));
    EXPECT_FALSE(part2.header.contains("ids"));
    dcp::SafetensorsExportOptions one_file;  // everything fits: one file, no index
    one_file.max_shard_bytes = 1 << 20;
    EXPECT_EQ(dcp::export_safetensors(ckpt, base + "/split/all.safetensors", one_file).size(), 1u);

    // The real readers, where installed (CI installs python3-torch; python3-safetensors only
    // exists in Debian 13). torch.load in weights_only mode (torch 2.6's default): the file
    // has no TorchScript type tags nor torch.jit._pickle list builders.
    if (python_has("torch")) {
      expect_python_check(base, "check.py",
                          "import sys, torch\n"
                          "d = torch.load(sys.argv[1], weights_only=True)\n"
                          "assert torch.equal(d['w'], torch.arange(35, dtype=torch.float32).view(7, 5)), d['w']\n"
                          "assert torch.equal(d['bf'], torch.arange(6, dtype=torch.bfloat16))\n"
                          "assert torch.equal(d['ids'], torch.arange(5) * 3)\n"
                          "assert d['mask'].tolist() == [False, True, False, True]\n"
                          "assert d['step'] == 9\n"
                          "assert d['sizes'] == [3, 4], d['sizes']\n"
                          "print('torch.load OK')\n",
                          {base + "/model.pt"}, "torch.load OK");
    } else {
      std::cout << "python3 has no torch module (Debian: python3-torch): torch.load not checked\n";
    }
    if (python_has("safetensors.numpy")) {
      // numpy has no bfloat16: every tensor but 'bf' (safetensors.numpy raises on it). The
      // split files through their index, as Hugging Face's loaders do.
      expect_python_check(base, "check_st.py",
                          "import sys, json, os, numpy as np\n"
                          "from safetensors import safe_open\n"
                          "def read(path):\n"
                          "    with safe_open(path, framework='np') as f:\n"
                          "        return {k: f.get_tensor(k) for k in f.keys() if k != 'bf'}\n"
                          "def check(d):\n"
                          "    assert (d['w'] == np.arange(35, dtype=np.float32).reshape(7, 5)).all()\n"
                          "    assert (d['ids'] == np.arange(5) * 3).all()\n"
                          "    assert d['mask'].tolist() == [False, True, False, True]\n"
                          "check(read(sys.argv[1]))\n"
                          "index = json.load(open(sys.argv[2]))\n"
                          "d = {}\n"
                          "for name in sorted(set(index['weight_map'].values())):\n"
                          "    d.update(read(os.path.join(os.path.dirname(sys.argv[2]), name)))\n"
                          "check(d)\n"
                          "print('safetensors OK')\n",
                          {base + "/model.safetensors", files[2]}, "safetensors OK");
    }

    // tools/dcp.
    auto ls = testing::run_program(paths::dcp_tool(), {"list", ckpt});
    EXPECT_EQ(ls.exit_code, 0) << ls.output;
    EXPECT_PRED2(contains, ls.output, "format version 1, save 1, written by " + std::to_string(ranks()) + " ranks");
    // w's chunks: its non-empty boxes, 7 rows over ranks / 2 times 5 columns over 2.
    const int64_t rows = static_cast<int64_t>(at::arange(7).chunk(ranks() / 2).size());
    std::string chunks = std::to_string(rows * 2);
    chunks.resize(11, ' ');
    EXPECT_PRED2(contains, ls.output, "w                                        tensor   float32    [7, 5]                   " +
                                          chunks + "140");
    EXPECT_PRED2(contains, ls.output, "step                                     object");
    auto conv = testing::run_program(paths::dcp_tool(), {"convert", ckpt, "--to", "torch", base + "/tool.pt"});
    EXPECT_EQ(conv.exit_code, 0) << conv.output;
    EXPECT_EQ(testing::read_file(base + "/tool.pt"), bytes);
    fs::create_directories(base + "/tool_split");
    conv = testing::run_program(paths::dcp_tool(), {"convert", ckpt, "--to", "safetensors",
                                                        base + "/tool_split/model.safetensors", "--max-shard-bytes", "64"});
    EXPECT_EQ(conv.exit_code, 0) << conv.output;
    for (const auto& name : names) {
      EXPECT_EQ(testing::read_file(base + "/tool_split/" + name), testing::read_file(base + "/split/" + name)) << name;
    }
    auto bad = testing::run_program(paths::dcp_tool(), {"list", base + "/nothing"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_PRED2(contains, bad.output, "dcp: no checkpoint in '" + base + "/nothing'");
  }
  group().barrier();
}

// ---- load_safetensors ---------------------------------------------------------------------------

DTENSOR_RANK_FIXTURES(SafetensorsGloo, SafetensorsThreads);

std::vector<sharded::RemoteDevice> cpu_ranks(int n) {
  std::vector<sharded::RemoteDevice> out;
  for (int r = 0; r < n; ++r) out.emplace_back("rank:" + std::to_string(r) + "/cpu");
  return out;
}

// Every rank holds its part of `full`: a DTensor's local shard, a ShardedTensor's shards, a
// plain tensor whole.
void expect_part_of(const dcp::StateDictValue& v, const at::Tensor& full, const std::string& what) {
  if (const auto* t = std::get_if<at::Tensor>(&v)) {
    EXPECT_TRUE(at::equal(is_dtensor(*t) ? full_tensor(*t) : *t, full)) << what;
    return;
  }
  for (const auto& shard : std::get<sharded::ShardedTensor>(v).local_shards()) {
    at::Tensor expected = full;
    for (size_t d = 0; d < shard.metadata.shard_sizes().size(); ++d) {
      expected = expected.narrow(int64_t(d), shard.metadata.shard_offsets()[d], shard.metadata.shard_sizes()[d]);
    }
    EXPECT_TRUE(at::equal(shard.tensor, expected)) << what;
  }
}

// load_safetensors(sd, path) with strict = false raises on every rank with `text` in the message.
void expect_import_fails_everywhere(dcp::StateDict& sd, const std::string& path, const std::string& text) {
  dcp::LoadOptions lax;
  lax.strict = false;
  auto err = testing::checkpoint_error_of([&] { dcp::load_safetensors(sd, path, lax); });
  ASSERT_TRUE(err);
  std::vector<int> everyone(static_cast<size_t>(comm::default_group()->size()));  // every rank
  std::iota(everyone.begin(), everyone.end(), 0);
  EXPECT_EQ(testing::failing_ranks(*err), everyone);
  EXPECT_PRED2(contains, err->what_without_backtrace(), text);
}

// A checkpoint exported to safetensors (one file; split with an index) and read by every rank
// into other layouts: each rank reads its own shards' bytes.
DTENSOR_TEST_BOTH(SafetensorsGloo, SafetensorsThreads, ImportsIntoShardedStateDicts) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  std::unique_ptr<testing::TempDir> tmp;
  if (t.rank() == 0) tmp = std::make_unique<testing::TempDir>();
  const std::string base = comm::all_gather_object(t.group(), tmp ? tmp->path() : std::string())[0];
  save_example(t, base + "/ckpt");
  const std::string single = base + "/model.safetensors", index = base + "/split/model.safetensors.index.json";
  if (t.rank() == 0) {
    dcp::export_safetensors(base + "/ckpt", single);
    fs::create_directories(base + "/split");
    dcp::SafetensorsExportOptions split;
    split.max_shard_bytes = 64;
    dcp::export_safetensors(base + "/ckpt", base + "/split/model.safetensors", split);
  }
  t.group().barrier();
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  auto e = expected_tensors();
  for (const std::string& path : {single, index}) {
    dcp::StateDict sd{// 7 rows over (tp, dp) as FSDP x TP lays them out: uneven, strided
                      {"w", distribute_tensor(at::zeros({7, 5}), mesh2, {StridedShard(0, 2), Shard{0}})},
                      {"ids", dtensor::zeros({5}, mesh1, {Shard{0}}, at::kLong)},
                      {"bf", sharded::shard_tensor(at::zeros({6}, at::kBFloat16),
                                                   sharded::ChunkShardingSpec(0, cpu_ranks(t.ranks())))},
                      {"mask", c10::IValue()},  // None: the whole tensor
                      {"step", c10::IValue()},  // an object, from the file's metadata
                      {"sizes", c10::IValue()}};
    auto r = dcp::load_safetensors(sd, path);
    EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
    for (const auto& [k, full] : e) expect_part_of(sd.at(k), full, path + ": " + k);
    EXPECT_EQ(std::get<c10::IValue>(sd.at("step")).toInt(), 9);
    EXPECT_EQ(std::get<c10::IValue>(sd.at("sizes")).toIntVector(), (std::vector<int64_t>{3, 4}));
  }
  // Strict: keys of the file the state dict lacks are errors (on every rank); not strict:
  // reported. Metadata strings that are not keys of the state dict ("format") are not keys.
  {
    dcp::StateDict sd{{"w", dtensor::zeros({7, 5}, mesh1, {Shard{1}})}};
    auto err = testing::checkpoint_error_of([&] { dcp::load_safetensors(sd, index); });
    ASSERT_TRUE(err);
    std::vector<int> everyone(static_cast<size_t>(t.ranks()));
    std::iota(everyone.begin(), everyone.end(), 0);
    EXPECT_EQ(testing::failing_ranks(*err), everyone);
    EXPECT_PRED2(contains, err->what_without_backtrace(),
                 "the state dict and the safetensors index '" + index +
                     "' have different keys (strict load): not in the state dict: ['bf', 'ids', 'mask'];");
    dcp::LoadOptions lax;
    lax.strict = false;
    auto r = dcp::load_safetensors(sd, index, lax);
    EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"bf", "ids", "mask"}));
    expect_part_of(sd.at("w"), e["w"], "lax w");
  }
  // A dtype mismatch.
  {
    dcp::StateDict sd{{"w", dtensor::zeros({7, 5}, mesh1, {Shard{0}}, at::kDouble)}};
    expect_import_fails_everywhere(sd, single, "key 'w' has dtype float64 in the state dict but float32 in the checkpoint");
  }
  // A truncated file (w, the last tensor, loses its end), and an index naming the wrong file.
  if (t.rank() == 0) {
    fs::resize_file(single, fs::file_size(single) - 10);
    std::ofstream(base + "/split/bad.index.json")
        << R"({"weight_map": {"w": "model-00001-of-00002.safetensors"}})";
  }
  t.group().barrier();
  {
    dcp::StateDict sd{{"w", dtensor::zeros({7, 5}, mesh1, {Shard{0}})}};
    expect_import_fails_everywhere(sd, single, "safetensors file '" + single + "': key 'w': its bytes end at");
    expect_import_fails_everywhere(sd, single, "past the end of the file");
    expect_import_fails_everywhere(sd, base + "/split/bad.index.json",
                                   "maps key 'w' to 'model-00001-of-00002.safetensors', which does not hold it");
  }
  t.group().barrier();
}

}  // namespace
}  // namespace dtensor
