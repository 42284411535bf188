// dtensor/checkpoint/export.h and tools/dcp: a checkpoint saved by 4 ranks exported to a
// torch.save file (read back with libtorch's pickle_load, and with Python's torch.load when
// python3-torch is installed) and to safetensors (parsed here byte by byte, and read with
// Python's safetensors when installed); `dcp list` and `dcp convert`.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/export.h"
#include "dtensor/comm/comm.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace dtensor {
namespace {

namespace dcp = checkpoint;
using testing::contains;

class CheckpointExport : public testing::MultiProcessTest {};

// The checkpoint of these tests, saved by 4 ranks into `dir`; the expected whole values.
std::map<std::string, at::Tensor> expected_tensors() {
  return {{"w", at::arange(35, at::kFloat).view({7, 5})},
          {"bf", at::arange(6, at::kBFloat16)},
          {"ids", at::arange(5, at::kLong) * 3},
          {"mask", at::arange(4, at::kLong).remainder(2).to(at::kBool)}};
}

void save_example(const std::string& dir) {
  auto mesh = init_device_mesh("cpu", {2, 2});
  auto e = expected_tensors();
  dcp::StateDict sd{{"w", distribute_tensor(e["w"], mesh, {Shard{0}, Shard{1}})},
                    {"bf", e["bf"]},
                    {"ids", distribute_tensor(e["ids"], mesh, {Replicate{}, Shard{0}})},
                    {"mask", e["mask"]},
                    {"step", c10::IValue(int64_t(9))}};
  dcp::save(sd, dir);
}

// The probe uses the interpreter the checks run (/usr/bin/python3, where Debian's python3-torch
// and python3-safetensors live), not whichever python3 comes first in PATH (pyenv's has none).
bool python_has(const std::string& module) {
  return std::system(("/usr/bin/python3 -c 'import " + module + "' >/dev/null 2>&1").c_str()) == 0;
}

DTENSOR_TEST_F(CheckpointExport, TorchSaveAndSafetensorsFiles) {
  std::string base;
  std::unique_ptr<testing::TempDir> tmp;
  if (rank() == 0) tmp = std::make_unique<testing::TempDir>();
  base = comm::all_gather_object(group(), tmp ? tmp->path() : std::string())[0];
  const std::string ckpt = base + "/ckpt";
  save_example(ckpt);
  group().barrier();
  if (rank() == 0) {
    auto expected = expected_tensors();
    // torch.save file, read back by libtorch.
    dcp::export_torch_save(ckpt, base + "/model.pt");
    std::string bytes = testing::read_file(base + "/model.pt");
    auto dict = torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
    EXPECT_EQ(dict.size(), 5u);
    for (const auto& [k, t] : expected) EXPECT_TRUE(at::equal(dict.at(k).toTensor(), t)) << k;
    EXPECT_EQ(dict.at("step").toInt(), 9);

    // safetensors, parsed here.
    dcp::export_safetensors(ckpt, base + "/model.safetensors");
    std::string st = testing::read_file(base + "/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | (unsigned char)st[size_t(i)];
    ASSERT_EQ((8 + n) % 8, 0u);
    auto header = nlohmann::json::parse(st.substr(8, n));
    const char* data = st.data() + 8 + n;
    std::map<std::string, std::string> st_dtype = {{"w", "F32"}, {"bf", "BF16"}, {"ids", "I64"}, {"mask", "BOOL"}};
    for (const auto& [k, t] : expected) {
      const auto& h = header.at(k);
      EXPECT_EQ(h.at("dtype"), st_dtype[k]);
      EXPECT_EQ(h.at("shape").get<std::vector<int64_t>>(), t.sizes().vec());
      auto off = h.at("data_offsets").get<std::vector<int64_t>>();
      ASSERT_EQ(off[1] - off[0], int64_t(t.nbytes())) << k;
      EXPECT_EQ(std::memcmp(data + off[0], t.data_ptr(), t.nbytes()), 0) << k;
    }
    EXPECT_EQ(header.at("__metadata__").at("format"), "pt");
    EXPECT_TRUE(header.at("__metadata__").contains("step"));
    EXPECT_EQ(st.size(), 8 + n + 140 + 12 + 40 + 4);  // the bytes of w, bf, ids, mask

    // The real readers, where installed (CI installs python3-torch; python3-safetensors only
    // exists in Debian 13).
    if (python_has("torch")) {
      std::ofstream(base + "/check.py")
          << "import sys, torch\n"
             // weights_only=False: libtorch 2.6's default (True) refuses the TorchScript
             // pickle's type tags (torch.jit._pickle.restore_type_tag) in the file.
             "d = torch.load(sys.argv[1], weights_only=False)\n"
             "assert torch.equal(d['w'], torch.arange(35, dtype=torch.float32).view(7, 5)), d['w']\n"
             "assert torch.equal(d['bf'], torch.arange(6, dtype=torch.bfloat16))\n"
             "assert torch.equal(d['ids'], torch.arange(5) * 3)\n"
             "assert d['mask'].tolist() == [False, True, False, True]\n"
             "assert d['step'] == 9\n"
             "print('torch.load OK')\n";
      auto r = testing::run_program("/usr/bin/python3", {base + "/check.py", base + "/model.pt"});
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_PRED2(contains, r.output, "torch.load OK");
    } else {
      std::cout << "python3 has no torch module (Debian: python3-torch): torch.load not checked\n";
    }
    if (python_has("safetensors.numpy")) {
      std::ofstream(base + "/check_st.py")
          // numpy has no bfloat16: read every tensor but 'bf' (safetensors.numpy.load_file
          // raises on it).
          << "import sys, numpy as np\n"
             "from safetensors import safe_open\n"
             "with safe_open(sys.argv[1], framework='np') as f:\n"
             "    d = {k: f.get_tensor(k) for k in f.keys() if k != 'bf'}\n"
             "assert (d['w'] == np.arange(35, dtype=np.float32).reshape(7, 5)).all()\n"
             "assert (d['ids'] == np.arange(5) * 3).all()\n"
             "assert d['mask'].tolist() == [False, True, False, True]\n"
             "print('safetensors OK')\n";
      auto r = testing::run_program("/usr/bin/python3", {base + "/check_st.py", base + "/model.safetensors"});
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_PRED2(contains, r.output, "safetensors OK");
    }

    // tools/dcp.
    auto ls = testing::run_program(DTENSOR_DCP_TOOL_PATH, {"list", ckpt});
    EXPECT_EQ(ls.exit_code, 0) << ls.output;
    EXPECT_PRED2(contains, ls.output, "format version 1, save 1, written by 4 ranks");
    EXPECT_PRED2(contains, ls.output, "w                                        tensor   float32    [7, 5]                   4          140");
    EXPECT_PRED2(contains, ls.output, "step                                     object");
    auto conv = testing::run_program(DTENSOR_DCP_TOOL_PATH, {"convert", ckpt, "--to", "torch", base + "/tool.pt"});
    EXPECT_EQ(conv.exit_code, 0) << conv.output;
    EXPECT_EQ(testing::read_file(base + "/tool.pt"), bytes);
    auto bad = testing::run_program(DTENSOR_DCP_TOOL_PATH, {"list", base + "/nothing"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_PRED2(contains, bad.output, "dcp: no checkpoint in '" + base + "/nothing'");
  }
  group().barrier();
}

}  // namespace
}  // namespace dtensor
