// PyTorch parity of tensor parallel, written as PyTorch's
// test/distributed/tensor/parallel/test_parallelize_api.py and test_tp_style.py are: fnmatch
// character classes in plan keys, the "" root key, unmatched keys as warnings,
// PrepareModuleInputOutput, keyword-argument layouts, src_data_rank, the current mesh.
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/child_process.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using testing::gathered;
using testing::set_parameters;
using testing::values;

class TpParity : public testing::DTensorOpTestBase {};

// test_parallelize_api.py test_parallelize_module_with_digit / _with_question / _with_star.
DTENSOR_TEST_F(TpParity, PlanKeysWithCharacterClasses) {
  models::MLPStacked m(c10::Device(c10::kCPU), 3);
  using V = std::vector<std::string>;
  EXPECT_EQ(match_module_paths(*m, "layers.[0-1].net[1]"), (V{"layers.0.net1", "layers.1.net1"}));
  EXPECT_EQ(match_module_paths(*m, "layers.[!0].net2"), (V{"layers.1.net2", "layers.2.net2"}));
  EXPECT_EQ(match_module_paths(*m, "layers.2.net[12]"), (V{"layers.2.net1", "layers.2.net2"}));
  EXPECT_EQ(match_module_paths(*m, "layers.[1-2].[nr]e*"),
            (V{"layers.1.net1", "layers.1.relu", "layers.1.net2", "layers.2.net1", "layers.2.relu", "layers.2.net2"}));
  EXPECT_TRUE(match_module_paths(*m, "layers.[").empty());  // an unclosed '[' is a character
  // The plan parallelizes exactly the matches, and the model computes what the plain one does.
  auto mesh = build_device_mesh();
  models::MLPStacked plain(c10::Device(c10::kCPU), 3);
  set_parameters(*m, 0);
  set_parameters(*plain, 0);
  parallelize_module(m, mesh, {{"layers.[0-1].net1", ColwiseParallel()}, {"layers.[0-1].net2", RowwiseParallel()}});
  for (const auto& kv : m->named_parameters())
    EXPECT_EQ(is_dtensor(kv.value()), kv.key().rfind("layers.2.", 0) != 0) << kv.key();
  const at::Tensor x = values({12, 10});
  EXPECT_TRUE(testing::tensors_close(nn::call(plain, x), gathered(nn::call(m, x))));
}

// forward(x) = x (to see what the hooks make of inputs and outputs).
struct EchoImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x) {
    seen = is_dtensor(x) ? to_string(get_spec(x).placements) : "plain " + c10::str(x.sizes());
    return x;
  }
  std::string seen;
};
TORCH_MODULE(Echo);

DTENSOR_TEST_F(TpParity, RootKeyAppliesToTheModuleItself) {
  auto mesh = build_device_mesh();
  Echo m;
  parallelize_module(m, mesh,
                     {{"", PrepareModuleInput().input_layouts({Shard{0}}).desired_input_layouts({Replicate{}})}});
  at::Tensor out = nn::call(m, at::ones({2, 3}));
  EXPECT_EQ(m->seen, "(Replicate(),)");
  EXPECT_EQ(out.sizes(), (c10::IntArrayRef{2 * ranks(), 3}));  // Shard(0) of [2, 3] pieces
}

DTENSOR_TEST_F(TpParity, UnmatchedPlanKeysWarnAndAreSkipped) {
  auto mesh = build_device_mesh();
  models::MLPStacked m(c10::Device(c10::kCPU), 2);
  parallelize_module(m, mesh, {{"net3", ColwiseParallel()}, {"layers.*.net1", ColwiseParallel()}});
  for (const auto& kv : m->named_parameters())
    EXPECT_EQ(is_dtensor(kv.value()), kv.key().find("net1") != std::string::npos) << kv.key();
}

// The warning as a user sees it (TORCH_WARN prints on stderr).
TEST(TpParityWarnings, UnmatchedPlanKeyWarning) {
  auto run = testing::run_self({"--gtest_filter=TpParity.UnmatchedPlanKeysWarnAndAreSkipped"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_PRED2(contains, run.output,
               "parallelize_module: the plan entry 'net3' (ColwiseParallel(input_layouts=Replicate(), "
               "output_layouts=Shard(dim=-1), use_local_output=true)) matches no submodule (no child of the root "
               "module matches 'net3' (children: layers)); skipping it");
}

// test_tp_style.py test_prepare_module_input_output.
DTENSOR_TEST_F(TpParity, PrepareModuleInputOutput) {
  auto mesh = build_device_mesh();
  Echo m;
  parallelize_module(m, mesh,
                     PrepareModuleInputOutput()
                         .input_layouts({Shard{0}})
                         .desired_input_layouts({Replicate{}})
                         .use_local_input(true)
                         .output_layouts({Replicate{}})
                         .desired_output_layouts({Shard{1}}));
  const at::Tensor full = values({2 * ranks(), 2 * ranks()});
  at::Tensor out = nn::call(m, full.chunk(ranks(), 0)[static_cast<size_t>(rank())]);
  EXPECT_EQ(m->seen, "plain " + c10::str(full.sizes()));  // use_local_input: the module sees the replicated tensor
  EXPECT_FALSE(is_dtensor(out));                           // use_local_output defaults to true
  EXPECT_TRUE(at::equal(out, full.chunk(ranks(), 1)[static_cast<size_t>(rank())]));
  EXPECT_PRED2(contains, PrepareModuleInputOutput().input_layouts({Shard{0}}).desired_input_layouts({Replicate{}})
                             .output_layouts({Replicate{}}).desired_output_layouts({Shard{1}}).to_string(),
               "PrepareModuleInputOutput(PrepareModuleInput(input_layouts=(Shard(dim=0),), desired_input_layouts="
               "(Replicate(),), use_local_output=false), PrepareModuleOutput(output_layouts=(Replicate(),), "
               "desired_output_layouts=(Shard(dim=1),), use_local_output=true))");
}

// A forward with keyword arguments: the C++ spelling is a c10::Dict<std::string, at::Tensor>.
struct KwargsImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x, c10::Dict<std::string, at::Tensor> kwargs) {
    const at::Tensor bias = kwargs.at("bias");
    seen = (is_dtensor(x) ? to_string(get_spec(x).placements) : "plain") + " " +
           (is_dtensor(bias) ? to_string(get_spec(bias).placements) : "plain") + " " +
           (is_dtensor(kwargs.at("other")) ? "dtensor" : "plain");
    return bias;
  }
  std::string seen;
};
TORCH_MODULE(Kwargs);

// test_tp_style.py test_prepare_module_kwargs_input.
DTENSOR_TEST_F(TpParity, PrepareModuleInputKeywordLayouts) {
  auto mesh = build_device_mesh();
  Kwargs m;
  parallelize_module(m, mesh,
                     PrepareModuleInput()
                         .input_kwarg_layouts({{"bias", Shard{0}}})
                         .desired_input_kwarg_layouts({{"bias", Replicate{}}}));
  c10::Dict<std::string, at::Tensor> kwargs;
  const at::Tensor bias = values({2 * ranks(), 2});
  kwargs.insert("bias", bias.chunk(ranks(), 0)[static_cast<size_t>(rank())]);
  kwargs.insert("other", at::ones({1}));
  at::Tensor out = nn::call(m, at::ones({2}), kwargs);
  EXPECT_EQ(m->seen, "plain (Replicate(),) plain");
  EXPECT_TRUE(at::equal(gathered(out), bias));
  // Positional and keyword layouts together.
  Kwargs both;
  parallelize_module(both, mesh,
                     PrepareModuleInput()
                         .input_layouts({Shard{0}, std::nullopt})
                         .desired_input_layouts({Replicate{}, std::nullopt})
                         .input_kwarg_layouts({{"bias", Replicate{}}}));
  nn::call(both, at::ones({2}), kwargs);
  EXPECT_EQ(both->seen, "(Replicate(),) (Replicate(),) plain");
  EXPECT_PRED2(contains,
               error_of([&] {
                 Kwargs bad;
                 parallelize_module(bad, mesh, PrepareModuleInput().desired_input_kwarg_layouts({{"bias", Shard{0}}}));
               }),
               "desired_input_kwarg_layouts names 'bias' but input_kwarg_layouts does not");
}

// test_parallelize_api.py test_parallelize_module_src_data_rank.
DTENSOR_TEST_F(TpParity, ParallelizeModuleSrcDataRank) {
  testing::CommCounter counting;
  auto mesh = init_device_mesh(device_type(), {ranks()}, {}, group_ptr());
  auto make = [&] {
    torch::nn::Linear lin(8, 8);
    at::NoGradGuard no_grad;
    lin->weight.fill_(rank());
    lin->bias.fill_(rank());
    return lin;
  };
  torch::nn::Linear from_one = make();
  parallelize_module(from_one, mesh, ColwiseParallel(), /*src_data_rank=*/1);
  EXPECT_TRUE(at::equal(full_tensor(from_one->weight), at::ones({8, 8})));
  EXPECT_TRUE(at::equal(full_tensor(from_one->bias), at::ones({8})));
  torch::nn::Linear own = make();
  counting.reset();
  parallelize_module(own, mesh, {{"", ColwiseParallel()}}, /*src_data_rank=*/std::nullopt);
  EXPECT_EQ(counting.collectives(), 0);
  const int64_t chunk = (8 + ranks() - 1) / ranks();  // torch.chunk's rows of 8
  const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(chunk, 8 - rank() * chunk));
  EXPECT_TRUE(at::equal(local_tensor(own->weight), at::full({rows, 8}, static_cast<float>(rank()))));
  // Default: rank 0.
  torch::nn::Linear from_zero = make();
  parallelize_module(from_zero, mesh, RowwiseParallel());
  EXPECT_TRUE(at::equal(full_tensor(from_zero->weight), at::zeros({8, 8})));
}

DTENSOR_TEST_F(TpParity, ParallelizeModuleOnTheCurrentMesh) {
  auto mesh = build_device_mesh();
  models::MLPModule m;
  {
    DeviceMeshGuard use(mesh);
    parallelize_module(m, {{"net1", ColwiseParallel()}, {"net2", RowwiseParallel()}});
  }
  EXPECT_EQ(get_spec(m->net1->weight).mesh, mesh);
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(*m, SequenceParallel()); }), "no current DeviceMesh");
}

}  // namespace
}  // namespace dtensor
