// Checkpoints that cross the language line, both ways. PyTorch's distributed checkpoint
// (torch.distributed.checkpoint, "DCP") and its Hugging Face safetensors (sharded by every rank
// and consolidated): PyTorch saves, dtensor-cpp loads, and the reverse. Checkpoints PyTorch wrote,
// read by dtensor-cpp's load: PyTorch saves (suites/checkpoint/dcp_interop.py: DTensors on a
// Gloo world of 4 processes, Shard / Replicate / plain tensors, objects, an FSDP2 model and its
// Adam state, and a 2-D FSDP2 x TP model whose weights are _StridedShard), and the ranks here
// load every entry into other placements, at this suite's world size and in one process, and
// compare each value with PyTorch's own (the script's expected.json). Also: the strict reader of
// DCP's pickled `.metadata` refuses any global outside DCP's metadata classes.
//
// PyTorch's Python: DTENSOR_TORCH_PYTHON (environment, else the CMake setting of that name;
// ci/test sets it to the wheel's environment, ci/torch-wheel). Without it the interop tests skip,
// saying so.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/comm.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/build_paths.h"
#include "suites/testing/checkpoint_errors.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"
#include "suites/testing/shared_dir.h"
#include "suites/testing/state_dict_checks.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adam.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

namespace dtensor {
namespace {

namespace paths = testing::build_paths;
namespace fs = std::filesystem;
using checkpoint::LoadOptions;
using checkpoint::StateDict;
using testing::contains;
using testing::expect_holds;
using testing::SharedDir;

DTENSOR_RANK_FIXTURES(DcpInteropGloo, DcpInteropThreads);

std::string torch_python() {
  if (const char* p = std::getenv("DTENSOR_TORCH_PYTHON")) return p;
  return DTENSOR_TORCH_PYTHON;
}

// PyTorch's checkpoint and its expected values, made once per build directory and script
// version (PyTorch's side takes seconds): "<cache>/<hash>/{ckpt, expected.json}". Returns the
// directory, or throws with the script's output.
std::string pytorch_checkpoint(const std::string& python) {
  std::ifstream in(paths::dcp_interop_script());
  std::stringstream script;
  script << in.rdbuf();
  std::ostringstream key;
  key << std::hex << std::hash<std::string>()(script.str() + "\n" + python);
  const fs::path dir = fs::path(paths::dcp_interop_cache()) / key.str();
  if (fs::exists(dir / "expected.json")) return dir.string();
  fs::create_directories(dir.parent_path());
  // Made under a private name, then renamed: a concurrent test program that made it first wins.
  const fs::path partial = dir.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(partial);
  auto run = testing::run_program(python, {paths::dcp_interop_script(), "save", partial.string(), "4"},
                                  {{"PYTHONWARNINGS", "ignore"}}, std::chrono::seconds(300));
  if (run.exit_code != 0) {
    fs::remove_all(partial);
    TORCH_CHECK(false, "PyTorch's side (", python, " ", paths::dcp_interop_script(), ") exited with ", run.exit_code,
                ":\n", run.output);
  }
  std::error_code ec;
  fs::rename(partial, dir, ec);
  if (ec) fs::remove_all(partial);
  TORCH_CHECK(fs::exists(dir / "expected.json"), "PyTorch's side wrote no ", (dir / "expected.json").string());
  return dir.string();
}

// Rank 0 makes (or finds) PyTorch's checkpoint; every rank gets its directory, or the same
// failure. Skips on every rank when PyTorch's Python is not configured.
#define PYTORCH_CHECKPOINT_OR_SKIP(dir)                                                                         \
  const std::string python_ = torch_python();                                                                  \
  if (python_.empty()) GTEST_SKIP() << "PyTorch's Python is not configured: set DTENSOR_TORCH_PYTHON (ci/test " \
                                       "sets it to ci/torch-wheel's environment)";                              \
  std::string dir;                                                                                              \
  {                                                                                                             \
    std::string made, error;                                                                                    \
    if (t.rank() == 0) {                                                                                        \
      try {                                                                                                     \
        made = pytorch_checkpoint(python_);                                                                     \
      } catch (const std::exception& e) {                                                                       \
        error = e.what();                                                                                       \
      }                                                                                                         \
    }                                                                                                           \
    auto all = comm::all_gather_object(t.group(), made + '\n' + error);                                        \
    const std::string& r0 = all[0];                                                                             \
    dir = r0.substr(0, r0.find('\n'));                                                                          \
    ASSERT_TRUE(!dir.empty()) << r0.substr(r0.find('\n') + 1);                                                  \
  }

nlohmann::json expected_values(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "expected.json");
  return nlohmann::json::parse(in);
}

at::Tensor full_tensor(const nlohmann::json& e) {
  const auto values = e.at("values").get<std::vector<double>>();
  const auto shape = e.at("shape").get<std::vector<int64_t>>();
  at::Tensor t = at::tensor(values, at::kDouble).view(shape);
  return t.to(checkpoint::dtype_from_name(e.at("dtype").get<std::string>()));
}

// An object as Python's json module wrote it (tuples as lists).
nlohmann::json as_json(const c10::IValue& v) {
  if (v.isNone()) return nullptr;
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isString()) return v.toStringRef();
  nlohmann::json out = nlohmann::json::array();
  if (v.isTuple()) {
    for (const auto& x : v.toTupleRef().elements()) out.push_back(as_json(x));
    return out;
  }
  if (v.isList()) {
    for (const auto& x : v.toListRef()) out.push_back(as_json(x));
    return out;
  }
  return "<" + v.tagKind() + ">";
}

// The destination of key number `i` (a tensor of `full`'s shape and dtype): placements that
// differ from PyTorch's, in turn.
checkpoint::StateDictValue destination(size_t i, const at::Tensor& full, const DeviceMesh& mesh1,
                                       const std::optional<DeviceMesh>& mesh2) {
  const int64_t dims = full.dim();
  const at::ScalarType dtype = full.scalar_type();
  if (dims == 0) return dtensor::zeros({}, mesh1, {Replicate{}}, dtype);
  switch (i % 4) {
    case 0: return dtensor::zeros(full.sizes(), mesh1, {Shard{0}}, dtype);
    case 1: return dtensor::zeros(full.sizes(), mesh1, {Shard{dims - 1}}, dtype);
    case 2: return dtensor::zeros(full.sizes(), mesh1, {Replicate{}}, dtype);
    default:
      if (mesh2) return dtensor::zeros(full.sizes(), *mesh2, {Shard{dims - 1}, Shard{0}}, dtype);
      return at::zeros_like(full);
  }
}

void expect_loaded(const StateDict& sd, const nlohmann::json& expected, const std::string& how) {
  for (const auto& [key, e] : expected.items()) {
    if (e.contains("values")) {
      expect_holds(sd.at(key), full_tensor(e), how + ": " + key);
    } else {
      EXPECT_EQ(as_json(std::get<c10::IValue>(sd.at(key))), e.at("object")) << how << ": " << key;
    }
  }
}

DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, LoadsPyTorchsCheckpointIntoOtherPlacementsAndWorldSizes) {
  PYTORCH_CHECKPOINT_OR_SKIP(dir);
  const nlohmann::json expected = expected_values(dir);
  const std::string ckpt = (fs::path(dir) / "ckpt").string();
  // Every kind the script saves (see dcp_interop.py): 62 entries, 33 from a PyTorch whose
  // FSDP2 does not run on the CPU (no 2-D model).
  ASSERT_GE(expected.size(), 33u);

  // At this world size, each key in placements other than PyTorch's.
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  std::optional<DeviceMesh> mesh2;
  if (t.ranks() % 2 == 0) mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  StateDict sd;
  size_t i = 0;
  for (const auto& [key, e] : expected.items()) {
    if (e.contains("values")) {
      sd[key] = destination(i++, full_tensor(e), mesh1, mesh2);
    } else {
      sd[key] = c10::IValue();
    }
  }
  auto result = checkpoint::load(sd, ckpt);
  EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
  expect_loaded(sd, expected, std::to_string(t.ranks()) + " ranks");

  // In one process, into plain tensors (None placeholders: allocated by load).
  if (t.rank() == 0) {
    StateDict one;
    for (const auto& [key, e] : expected.items()) one[key] = c10::IValue();
    LoadOptions o;
    o.no_dist = true;
    checkpoint::load(one, ckpt, o);
    expect_loaded(one, expected, "one process");
  }
  t.group().barrier();
}

DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, AWrongDestinationFailsEveryRankNamingTheKey) {
  PYTORCH_CHECKPOINT_OR_SKIP(dir);
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  StateDict sd{{"tp.w", dtensor::zeros({9, 5}, mesh, {Shard{0}})}};
  LoadOptions o;
  o.strict = false;
  auto e = testing::checkpoint_error_of([&] { checkpoint::load(sd, (fs::path(dir) / "ckpt").string(), o); });
  ASSERT_TRUE(e) << "a destination of the wrong shape loaded";
  EXPECT_PRED2(contains, e->what_without_backtrace(), "key 'tp.w' has shape [9, 5] in the state dict but [9, 6]");
}

// ---- dtensor-cpp saves, PyTorch loads --------------------------------------------------------

// Rank 0 runs PyTorch's side (`python` dcp_interop.py `args`); every rank gets "exit <code>"
// and its output.
std::string pytorch_side(testing::MultiRankTest& t, const std::string& python, const std::vector<std::string>& args) {
  std::string report;
  if (t.rank() == 0) {
    std::vector<std::string> argv{paths::dcp_interop_script()};
    argv.insert(argv.end(), args.begin(), args.end());
    auto run = testing::run_program(python, argv, {{"PYTHONWARNINGS", "ignore"}}, std::chrono::seconds(300));
    report = "exit " + std::to_string(run.exit_code) + "\n" + run.output;
  }
  return comm::all_gather_object(t.group(), report)[0];
}

// The full values of what the saving tests save: uneven, bfloat16, float64, int64, 0-dim.
std::map<std::string, at::Tensor> sample_tensors() {
  return {{"w", at::arange(54, at::kFloat).view({9, 6}) * 0.5},
          {"v", at::arange(40, at::kFloat).view({4, 10}).to(at::kBFloat16)},
          {"r", at::linspace(-1, 1, 5, at::kDouble)},
          {"p", at::arange(7, at::kLong) * 3},
          {"s", at::scalar_tensor(2.5)},
          {"m2", at::arange(48, at::kFloat).view({8, 6}) - 7}};
}

// Those as DTensors of 1-D and (with an even world) 2-D placements and plain tensors, and an
// object "step".
StateDict sample_state(testing::MultiRankTest& t, const DeviceMesh& mesh1, const std::map<std::string, at::Tensor>& full) {
  StateDict sd{{"w", distribute_tensor(full.at("w"), mesh1, {Shard{0}})},
               {"v", distribute_tensor(full.at("v"), mesh1, {Shard{1}})},
               {"r", distribute_tensor(full.at("r"), mesh1, {Replicate{}})},
               {"p", full.at("p")},
               {"s", full.at("s")},
               {"step", c10::IValue(int64_t(42))}};
  if (t.ranks() % 2 == 0) {
    sd["m2"] = distribute_tensor(full.at("m2"), init_device_mesh(t.device_type(), t.mesh_shape_2d()), {Shard{0}, Shard{1}});
  } else {
    sd["m2"] = distribute_tensor(full.at("m2"), mesh1, {Shard{1}});
  }
  return sd;
}

// {"dtype", "shape", "values"} of a full tensor, as the script's reference() writes it.
nlohmann::json reference_of(const at::Tensor& full) {
  at::Tensor d = full.to(at::kDouble).contiguous();
  return {{"dtype", checkpoint::dtype_name(full.scalar_type())},
          {"shape", full.sizes().vec()},
          {"values", std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel())}};
}

DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, SavesInPyTorchsFormatThatPyTorchLoadsAtAnotherWorldSize) {
  const std::string python = torch_python();
  SharedDir dir(t.group());
  const std::string ckpt = dir.sub("dcp");
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  const std::map<std::string, at::Tensor> full = sample_tensors();
  StateDict sd = sample_state(t, mesh1, full);
  sd["name"] = c10::IValue(std::string("dtensor-cpp"));
  sd["lr"] = c10::IValue(0.01);
  sd["betas"] = c10::ivalue::Tuple::create({c10::IValue(0.9), c10::IValue(0.999)});
  checkpoint::SaveOptions so;
  so.format = checkpoint::CheckpointFormat::kPyTorchDcp;
  checkpoint::save(sd, ckpt, so);

  // Our load reads it back, into other placements.
  StateDict back{{"w", dtensor::zeros({9, 6}, mesh1, {Shard{1}})},
                 {"v", dtensor::zeros({4, 10}, mesh1, {Shard{0}}, at::kBFloat16)},
                 {"r", dtensor::zeros({5}, mesh1, {Shard{0}}, at::kDouble)},
                 {"p", c10::IValue()},
                 {"s", c10::IValue()},
                 {"m2", dtensor::zeros({8, 6}, mesh1, {Replicate{}})},
                 {"step", c10::IValue()},
                 {"name", c10::IValue()},
                 {"lr", c10::IValue()},
                 {"betas", c10::IValue()}};
  checkpoint::load(back, ckpt);
  for (const auto& [key, f] : full) expect_holds(back.at(key), f, "ours: " + key);
  EXPECT_EQ(as_json(std::get<c10::IValue>(back.at("betas"))), nlohmann::json({0.9, 0.999}));

  // PyTorch's dcp.load reads it, on 3 Gloo processes, into its own placements.
  if (python.empty()) GTEST_SKIP() << "PyTorch's Python is not configured: set DTENSOR_TORCH_PYTHON (ci/test "
                                      "sets it to ci/torch-wheel's environment)";
  const std::string expected_path = dir.sub("expected.json");
  if (t.rank() == 0) {
    nlohmann::json expected;
    for (const auto& [key, f] : full) expected[key] = reference_of(f);
    expected["step"] = {{"object", 42}};
    expected["name"] = {{"object", "dtensor-cpp"}};
    expected["lr"] = {{"object", 0.01}};
    expected["betas"] = {{"object", {0.9, 0.999}}};
    std::ofstream(expected_path) << expected.dump();
  }
  const std::string report = pytorch_side(t, python, {"load", ckpt, expected_path, "3"});
  EXPECT_PRED2(contains, report, "exit 0\n");
  EXPECT_PRED2(contains, report, "checked " + std::to_string(sd.size()) + " entries");
  EXPECT_FALSE(contains(report, "MISMATCH")) << report;
}

// ---- tools/dcp ---------------------------------------------------------------------------------

// PyTorch's checkpoint -> ours -> PyTorch's again, with the tool; each read by our load, and the
// last by PyTorch's dcp.load on 2 processes: every value PyTorch saved comes back.
TEST(DcpTool, ConvertsPyTorchsCheckpointToOursAndBack) {
  const std::string python = torch_python();
  if (python.empty()) GTEST_SKIP() << "PyTorch's Python is not configured: set DTENSOR_TORCH_PYTHON";
  const std::string dir = pytorch_checkpoint(python);
  const nlohmann::json expected = expected_values(dir);
  const std::string ckpt = (fs::path(dir) / "ckpt").string();
  testing::TempDir tmp;
  const std::string ours = (fs::path(tmp.path()) / "ours").string();
  const std::string back = (fs::path(tmp.path()) / "back").string();
  auto tool = [](std::vector<std::string> args) {
    auto run = testing::run_program(paths::dcp_tool(), args);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return run.output;
  };
  EXPECT_PRED2(contains, tool({"list", ckpt}), "PyTorch DCP format");
  EXPECT_PRED2(contains, tool({"verify", ckpt}), "verified " + ckpt + ": " + std::to_string(expected.size()) + " keys read");
  tool({"convert", ckpt, "--to", "dtensor-cpp", ours});
  EXPECT_PRED2(contains, tool({"list", ours}), "dtensor-cpp format version 1");
  tool({"convert", ours, "--to", "pytorch-dcp", back});
  for (const auto& d : {ours, back}) {
    StateDict sd;
    for (const auto& [key, e] : expected.items()) sd[key] = c10::IValue();
    LoadOptions o;
    o.no_dist = true;
    checkpoint::load(sd, d, o);
    expect_loaded(sd, expected, d);
  }
  auto run = testing::run_program(python, {paths::dcp_interop_script(), "load", back,
                                           (fs::path(dir) / "expected.json").string(), "2"},
                                  {{"PYTHONWARNINGS", "ignore"}}, std::chrono::seconds(300));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_PRED2(contains, run.output, "checked " + std::to_string(expected.size()) + " entries");
}

// ---- the strict reader of `.metadata` ---------------------------------------------------------

// A `.metadata` holding `pickle` in a fresh directory; read_metadata's error.
std::string metadata_error(const std::string& pickle) {
  testing::TempDir dir;
  std::ofstream(fs::path(dir.path()) / ".metadata", std::ios::binary) << pickle;
  return testing::error_of([&] { checkpoint::read_metadata(dir.path()); });
}

TEST(DcpMetadata, AGlobalOutsideDcpsClassesIsRefusedNotCalled) {
  // os.system('touch <marker>') as pickle.dumps of an object whose __reduce__ returns it, with
  // STACK_GLOBAL (protocol 4) and with GLOBAL (protocols 0 to 3).
  testing::TempDir dir;
  const std::string marker = (fs::path(dir.path()) / "ran").string();
  const std::string cmd = "touch " + marker;
  const std::string arg = std::string(1, char(0x8c)) + char(cmd.size()) + cmd;
  const std::string stack_global = std::string("\x80\x04\x8c\x02os\x8c\x06system\x93", 15) + arg + "\x85R.";
  const std::string global = std::string("\x80\x02") + "cos\nsystem\n" + arg + "\x85R.";
  for (const auto& p : {stack_global, global}) {
    const std::string err = metadata_error(p);
    EXPECT_PRED2(contains, err, "names the global 'os.system', which this file never holds; it is refused");
    EXPECT_FALSE(fs::exists(marker)) << "the pickle ran";
  }
  // A global of torch that DCP's metadata does not use either.
  EXPECT_PRED2(contains, metadata_error(std::string("\x80\x02") + "ctorch\nload\n)R."), "the global 'torch.load'");
}

// storage_data is keyed by (key, chunk offsets): an object whose name looks like a tensor
// key and a chunk offset is its own entry.
TEST(DcpMetadata, AKeyNamedLikeAChunkIsItsOwnEntry) {
  const std::string python = torch_python();
  if (python.empty()) GTEST_SKIP() << "PyTorch's Python is not configured: set DTENSOR_TORCH_PYTHON";
  testing::TempDir dir;
  const std::string code =
      "import torch, torch.distributed.checkpoint as dcp, sys\n"
      "dcp.save({'a@[0]': 5, 'a': torch.arange(3.0)}, checkpoint_id=sys.argv[1])\n";
  auto run = testing::run_program(python, {"-c", code, dir.path()}, {{"PYTHONWARNINGS", "ignore"}});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  StateDict sd{{"a@[0]", c10::IValue()}, {"a", at::zeros({3})}};
  LoadOptions o;
  o.no_dist = true;
  checkpoint::load(sd, dir.path(), o);
  EXPECT_EQ(std::get<c10::IValue>(sd.at("a@[0]")).toInt(), 5);
  EXPECT_TRUE(at::equal(std::get<at::Tensor>(sd.at("a")), at::arange(3.0)));
}

TEST(DcpMetadata, MalformedPicklesAreErrorsNamingWhatIsWrong) {
  const std::string proto = "\x80\x04";
  // Truncated inside a string; a memo read before any store; an unknown opcode; no Metadata.
  EXPECT_PRED2(contains, metadata_error(proto + "\x8c\x10" + "abc"), "ends inside a string: 16 bytes needed, 3 left");
  EXPECT_PRED2(contains, metadata_error(proto + "h\x05."), "reads memo id 5, which was never stored");
  EXPECT_PRED2(contains, metadata_error(proto + "\xff"), "has opcode 0xff, which this reader does not take");
  EXPECT_PRED2(contains, metadata_error(proto + "K\x07."), "holds the int 7, not a Metadata");
  EXPECT_PRED2(contains, metadata_error(proto + "}"), "ends inside an opcode");
  // A string length of 2^64 - 1 (BINUNICODE8) is refused before anything is allocated.
  EXPECT_PRED2(contains, metadata_error(proto + "\x8d" + std::string(8, '\xff')),
               "ends inside a string: 18446744073709551615 bytes needed");
}

// ---- Hugging Face safetensors, both ways ----------------------------------------------------

// The entries PyTorch also saved as Hugging Face safetensors (its floating-point tensors: see
// dcp_interop.py).
nlohmann::json hf_expected(const nlohmann::json& expected) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, e] : expected.items()) {
    if (e.contains("values") && at::isFloatingType(checkpoint::dtype_from_name(e.at("dtype").get<std::string>()))) {
      out[key] = e;
    }
  }
  return out;
}

// The file index of each key of a consolidated checkpoint's index ("model-00002-of-00002...": 2).
std::map<std::string, int> file_indices(const std::string& index_path) {
  std::ifstream in(index_path);
  const nlohmann::json index = nlohmann::json::parse(in);
  std::map<std::string, int> out;
  for (const auto& [key, file] : index.at("weight_map").items()) {
    out[key] = std::stoi(file.get<std::string>().substr(6, 5));
  }
  return out;
}

// Whether `python`'s PyTorch has the Hugging Face storage writer and reader (Debian 13's 2.6
// has not) and the safetensors package.
bool has_hf_storage(const std::string& python) {
  static std::mutex mu;  // thread ranks ask at once
  static std::map<std::string, bool> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find(python);
  if (it != known.end()) return it->second;
  auto run = testing::run_program(
      python, {"-c", "import safetensors\nfrom torch.distributed.checkpoint import HuggingFaceStorageReader"});
  return known[python] = run.exit_code == 0;
}

DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, LoadsPyTorchsHuggingFaceShardsAndConsolidatedFiles) {
  PYTORCH_CHECKPOINT_OR_SKIP(dir);
  if (!fs::exists(fs::path(dir) / "hf")) GTEST_SKIP() << "this PyTorch (" << python_ << ") has no HuggingFaceStorageWriter";
  const nlohmann::json expected = hf_expected(expected_values(dir));
  ASSERT_GE(expected.size(), 30u);
  const fs::path hf = fs::path(dir) / "hf";
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  std::optional<DeviceMesh> mesh2;
  if (t.ranks() % 2 == 0) mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  auto destinations = [&] {
    StateDict sd;
    size_t i = 0;
    for (const auto& [key, e] : expected.items()) sd[key] = destination(i++, full_tensor(e), mesh1, mesh2);
    return sd;
  };
  // PyTorch's shards (every rank's chunks, placed by DCP_SHARDING_INFO).
  StateDict sd = destinations();
  auto result = checkpoint::load(sd, (hf / "sharded").string());
  EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
  expect_loaded(sd, expected, "PyTorch's shards");
  // PyTorch's consolidated files, through its directory and its index. Its consolidation
  // writes no bytes for 0-dim tensors (Adam's "step" reads 0 from them with safetensors' own
  // load_file too), so those are not compared.
  nlohmann::json with_dims = nlohmann::json::object();
  for (const auto& [key, e] : expected.items()) {
    if (!e.at("shape").empty()) with_dims[key] = e;
  }
  for (const std::string& src : {hf.string(), (hf / "model.safetensors.index.json").string()}) {
    StateDict full = destinations();
    checkpoint::load_safetensors(full, src);
    expect_loaded(full, with_dims, src);
  }

  // Our consolidation of PyTorch's shards, in parallel: the files and index PyTorch's
  // consolidation names, holding every value (0-dim tensors too).
  SharedDir out(t.group());
  const auto mapping = file_indices((hf / "model.safetensors.index.json").string());
  const auto written = checkpoint::consolidate_safetensors_files((hf / "sharded").string(), out.sub("full"), mapping);
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(fs::path(written[0]).filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(fs::path(written.back()).filename(), "model.safetensors.index.json");
  EXPECT_EQ(file_indices(written.back()), mapping);
  StateDict ours = destinations();
  checkpoint::load_safetensors(ours, written.back());
  expect_loaded(ours, expected, "our consolidation");
}

DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, SavesHuggingFaceShardsThatPyTorchLoadsAtAnotherWorldSize) {
  const std::string python = torch_python();
  SharedDir dir(t.group());
  const std::string ckpt = dir.sub("hf");
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  const std::map<std::string, at::Tensor> full = sample_tensors();
  const StateDict sd = sample_state(t, mesh1, full);
  checkpoint::SaveOptions so;
  so.format = checkpoint::CheckpointFormat::kHuggingFace;
  so.enable_consolidation = true;
  so.fqn_to_index_mapping = {{"w", 1}, {"v", 2}, {"r", 1}, {"p", 2}, {"s", 1}, {"m2", 2}};
  const checkpoint::Metadata m = checkpoint::save(sd, ckpt, so);
  EXPECT_EQ(m.files(), (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "sharded" / "shard-00001-model-00001-of-00002.safetensors"));
  EXPECT_EQ(file_indices((fs::path(ckpt) / "model.safetensors.index.json").string()), so.fqn_to_index_mapping);

  // Our load reads the consolidated files and the shards, into other placements.
  for (const std::string& src : {ckpt, (fs::path(ckpt) / "sharded").string()}) {
    StateDict back{{"w", dtensor::zeros({9, 6}, mesh1, {Shard{1}})},
                   {"v", dtensor::zeros({4, 10}, mesh1, {Shard{0}}, at::kBFloat16)},
                   {"r", dtensor::zeros({5}, mesh1, {Shard{0}}, at::kDouble)},
                   {"p", c10::IValue()},
                   {"s", c10::IValue()},
                   {"m2", dtensor::zeros({8, 6}, mesh1, {Replicate{}})},
                   {"step", c10::IValue()}};
    checkpoint::load(back, src);
    for (const auto& [key, f] : full) expect_holds(back.at(key), f, src + ": " + key);
    EXPECT_EQ(std::get<c10::IValue>(back.at("step")).toInt(), 42) << src;
  }

  // PyTorch reads the shards with dcp.load on 3 Gloo processes, and the consolidated files
  // with safetensors' load_file.
  if (python.empty()) GTEST_SKIP() << "PyTorch's Python is not configured: set DTENSOR_TORCH_PYTHON (ci/test "
                                      "sets it to ci/torch-wheel's environment)";
  if (!has_hf_storage(python)) GTEST_SKIP() << "this PyTorch (" << python << ") has no HuggingFaceStorageReader";
  const std::string expected_path = dir.sub("expected.json");
  if (t.rank() == 0) {
    nlohmann::json expected;
    for (const auto& [key, f] : full) expected[key] = reference_of(f);
    std::ofstream(expected_path) << expected.dump();
  }
  const std::string report = pytorch_side(t, python, {"load-hf", ckpt, expected_path, "3"});
  EXPECT_PRED2(contains, report, "exit 0\n");
  EXPECT_PRED2(contains, report, "checked " + std::to_string(full.size()) + " entries");
  EXPECT_FALSE(contains(report, "MISMATCH")) << report;
}

// Files of an earlier save that this one does not write are removed at its commit: a loader
// reads every shard in the directory, and prefers an index to the shards.
DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, AHuggingFaceSaveLeavesNoStaleFileALoadWouldRead) {
  SharedDir dir(t.group());
  const fs::path ckpt = dir.sub("hf");
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const at::Tensor w = at::arange(24, at::kFloat).view({8, 3});
  checkpoint::SaveOptions so;
  so.format = checkpoint::CheckpointFormat::kHuggingFace;
  auto load_w = [&] {
    StateDict back{{"w", dtensor::zeros({8, 3}, mesh, {Replicate{}})}};
    checkpoint::load(back, ckpt.string());
    expect_holds(back.at("w"), w, "w");
  };
  // A consolidated save of other values, then a sharded one into the same directory: the
  // consolidated files and their index go.
  so.enable_consolidation = true;
  checkpoint::save({{"w", distribute_tensor(w - 100, mesh, {Shard{0}})}}, ckpt.string(), so);
  so.enable_consolidation = false;
  checkpoint::save({{"w", distribute_tensor(w, mesh, {Shard{1}})}}, ckpt.string(), so);
  EXPECT_FALSE(fs::exists(ckpt / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(ckpt / "model-00001-of-00001.safetensors"));
  load_w();
  // A shard of a rank that no longer exists (an earlier save by more ranks), overlapping.
  const fs::path stale = ckpt / "shard-00099-model-00001-of-00001.safetensors";
  if (t.rank() == 0) fs::copy_file(ckpt / "shard-00001-model-00001-of-00001.safetensors", stale);
  t.group().barrier();
  checkpoint::save({{"w", distribute_tensor(w, mesh, {Shard{0}})}}, ckpt.string(), so);
  EXPECT_FALSE(fs::exists(stale));
  load_w();
}

DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, AHuggingFaceSaveOfWhatItCannotHoldFailsEveryRankNamingTheKey) {
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  auto error = [&](const StateDict& sd, const std::map<std::string, int>& mapping) {
    checkpoint::SaveOptions so;
    so.format = checkpoint::CheckpointFormat::kHuggingFace;
    so.fqn_to_index_mapping = mapping;
    auto e = testing::checkpoint_error_of([&] { checkpoint::save(sd, dir.sub("hf"), so); });
    return e ? std::string(e->what_without_backtrace()) : std::string("(saved)");
  };
  const at::Tensor a = distribute_tensor(at::ones({4, 2}), mesh, {Shard{0}});
  EXPECT_PRED2(contains, error({{"c", distribute_tensor(at::zeros({4, 2}, at::kComplexFloat), mesh, {Shard{0}})}}, {}),
               "key 'c' is complex64, which safetensors has no dtype for");
  EXPECT_PRED2(contains, error({{"a", a}, {"b", a}}, {{"a", 1}}),
               "key 'b' is not in fqn_to_index_mapping, which must give every tensor its file");
  EXPECT_PRED2(contains, error({{"a", a}}, {{"a", 0}}), "gives key 'a' file index 0: file indices count from 1");
  EXPECT_PRED2(contains, error({{"a", a}, {"format", c10::IValue(std::string("x"))}}, {}),
               "key 'format' cannot be saved in Hugging Face's format: safetensors headers use that name");
}

// A safetensors file of one float32 [2, 3] tensor "w" whose "__metadata__" holds
// DCP_SHARDING_INFO `info`.
void write_shard(const fs::path& path, const std::string& info) {
  const nlohmann::json header = {{"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
                                 {"__metadata__", {{"DCP_SHARDING_INFO", info}}}};
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((text.size() >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << text << std::string(24, '\0');
}

TEST(HuggingFaceFiles, ShardingInfoThatDoesNotPlaceTheChunksIsAnErrorNamingTheFile) {
  auto error = [](const std::vector<std::string>& infos) {
    testing::TempDir dir;
    for (size_t i = 0; i < infos.size(); ++i) {
      write_shard(fs::path(dir.path()) / ("shard-0000" + std::to_string(i + 1) + "-model-00001-of-00001.safetensors"),
                  infos[i]);
    }
    return testing::error_of([&] { checkpoint::read_metadata(dir.path()); });
  };
  EXPECT_PRED2(contains, error({R"({"w": {"saved_offsets": [0]}})"}),
               "shard-00001-model-00001-of-00001.safetensors': key 'w': saved_offsets [0] do not match its shape [2, 3]");
  EXPECT_PRED2(contains, error({R"({"w": {"saved_offsets": [-2, 0]}})"}), "has a negative offset");
  EXPECT_PRED2(contains, error({R"({"v": {"saved_offsets": [0, 0]}})"}), "DCP_SHARDING_INFO does not place key 'w'");
  EXPECT_PRED2(contains, error({"[0, 0"}), "has a malformed header");
  EXPECT_PRED2(contains, error({R"({"w": {"saved_offsets": [9223372036854775807, 0]}})"}), "overflow");
  // Two files holding the same chunk; chunks that leave a gap.
  EXPECT_PRED2(contains, error({R"({"w": {"saved_offsets": [0, 0]}})", R"({"w": {"saved_offsets": [1, 0]}})"}),
               "overlap");
  EXPECT_PRED2(contains, error({R"({"w": {"saved_offsets": [0, 0]}})", R"({"w": {"saved_offsets": [0, 4]}})"}),
               "the safetensors files in");
}

// ---- training state across the languages ------------------------------------------------------

namespace dcp = checkpoint;

// The batch and step of dcp_interop.py's train_step: Adam on the sum of the outputs.
void train_step(models::MLPModule& m, torch::optim::Optimizer& opt) {
  opt.zero_grad();
  testing::gathered(nn::call(m, at::arange(40, at::kFloat).view({4, 10}) / 40)).sum().backward();
  opt.step();
}

// models::MLPModule under tensor parallelism over `mesh` (colwise net1, rowwise net2).
models::MLPModule tp_mlp(const DeviceMesh& mesh) {
  models::MLPModule m(c10::Device(c10::kCPU));
  parallelize_module(m, mesh, {{"net1", ColwiseParallel()}, {"net2", RowwiseParallel()}});
  return m;
}

// The model's and optimizer's state dicts, prefixed "model." and "optim.", the optimizer's in
// PyTorch's layout.
StateDict training_state(models::MLPModule& m, torch::optim::Optimizer& opt) {
  dcp::StateDictOptions pytorch;
  pytorch.pytorch_layout = true;
  StateDict sd = dcp::with_prefix(dcp::get_model_state_dict(*m), "model.");
  sd.merge(dcp::with_prefix(dcp::get_optimizer_state_dict(*m, opt, pytorch), "optim."));
  return sd;
}

// PyTorch trained an FSDP2 MLP one Adam step on 4 processes and saved it (dcp_interop.py); the
// ranks here load its model and optimizer state into a tensor-parallel MLP and a libtorch Adam,
// take the second step, and get PyTorch's parameters after its own second step.
DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, ResumesPyTorchsFsdpTrainingWithItsParameters) {
  PYTORCH_CHECKPOINT_OR_SKIP(dir);
  std::ifstream in(fs::path(dir) / "after.json");
  const nlohmann::json after = nlohmann::json::parse(in);
  ASSERT_EQ(after.size(), 4u);
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  models::MLPModule m = tp_mlp(mesh);
  torch::optim::Adam opt(nn::parameters(*m), torch::optim::AdamOptions(0.5));  // PyTorch's 0.01 is loaded
  StateDict sd = training_state(m, opt);
  LoadOptions lo;
  lo.strict = false;  // the checkpoint holds more than this model
  auto r = dcp::load(sd, (fs::path(dir) / "ckpt").string(), lo);
  for (const auto& k : r.missing_keys) {
    // Options of PyTorch's optimizers that an older PyTorch did not have yet.
    EXPECT_EQ(k, "optim.param_groups.0.decoupled_weight_decay") << "missing from PyTorch's checkpoint";
  }
  dcp::set_model_state_dict(*m, dcp::strip_prefix(sd, "model."));
  dcp::StateDictOptions pytorch;
  pytorch.pytorch_layout = true;
  dcp::set_optimizer_state_dict(*m, opt, dcp::strip_prefix(sd, "optim."), pytorch);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options()).lr(), 0.01);
  train_step(m, opt);
  for (const auto& [name, p] : nn::named_parameters(*m)) {
    const at::Tensor want = full_tensor(after.at("model." + name));
    EXPECT_TRUE(at::allclose(testing::gathered(p), want, 1e-5, 1e-6))
        << name << ": " << testing::gathered(p) << " vs PyTorch's " << want;
  }
}

// The other way: the ranks train the tensor-parallel MLP one step, save model and optimizer in
// PyTorch's format and layout, and take a second step; PyTorch loads the checkpoint into its
// FSDP2 MLP and Adam on 3 processes, takes its second step, and gets the same parameters.
DTENSOR_TEST_BOTH(DcpInteropGloo, DcpInteropThreads, SavesTrainingStateThatPyTorchResumesAtAnotherWorldSize) {
  const std::string python = torch_python();
  if (python.empty()) GTEST_SKIP() << "PyTorch's Python is not configured: set DTENSOR_TORCH_PYTHON (ci/test "
                                      "sets it to ci/torch-wheel's environment)";
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  models::MLPModule m = tp_mlp(mesh);
  torch::optim::Adam opt(nn::parameters(*m), torch::optim::AdamOptions(0.01));
  train_step(m, opt);
  dcp::SaveOptions so;
  so.format = dcp::CheckpointFormat::kPyTorchDcp;
  dcp::save(training_state(m, opt), dir.sub("ckpt"), so);
  train_step(m, opt);
  nlohmann::json after;
  for (const auto& [name, p] : nn::named_parameters(*m)) after["model." + name] = reference_of(testing::gathered(p));
  if (t.rank() == 0) std::ofstream(dir.sub("after.json")) << after.dump();
  const std::string report = pytorch_side(t, python, {"resume", dir.sub("ckpt"), dir.sub("after.json"), "3"});
  EXPECT_PRED2(contains, report, "exit 0\n");
  EXPECT_PRED2(contains, report, "resumed 4 parameters");
  EXPECT_FALSE(contains(report, "MISMATCH")) << report;
}

// A group PyTorch's optimizer ran with an update libtorch's does not make is refused, naming it.
TEST(PyTorchOptimizerLayout, AGroupWithAnUpdateLibtorchDoesNotMakeIsRefused) {
  models::MLPModule m(c10::Device(c10::kCPU));
  torch::optim::Adam opt(nn::parameters(*m), torch::optim::AdamOptions(0.01));
  dcp::StateDictOptions pytorch;
  pytorch.pytorch_layout = true;
  StateDict sd = dcp::get_optimizer_state_dict(*m, opt, pytorch);
  ASSERT_TRUE(sd.count("param_groups.0.params"));
  EXPECT_EQ(std::get<c10::IValue>(sd.at("param_groups.0.params")).toListRef().size(), 4u);
  EXPECT_TRUE(std::get<c10::IValue>(sd.at("param_groups.0.betas")).isTuple());
  EXPECT_EQ(std::get<at::Tensor>(sd.at("state.net1.weight.step")).dim(), 0);
  auto with = [&](const std::string& key, c10::IValue v) {
    StateDict copy = sd;
    copy[key] = std::move(v);
    return testing::error_of([&] { dcp::set_optimizer_state_dict(*m, opt, copy, pytorch); });
  };
  EXPECT_PRED2(contains, with("param_groups.0.maximize", true),
               "group 0 of PyTorch's optimizer state dict has maximize=True, which libtorch's optimizers do not do");
  EXPECT_PRED2(contains, with("param_groups.0.decoupled_weight_decay", true),
               "has decoupled_weight_decay=True (AdamW's update), this optimizer is Adam");
  EXPECT_PRED2(contains, with("param_groups.0.params", c10::IValue(int64_t(3))), "has no 'params' list");
  // Unchanged, it sets what it got: the options, and the step count from the float tensor.
  sd["param_groups.0.lr"] = 0.25;
  sd["state.net2.bias.step"] = at::scalar_tensor(7.0);
  dcp::set_optimizer_state_dict(*m, opt, sd, pytorch);
  EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options()).lr(), 0.25);
  StateDict ours = dcp::get_optimizer_state_dict(*m, opt);
  EXPECT_EQ(std::get<c10::IValue>(ours.at("state.net2.bias.step")).toInt(), 7);
}

}  // namespace
}  // namespace dtensor
