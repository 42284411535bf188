// suites/ops/ops_test.cpp: the op suite (every sample of every op of the database, on a 1-D
// mesh of all ranks and on a 2x2 mesh, forward and backward, against the checked-in expected
// failures) and the tests of the machinery it stands on: the op-check driver, the sample
// database, the expected-failures file, and the replicate fallback.
//
// The family tests are registered at start-up, one per (family, mesh): Ops.Pointwise1D,
// Ops.Pointwise2D, ... With DTENSOR_OPS_RESULTS_DIR set, each writes its records to
// <dir>/<family>_<mesh>.json for tools/opcov.
#include "converters/op_check.h"
#include "converters/op_db.h"
#include "converters/op_suite.h"
#include "dtensor/comm/thread_group.h"
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "harness/dtensor_test_base.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>
#include <c10/util/StringUtil.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

namespace dtensor {
namespace {

using testing::CheckStatus;
using testing::contains;
using testing::error_of;

// ---- warnings ------------------------------------------------------------------------------

// libtorch's warnings belong in the case records, never on the terminal (NOTE: [Warnings go
// into the records] in op_check.cpp), on every rank thread: the handler is per thread, and
// one installed on a single thread left the other ranks printing. A warning given once per
// process (like _aminmax's deprecation) reaches one rank only: every rank's records get it.
TEST(OpSuiteWarnings, GoIntoEveryRanksCaseRecordsAndNeverToStderr) {
  constexpr int kRanks = 4;
  auto world = comm::ThreadWorld::create(kRanks, std::chrono::seconds(60));
  std::once_flag once;
  testing::OpInfo info;
  info.op = "aten::neg";
  info.family = "test";
  info.samples = [&once](testing::SampleGen& g) {
    std::call_once(once, [] { TORCH_WARN("test sample: given once per process"); });
    return std::vector<testing::OpSample>{testing::OpSample("plain", {g.tensor({8, 4})})};
  };
  const testing::BoxedOp warns_every_call = [](std::vector<c10::IValue> a) {
    TORCH_WARN("test op: given on every call");
    return std::vector<c10::IValue>{a[0].toTensor() * 2};
  };
  std::vector<std::vector<testing::CaseRecord>> records(kRanks);
  std::vector<testing::OpCheckResult> checked(kRanks);
  std::vector<std::string> errors(kRanks);
  ::testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto group = std::make_shared<comm::ThreadGroup>(world, r);
        auto mesh = testing::suite_mesh("1d", group);
        records[r] = testing::run_op_suite(*mesh, "1d", {&info}, testing::suite_options("1d"), {});
        checked[r] = testing::check_op(*mesh, "warns", warns_every_call, -1, {at::ones({8, 4})}, {});
      } catch (const std::exception& e) {
        errors[r] = e.what();
        world->abort("rank " + std::to_string(r) + " failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("Warning"), std::string::npos) << err;
  EXPECT_EQ(err.find("test "), std::string::npos) << err;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(records[r].size(), 2u) << "rank " << r;
    for (const auto& rec : records[r]) {
      EXPECT_EQ(rec.warnings, std::vector<std::string>{"test sample: given once per process"})
          << "rank " << r << " " << rec.direction;
    }
    EXPECT_EQ(checked[r].forward.status, CheckStatus::kPass) << checked[r].forward.reason;
    EXPECT_EQ(checked[r].warnings, std::vector<std::string>{"test op: given on every call"}) << "rank " << r;
  }
}

// ---- the driver -----------------------------------------------------------------------------

class OpCheck : public testing::DTensorOpTestBase {};

testing::OpCheckOptions partial_and_uneven() {
  testing::OpCheckOptions o;
  o.converter.partial = true;
  o.converter.uneven = true;
  return o;
}

DTENSOR_TEST_F(OpCheck, PassesACorrectOpAndCountsCombinations) {
  auto mesh = build_device_mesh();
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mul", "Tensor");
  auto r = testing::check_op(mesh, op, {at::ones({8, 4}), at::full({8, 4}, 2.0)}, partial_and_uneven());
  EXPECT_EQ(r.forward.status, CheckStatus::kPass) << r.forward.reason;
  // Replicate, Shard(0), Shard(1), Partial for each of the two tensors.
  EXPECT_EQ(r.total_combinations, 16);
  EXPECT_EQ(r.forward.combinations, 16);
  EXPECT_EQ(r.forward.passed, 16);
  EXPECT_EQ(r.backward.status, CheckStatus::kSkip);  // not requested
}

// An "op" that is wrong on DTensors only: every sharded combination must be caught.
DTENSOR_TEST_F(OpCheck, CatchesWrongValues) {
  auto mesh = build_device_mesh();
  auto r = testing::check_op(
      mesh, "wrong_on_dtensors",
      [](std::vector<c10::IValue> a) {
        at::Tensor x = a[0].toTensor();
        return std::vector<c10::IValue>{is_dtensor(x) ? x * 3 : x * 2};
      },
      -1, {at::arange(32, at::kFloat).view({8, 4})}, {});
  EXPECT_EQ(r.forward.status, CheckStatus::kFail);
  EXPECT_EQ(r.forward.passed, 0);
  EXPECT_PRED2(contains, r.forward.reason, "values differ: max abs diff 31");
  EXPECT_DOUBLE_EQ(r.forward.max_error, 31);
  ASSERT_FALSE(r.forward.failures.empty());
  EXPECT_EQ(r.forward.failures[0].placements, "arg0=Replicate()");
}

DTENSOR_TEST_F(OpCheck, CatchesWrongGradients) {
  auto mesh = build_device_mesh();
  testing::OpCheckOptions o;
  o.backward = true;
  // Same values either way; on DTensors the gradient is 3 instead of 2.
  auto r = testing::check_op(
      mesh, "wrong_grad",
      [](std::vector<c10::IValue> a) {
        at::Tensor x = a[0].toTensor();
        at::Tensor y = is_dtensor(x) ? x.detach() * 2 + (x - x.detach()) * 3 : x * 2;
        return std::vector<c10::IValue>{y};
      },
      -1, {at::ones({8, 4})}, o);
  EXPECT_EQ(r.forward.status, CheckStatus::kPass) << r.forward.reason;
  EXPECT_EQ(r.backward.status, CheckStatus::kFail);
  EXPECT_PRED2(contains, r.backward.reason, "gradient of input 0: values differ");
}

DTENSOR_TEST_F(OpCheck, ChecksGradientsOfACorrectOp) {
  auto mesh = build_device_mesh();
  auto o = partial_and_uneven();
  o.backward = true;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  auto r = testing::check_op(mesh, op, {at::arange(32, at::kFloat).view({8, 4}) / 7, at::arange(24, at::kFloat).view({4, 6}) / 5}, o);
  EXPECT_EQ(r.forward.status, CheckStatus::kPass) << r.forward.reason;
  EXPECT_EQ(r.backward.status, CheckStatus::kPass) << r.backward.reason;
  EXPECT_EQ(r.backward.combinations, r.forward.combinations);
}

// Each thread draws different values; the driver uses the first rank's everywhere, so the
// ranks agree instead of taking different paths (and hanging).
DTENSOR_TEST_F(OpCheck, UnseededRandomArgumentsAreMadeTheSameOnEveryRank) {
  auto mesh = build_device_mesh();
  auto o = partial_and_uneven();
  o.backward = true;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  auto r = testing::check_op(mesh, op, {at::randn({8, 4}), at::randn({4, 6})}, o);
  EXPECT_EQ(r.forward.status, CheckStatus::kPass) << r.forward.reason;
  EXPECT_EQ(r.backward.status, CheckStatus::kPass) << r.backward.reason;
}

DTENSOR_TEST_F(OpCheck, OpWithoutRuleIsAnErrorUnlessTheFallbackIsOn) {
  auto mesh = build_device_mesh();
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::glu", "");
  const std::vector<c10::IValue> args = {at::arange(32, at::kFloat).view({8, 4}), int64_t{0}};
  auto r = testing::check_op(mesh, op, args, {});
  EXPECT_EQ(r.forward.status, CheckStatus::kError);
  EXPECT_PRED2(contains, r.forward.reason, "operator aten::glu has no sharding rule");
  EXPECT_FALSE(r.used_fallback);
  testing::OpCheckOptions o;
  o.replicate_fallback = true;
  auto f = testing::check_op(mesh, op, args, o);
  EXPECT_EQ(f.forward.status, CheckStatus::kPass) << f.forward.reason;
  EXPECT_TRUE(f.used_fallback);
}

DTENSOR_TEST_F(OpCheck, InvalidSampleIsASkipWithTheReason) {
  auto mesh = build_device_mesh();
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  auto r = testing::check_op(mesh, op, {at::randn({8, 4}), at::randn({8, 4})}, {});
  EXPECT_EQ(r.forward.status, CheckStatus::kSkip);
  EXPECT_PRED2(contains, r.forward.reason, "invalid sample: the op throws on plain tensors");
  EXPECT_EQ(r.forward.combinations, 0);
}

DTENSOR_TEST_F(OpCheck, CapCoversEveryPairOfPlacementsAndStartsWithReplicate) {
  auto mesh = build_device_mesh();
  auto o = partial_and_uneven();
  o.converter.max_combinations = 5;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  auto r = testing::check_op(mesh, op, {at::ones({8, 4}), at::ones({8, 4}), 1}, o);
  EXPECT_EQ(r.total_combinations, 16);
  // Two operands of 4 placements: every pair is the whole product, whatever the cap.
  EXPECT_EQ(r.forward.combinations, 16);
  ASSERT_FALSE(r.plan.empty());
  EXPECT_EQ(r.plan.front(), 0);
  EXPECT_PRED2(contains, r.design, "pairwise covering (16)");
  EXPECT_EQ(r.forward.status, CheckStatus::kPass) << r.forward.reason;
}

// NOTE: [Trivial cases]: an empty output, an all-NaN output, or (when asked) an input handed
// back unchanged pass without testing anything, and say so.
DTENSOR_TEST_F(OpCheck, FlagsCasesThatTestNothing) {
  auto mesh = build_device_mesh();
  auto tile = c10::Dispatcher::singleton().findSchemaOrThrow("aten::tile", "");
  auto empty = testing::check_op(mesh, tile, {at::ones({8, 4}), std::vector<int64_t>{1, 0}}, {});
  EXPECT_EQ(empty.forward.status, CheckStatus::kPass) << empty.forward.reason;
  EXPECT_EQ(empty.forward.trivial, "every output is empty");
  auto acos = c10::Dispatcher::singleton().findSchemaOrThrow("aten::acos", "");
  auto nan = testing::check_op(mesh, acos, {at::full({8, 4}, 3.0)}, {});
  EXPECT_EQ(nan.forward.trivial, "every output is NaN");
  auto relu = c10::Dispatcher::singleton().findSchemaOrThrow("aten::relu", "");
  testing::OpCheckOptions o;
  o.identity_is_trivial = true;
  auto same = testing::check_op(mesh, relu, {at::ones({8, 4})}, o);
  EXPECT_EQ(same.forward.trivial, "every output equals an input unchanged");
  auto works = testing::check_op(mesh, relu, {at::arange(32, at::kFloat).view({8, 4}) - 16}, o);
  EXPECT_EQ(works.forward.trivial, "");
}

// NOTE: [Output specs agree]: a DTensor output whose local shard does not have the shape its
// spec implies is caught even when the gathered values would look right.
DTENSOR_TEST_F(OpCheck, ChecksTheLocalShapeAgainstTheOutputSpec) {
  auto mesh = build_device_mesh();
  auto r = testing::check_op(
      mesh, "lies_about_its_spec",
      [&](std::vector<c10::IValue> a) {
        at::Tensor x = a[0].toTensor();
        if (!is_dtensor(x)) return std::vector<c10::IValue>{x * 2};
        // The whole tensor on every rank, labelled Shard(0) of an [8, 4] tensor.
        at::Tensor whole = full_tensor(x).detach() * 2;
        TensorMeta meta{{8, 4}, {4, 1}, at::kFloat, 0};
        return std::vector<c10::IValue>{make_dtensor(whole, DTensorSpec(mesh, {Shard{0}}, meta))};
      },
      -1, {at::arange(32, at::kFloat).view({8, 4})}, {});
  EXPECT_EQ(r.forward.status, CheckStatus::kFail);
  const std::string implied = "[" + std::to_string(8 / ranks()) + ", 4]";  // Shard(0) of 8 rows
  EXPECT_PRED2(contains, r.forward.reason, "local shape [8, 4] is not the " + implied + " its spec implies");
}

// A backward whose forward failed somewhere is not a verified backward.
DTENSOR_TEST_F(OpCheck, BackwardIsNotAPassWhenTheForwardFailed) {
  auto mesh = build_device_mesh();
  testing::OpCheckOptions o;
  o.backward = true;
  auto r = testing::check_op(
      mesh, "wrong_when_sharded",
      [](std::vector<c10::IValue> a) {
        at::Tensor x = a[0].toTensor();
        if (is_dtensor(x) && !get_spec(x).is_replicated()) return std::vector<c10::IValue>{x * 3};
        return std::vector<c10::IValue>{x * 2};
      },
      -1, {at::ones({8, 4})}, o);
  EXPECT_EQ(r.forward.status, CheckStatus::kFail);
  EXPECT_EQ(r.backward.status, CheckStatus::kFail);
  EXPECT_PRED2(contains, r.backward.reason, "not checked on every placement: the forward failed");
}

// NOTE: [Seeded random samples]: with a seed, a random op matches on every placement; without
// one the plain and DTensor calls start from different generator states, which is caught.
DTENSOR_TEST_F(OpCheck, SeedsTheGeneratorsOfRandomOps) {
  auto mesh = build_device_mesh();
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::bernoulli", "p");
  const std::vector<c10::IValue> args = {at::ones({8, 4}), 0.5, c10::IValue()};  // draws from the default / tracker
  auto o = partial_and_uneven();
  auto unseeded = testing::check_op(mesh, op, args, o);
  EXPECT_EQ(unseeded.forward.status, CheckStatus::kFail);
  EXPECT_PRED2(contains, unseeded.forward.reason, "values differ");
  o.rng_seed = 99;
  auto seeded = testing::check_op(mesh, op, args, o);
  EXPECT_EQ(seeded.forward.status, CheckStatus::kPass) << seeded.forward.reason;
  EXPECT_EQ(seeded.forward.passed, 4);  // Replicate, Shard(0), Shard(1), Partial
}

DTENSOR_TEST_F(OpCheck, ReseedsAGeneratorArgumentBeforeEveryCall) {
  auto mesh = build_device_mesh();
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::normal", "Tensor_float");
  // This rank's own generator: the plain call would leave it advanced for the DTensor calls.
  const std::vector<c10::IValue> args = {at::zeros({5, 6}), 1.0, at::detail::createCPUGenerator(0)};
  auto o = partial_and_uneven();
  auto unseeded = testing::check_op(mesh, op, args, o);
  EXPECT_EQ(unseeded.forward.status, CheckStatus::kFail);
  o.rng_seed = 3;
  auto seeded = testing::check_op(mesh, op, args, o);
  EXPECT_EQ(seeded.forward.status, CheckStatus::kPass) << seeded.forward.reason;
  EXPECT_EQ(seeded.forward.passed, seeded.forward.combinations);
}

// ---- the replicate fallback ------------------------------------------------------------------

class ReplicateFallback : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(ReplicateFallback, RunsAnOpWithoutRuleOnReplicatedInputsAndCountsIt) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  EXPECT_PRED2(contains, error_of([&] { (void)at::glu(x, 0); }), "aten::glu has no sharding rule");
  const int64_t before = ops::replicate_fallback_uses();
  at::Tensor y;
  {
    ops::ReplicateFallbackGuard guard;
    y = at::glu(x, 0);
  }
  EXPECT_EQ(ops::replicate_fallback_uses(), before + 1);
  EXPECT_TRUE(get_spec(y).is_replicated());
  EXPECT_TRUE(at::equal(full_tensor(y), at::glu(g, 0)));
  // Off again outside the guard (the cached strategy does not leak out of it).
  EXPECT_PRED2(contains, error_of([&] { (void)at::glu(x, 0); }), "has no sharding rule");
}

DTENSOR_TEST_F(ReplicateFallback, RefusesToWriteIntoAShardedTensor) {
  auto mesh = build_device_mesh();
  at::Tensor x = distribute_tensor(at::ones({8, 4}), mesh, {Shard{0}});
  ops::ReplicateFallbackGuard guard;
  EXPECT_PRED2(contains, error_of([&] { x.renorm_(2, 0, 1.0); }),
               "the replicate fallback cannot write into a DTensor with placements (Shard(dim=0),)");
}

// ---- reduction and scan rules: the placements they choose ----------------------------------------
// (The op suite checks values; these check that the cheap strategies are the ones taken.)

class ReductionRules : public testing::DTensorOpTestBase {};

std::string placements_of(const at::Tensor& t) { return to_string(get_spec(t).placements); }

DTENSOR_TEST_F(ReductionRules, ReducingAShardedDimGivesThePartialOfTheReduction) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4}) / 7 - 2;
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  struct Case {
    const char* name;
    at::Tensor dt, plain;
    const char* placements;
  };
  const Case cases[] = {
      {"sum", at::sum(x, {0}), at::sum(g, {0}), "(Partial(sum),)"},
      // A mean of uneven shards (8 rows on 3 ranks) is not the mean of the means: gathered.
      {"mean", at::mean(x, {0}), at::mean(g, {0}), 8 % mesh.size() == 0 ? "(Partial(avg),)" : "(Replicate(),)"},
      {"amax", at::amax(x, {0}), at::amax(g, {0}), "(Partial(max),)"},
      {"amin", at::amin(x, {0}, true), at::amin(g, {0}, true), "(Partial(min),)"},
      {"max", at::max(x), at::max(g), "(Partial(max),)"},
      {"norm_1", at::linalg_vector_norm(x, 1, at::IntArrayRef{0}), at::linalg_vector_norm(g, 1, at::IntArrayRef{0}),
       "(Partial(sum),)"},
      {"norm_inf", at::linalg_vector_norm(x, INFINITY), at::linalg_vector_norm(g, INFINITY), "(Partial(max),)"},
      // Not expressible as a reduction of per-shard results: the reduced dim is gathered.
      {"norm_2", at::linalg_vector_norm(x, 2, at::IntArrayRef{0}), at::linalg_vector_norm(g, 2, at::IntArrayRef{0}),
       "(Replicate(),)"},
      {"prod", at::prod(x, 0), at::prod(g, 0), "(Replicate(),)"},
      {"logsumexp", at::logsumexp(x, {0}), at::logsumexp(g, {0}), "(Replicate(),)"},
      // A dim that is not reduced keeps its shards (renumbered without keepdim).
      {"sum_other_dim", at::sum(x, {1}), at::sum(g, {1}), "(Shard(dim=0),)"},
      {"var_other_dim", at::var(x, {1}), at::var(g, {1}), "(Shard(dim=0),)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(placements_of(c.dt), c.placements);
    EXPECT_TRUE(at::allclose(full_tensor(c.dt), c.plain, 1e-5, 1e-6));
  }
}

DTENSOR_TEST_F(ReductionRules, UnevenShardsCombineOnlyWhereTheReductionAllows) {
  DTENSOR_REQUIRE_WORLD_SIZE_AT_LEAST(2);
  auto mesh = build_device_mesh();
  // x5: uneven with an empty last shard (4 ranks: 5 rows, 2, 2, 1, 0; 2 ranks: 1 row, 1, 0).
  // x7: uneven, no shard empty (2n - 1 rows: 4 ranks, 2, 2, 2, 1).
  const int64_t n = ranks(), rows5 = n == 2 ? 1 : n + 1, rows7 = 2 * n - 1;
  at::Tensor g5 = at::arange(rows5 * 6, at::kDouble).view({rows5, 6});
  at::Tensor g7 = at::arange(rows7 * 4, at::kDouble).view({rows7, 4});
  at::Tensor x5 = distribute_tensor(g5, mesh, {Shard{0}}), x7 = distribute_tensor(g7, mesh, {Shard{0}});
  EXPECT_EQ(placements_of(at::sum(x5, {0})), "(Partial(sum),)");
  // The mean of uneven shards' means is not the mean; the max of an empty shard has no value.
  EXPECT_EQ(placements_of(at::mean(x5, {0})), "(Replicate(),)");
  EXPECT_EQ(placements_of(at::amax(x5, {0})), "(Replicate(),)");
  EXPECT_EQ(placements_of(at::amax(x7, {0})), "(Partial(max),)");
  EXPECT_TRUE(at::equal(full_tensor(at::mean(x5, {0})), at::mean(g5, {0})));
  EXPECT_TRUE(at::equal(full_tensor(at::amax(x7, {0})), at::amax(g7, {0})));
}

DTENSOR_TEST_F(ReductionRules, IndicesAndNonLinearReductionsReplicateOnlyTheReducedDim) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4}).remainder(5);
  at::Tensor rows = distribute_tensor(g, mesh, {Shard{0}});
  auto [values, indices] = at::max(rows, 1);
  EXPECT_EQ(placements_of(values), "(Shard(dim=0),)");
  EXPECT_EQ(placements_of(indices), "(Shard(dim=0),)");
  // Indices are positions in the whole dim: a sharded reduced dim is gathered first.
  auto [values0, indices0] = at::max(rows, 0);
  EXPECT_EQ(placements_of(indices0), "(Replicate(),)");
  EXPECT_TRUE(at::equal(full_tensor(indices0), std::get<1>(at::max(g, 0))));
  EXPECT_EQ(placements_of(at::argmin(rows)), "(Replicate(),)");
  EXPECT_EQ(at::argmin(rows).item<int64_t>(), at::argmin(g).item<int64_t>());
  EXPECT_EQ(placements_of(at::all(rows, 1)), "(Shard(dim=0),)");
  EXPECT_EQ(placements_of(at::any(rows, 0)), "(Replicate(),)");
}

DTENSOR_TEST_F(ReductionRules, PartialInputsStayPartialOnlyThroughMatchingReductions) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor sum_partial = from_local(g / mesh.size(), mesh, {Partial{}});
  EXPECT_EQ(placements_of(at::sum(sum_partial, {1})), "(Partial(sum),)");
  EXPECT_EQ(placements_of(at::mean(sum_partial)), "(Partial(sum),)");
  EXPECT_EQ(placements_of(at::cumsum(sum_partial, 0)), "(Partial(sum),)");
  // A max of partial sums is not the max: the input is reduced first (a reduce_scatter onto
  // the kept dim costs least).
  EXPECT_EQ(placements_of(at::amax(sum_partial, {1})), "(Shard(dim=0),)");
  EXPECT_TRUE(at::allclose(full_tensor(at::amax(sum_partial, {1})), at::amax(g, {1})));
  // A max of partial maxes is.
  at::Tensor max_partial = from_local(g - rank(), mesh, {Partial(comm::ReduceOp::MAX)});
  EXPECT_EQ(placements_of(at::amax(max_partial, {1})), "(Partial(max),)");
  EXPECT_TRUE(at::equal(full_tensor(at::amax(max_partial, {1})), at::amax(g, {1})));
}

DTENSOR_TEST_F(ReductionRules, ScansKeepShardsOfTheScanDimWithOneGatherOfTotals) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(1, 33, at::kDouble).view({8, 4}) / 10;
  at::Tensor cols = distribute_tensor(g, mesh, {Shard{1}});
  at::Tensor rows = distribute_tensor(g, mesh, {Shard{0}});
  EXPECT_EQ(placements_of(at::cumsum(cols, 0)), "(Shard(dim=1),)");
  EXPECT_EQ(placements_of(at::flip(rows, {1})), "(Shard(dim=0),)");
  // NOTE: [Scans of a sharded scan dim]: the scan dim keeps its shard; one all_gather of each
  // rank's last row carries the earlier pieces' totals.
  testing::CommCounter counting;
  at::Tensor prod = at::cumprod(rows, 0);
  EXPECT_EQ(counting.collectives(), 1);
  EXPECT_EQ(placements_of(prod), "(Shard(dim=0),)");
  EXPECT_TRUE(at::allclose(full_tensor(prod), at::cumprod(g, 0)));
  // Uneven pieces, empty ones included (3 rows on 4 ranks: 1, 1, 1, 0), and integer inputs.
  at::Tensor few = g.narrow(0, 0, 3);
  EXPECT_TRUE(at::allclose(full_tensor(at::cumsum(distribute_tensor(few, mesh, {Shard{0}}), 0)), at::cumsum(few, 0)));
  at::Tensor ints = at::arange(-12, 12, at::kLong).view({6, 4});
  EXPECT_TRUE(at::equal(full_tensor(at::cumsum(distribute_tensor(ints, mesh, {Shard{0}}), 0)), at::cumsum(ints, 0)));
  // In place, the written tensor keeps its shard of the scan dim.
  rows.cumsum_(0);
  EXPECT_EQ(placements_of(rows), "(Shard(dim=0),)");
  EXPECT_TRUE(at::allclose(full_tensor(rows), at::cumsum(g, 0)));
  rows.cumsum_(1);
  EXPECT_TRUE(at::allclose(full_tensor(rows), at::cumsum(at::cumsum(g, 0), 1)));
}

// NOTE: [Partial(max) and Partial(min) through monotone ops]: the placements kept, and the
// values, against the single-device ops.
class PointwiseRules : public testing::DTensorOpTestBase {};

// An op's result on DTensors: its placements, and its value against the single-device op's.
struct PlacementCase {
  const char* what;
  at::Tensor got;
  at::Tensor want;
  const char* placements;
};

void expect_cases(const std::vector<PlacementCase>& cases) {
  for (const auto& c : cases) {
    EXPECT_EQ(placements_of(c.got), c.placements) << c.what;
    EXPECT_TRUE(at::allclose(full_tensor(c.got), c.want)) << c.what;
  }
}

DTENSOR_TEST_F(PointwiseRules, MonotoneOpsKeepPartialMaxAndMin) {
  auto mesh = build_device_mesh();
  const at::Tensor g = at::arange(32, at::kFloat).view({8, 4}) / 8 - 2;
  const at::Tensor r = at::linspace(-1, 1, 4);
  // Rank k holds g - k: their max is g, and their min g - (ranks - 1).
  const at::Tensor max_p = from_local(g - rank(), mesh, {Partial(comm::ReduceOp::MAX)});
  const at::Tensor min_p = from_local(g + rank(), mesh, {Partial(comm::ReduceOp::MIN)});
  const at::Tensor rep = distribute_tensor(r, mesh, {Replicate{}});
  const std::vector<PlacementCase> cases = {
      {"exp", at::exp(max_p), at::exp(g), "(Partial(max),)"},
      {"floor", at::floor(min_p), at::floor(g), "(Partial(min),)"},
      {"clamp", at::clamp(max_p, -1, 1), at::clamp(g, -1, 1), "(Partial(max),)"},
      {"neg", at::neg(max_p), at::neg(g), "(Partial(min),)"},
      {"erfc", at::erfc(min_p), at::erfc(g), "(Partial(max),)"},
      {"mul by -2", at::mul(max_p, -2), g * -2, "(Partial(min),)"},
      {"div by 4", at::div(min_p, 4), g / 4, "(Partial(min),)"},
      {"add replicated", at::add(max_p, rep), g + r, "(Partial(max),)"},
      {"replicated minus", at::sub(rep, max_p), r - g, "(Partial(min),)"},
      {"minus alpha -1", at::sub(rep, max_p, -1), r + g, "(Partial(max),)"},
      {"rsub", at::rsub(max_p, rep), r - g, "(Partial(min),)"},
      {"maximum", at::maximum(max_p, max_p * 2), at::maximum(g, g * 2), "(Partial(max),)"},
      {"minimum", at::minimum(min_p, rep), at::minimum(g, r), "(Partial(min),)"},
      {"logaddexp", at::logaddexp(rep, max_p), at::logaddexp(r, g), "(Partial(max),)"},
      {"leaky_relu", at::leaky_relu(max_p, 0.1), at::leaky_relu(g, 0.1), "(Partial(max),)"},
      {"where", at::where(rep > 0, max_p, rep), at::where(r > 0, g, r), "(Partial(max),)"},
      {"to double", max_p.to(at::kDouble), g.to(at::kDouble), "(Partial(max),)"},
  };
  expect_cases(cases);
  // Not monotone on the whole domain (another rank's value may lie outside it), or not at all:
  // the input is reduced first.
  const at::Tensor positive = from_local(g + 3 - rank(), mesh, {Partial(comm::ReduceOp::MAX)});
  for (const at::Tensor& t : {at::log(positive), at::abs(max_p), at::mul(max_p, rep)})
    EXPECT_NE(placements_of(t), "(Partial(max),)");
  EXPECT_TRUE(at::allclose(full_tensor(at::log(positive)), at::log(g + 3)));
  // A mean with a replicated term, and a selection between two partial sums.
  const at::Tensor avg_p = from_local(g + rank() - (mesh.size() - 1) / 2.0, mesh, {Partial(comm::ReduceOp::AVG)});
  EXPECT_EQ(placements_of(at::add(avg_p, rep)), "(Partial(avg),)");
  EXPECT_TRUE(at::allclose(full_tensor(at::add(avg_p, rep)), g + r));
  const at::Tensor sum_a = from_local(g / mesh.size(), mesh, {Partial{}});
  const at::Tensor sum_b = from_local(at::ones({8, 4}), mesh, {Partial{}});
  const at::Tensor picked = at::where(distribute_tensor(g > 0, mesh, {Replicate{}}), sum_a, sum_b);
  EXPECT_EQ(placements_of(picked), "(Partial(sum),)");
  EXPECT_TRUE(at::allclose(full_tensor(picked), at::where(g > 0, g, at::full({8, 4}, mesh.size() * 1.f))));
}

// NOTE: [Partial and linearity]: addcmul, addcdiv and lerp are linear in self and one other
// operand together; addcmul and addcdiv add a replicated value to self when both factors are.
DTENSOR_TEST_F(PointwiseRules, OpsLinearInTwoOperandsTogetherKeepPartialSums) {
  auto mesh = build_device_mesh();
  const int64_t n = mesh.size();
  const at::Tensor a = at::arange(32, at::kFloat).view({8, 4}) / 8 - 2, b = at::linspace(-1, 1, 32).view({8, 4});
  const at::Tensor r = at::linspace(0.5, 2, 4);
  auto psum = [&](const at::Tensor& t) { return from_local(t / n, mesh, {Partial{}}); };
  const at::Tensor rep = distribute_tensor(r, mesh, {Replicate{}});
  const at::Tensor max_a = from_local(a - rank(), mesh, {Partial(comm::ReduceOp::MAX)});
  const std::vector<PlacementCase> cases = {
      {"addcmul(P, P, R)", at::addcmul(psum(a), psum(b), rep, 0.5), at::addcmul(a, b, r, 0.5), "(Partial(sum),)"},
      {"addcmul(P, R, P)", at::addcmul(psum(a), rep, psum(b), -2), at::addcmul(a, r, b, -2), "(Partial(sum),)"},
      {"addcdiv(P, P, R)", at::addcdiv(psum(a), psum(b), rep, 3), at::addcdiv(a, b, r, 3), "(Partial(sum),)"},
      {"lerp(P, P, 0.3)", at::lerp(psum(a), psum(b), 0.3), at::lerp(a, b, 0.3), "(Partial(sum),)"},
      {"lerp(P, P, R)", at::lerp(psum(a), psum(b), rep), at::lerp(a, b, r), "(Partial(sum),)"},
      {"addcmul(P(max), R, R)", at::addcmul(max_a, rep, rep, -1), at::addcmul(a, r, r, -1), "(Partial(max),)"},
  };
  expect_cases(cases);
  // A Partial denominator is not linear: it is reduced (a replicated numerator may then be taken
  // as a share of a Partial(sum), which costs nothing); a Partial self with replicated factors
  // likewise takes a factor as a share. Either way the value is the single-device one.
  EXPECT_TRUE(at::allclose(full_tensor(at::addcdiv(psum(a), rep, psum(b.abs() + 1))), at::addcdiv(a, r, b.abs() + 1)));
  EXPECT_TRUE(at::allclose(full_tensor(at::addcmul(psum(a), rep, rep)), at::addcmul(a, r, r)));
  EXPECT_TRUE(at::allclose(full_tensor(at::lerp(psum(a), rep, 0.25)), at::lerp(a, r.expand({8, 4}), 0.25)));
}

// NOTE: [Composite ops run whole]: max/min.dim's gradient on DTensors.
DTENSOR_TEST_F(ReductionRules, MaxDimBackwardRunsWholeOnDTensors) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4}).remainder(7).requires_grad_();
  at::Tensor x = distribute_tensor(g.detach(), mesh, {Shard{0}}).requires_grad_();
  at::Tensor values = std::get<0>(at::max(x, 1));
  values.backward(distribute_tensor(at::arange(8, at::kFloat), mesh, {Shard{0}}));
  std::get<0>(at::max(g, 1)).backward(at::arange(8, at::kFloat));
  EXPECT_EQ(placements_of(x.grad()), "(Shard(dim=0),)");
  EXPECT_TRUE(at::equal(full_tensor(x.grad()), g.grad()));
  // Its result is not recorded by autograd on DTensors: a double backward, where the
  // incoming gradient (2 v) requires grad, is refused...
  at::Tensor v = std::get<0>(at::max(x, 1));
  EXPECT_PRED2(contains, error_of([&] {
                 torch::autograd::grad({(v * v).sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
               }),
               "aten::value_selecting_reduction_backward runs on DTensors as one op below autograd");
  // ...while on plain tensors it still is.
  at::Tensor p = g.detach().clone().requires_grad_();
  at::Tensor pv = std::get<0>(at::max(p, 1));
  at::Tensor dp = torch::autograd::grad({(pv * pv).sum()}, {p}, {}, true, true)[0];
  ASSERT_TRUE(dp.requires_grad());
  at::Tensor ddp = torch::autograd::grad({dp.sum()}, {p})[0];
  // dp = 2 v at each row's max (v > 0 here), 0 elsewhere; so d(sum dp)/dp = 2 there.
  EXPECT_TRUE(at::equal(ddp, (dp.detach() != 0).to(at::kFloat) * 2));
}

// NOTE: [Out= overloads with several outputs] (dispatch.cpp): each out= tensor is written and
// keeps its placements (more in OutVariants.*).
DTENSOR_TEST_F(ReductionRules, OutOverloadsWithSeveralOutputsWriteEach) {
  auto mesh = build_device_mesh();
  at::Tensor x = distribute_tensor(at::arange(32, at::kFloat).view({8, 4}), mesh, {Shard{1}});
  at::Tensor values = distribute_tensor(at::zeros({8}), mesh, {Replicate{}});
  at::Tensor indices = distribute_tensor(at::zeros({8}, at::kLong), mesh, {Replicate{}});
  at::max_out(values, indices, x, 1);
  EXPECT_EQ(placements_of(values), "(Replicate(),)");
  EXPECT_TRUE(at::equal(full_tensor(values), at::arange(32, at::kFloat).view({8, 4}).select(1, 3)));
  EXPECT_TRUE(at::equal(full_tensor(indices), at::full({8}, 3, at::kLong)));
  // With one output, out= works: the out tensor keeps its placements.
  at::Tensor out = distribute_tensor(at::zeros({8}), mesh, {Replicate{}});
  at::sum_out(out, x, {1});
  EXPECT_EQ(placements_of(out), "(Replicate(),)");
  EXPECT_TRUE(at::equal(full_tensor(out), at::arange(32, at::kFloat).view({8, 4}).sum(1)));
}

// ---- the sample database ------------------------------------------------------------------------

TEST(OpDb, EveryOpWithAShardingRuleHasSamples) {
  std::set<std::string> sampled;
  for (const auto& info : testing::op_db().ops()) {
    sampled.insert(info.op);
    sampled.insert(info.name());
  }
  // What this libtorch's dispatcher has: "aten::x.overload" keys and "aten::x" names.
  std::set<std::string> known;
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
    // libtorch 2.6 has names with kernels but no schema (aten::hardshrink_): not ops.
    if (!c10::Dispatcher::singleton().findSchema(n).has_value()) continue;
    known.insert(n.name);
    known.insert(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
  }
  std::vector<std::string> missing;
  for (const auto& rule : ops::ops_with_rules()) {
    // out= variants share the functional's rule; rules may name ops a newer libtorch has.
    if (rule.find(".out") != std::string::npos || !known.count(rule)) continue;
    if (!sampled.count(rule)) missing.push_back(rule);
  }
  EXPECT_TRUE(missing.empty()) << "ops with a sharding rule but no samples in converters/samples: "
                               << c10::Join(", ", missing);
}

// A sample of an out= overload that leaves an out= argument out is not a sample of it (on
// libtorch 2.6 _foreach_norm.Scalar_out gained `ScalarType? dtype=None` before its out=, and
// its schema-built sample once stopped at that default, giving no `out`).
TEST(OpDb, OutOverloadSamplesGiveEveryOutArgument) {
  size_t checked = 0;
  for (const auto& info : testing::op_db().ops()) {
    auto h = c10::Dispatcher::singleton().findSchema({info.name(), info.overload()});
    if (!h || !h->hasSchema()) continue;
    const c10::FunctionSchema& schema = h->schema();
    const std::vector<size_t> outs = ops::out_arguments(schema);
    if (outs.empty()) continue;
    for (const auto& sample : info.make_samples()) {
      ++checked;
      for (size_t k : outs) {
        const std::string& name = schema.arguments()[k].name();
        bool given = k < sample.args.size();
        for (const auto& kw : sample.kwargs) given = given || kw.first == name;
        EXPECT_TRUE(given) << info.op << " " << sample.variant << " gives no '" << name << "'";
      }
    }
  }
  EXPECT_GT(checked, 10u);
}

TEST(OpDb, RandomSamplesAreSeededAndGetTheirOwnGenerator) {
  for (const auto* info : testing::ops_of_family(testing::op_db(), "random")) {
    const bool reads_only = info->name() == "aten::native_dropout_backward";  // not random itself (nor its out=)
    auto a = info->make_samples();
    auto b = info->make_samples();
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].rng_seed.has_value(), !reads_only) << info->op << " " << a[i].variant;
      for (size_t k = 0; k < a[i].kwargs.size(); ++k)
        if (a[i].kwargs[k].second.isGenerator())  // a new object per make_samples (i.e. per rank)
          EXPECT_NE(a[i].kwargs[k].second.toGenerator(), b[i].kwargs[k].second.toGenerator()) << info->op;
    }
  }
}

TEST(OpDb, SamplesAreDeterministicAndValid) {
  const auto* info = testing::op_db().find("aten::add.Tensor");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->family, "pointwise");
  EXPECT_EQ(info->name(), "aten::add");
  EXPECT_EQ(info->overload(), "Tensor");
  auto a = info->make_samples();
  auto b = info->make_samples();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i].args[0].toTensor(), b[i].args[0].toTensor())) << a[i].variant;
  }
  std::set<std::string> variants;
  for (const auto& s : a) EXPECT_TRUE(variants.insert(s.variant).second) << "duplicate variant " << s.variant;
}

TEST(OpDb, RejectsUnknownAndDuplicateOps) {
  testing::OpDb db;
  auto none = [](testing::SampleGen&) { return std::vector<testing::OpSample>{}; };
  EXPECT_PRED2(contains, error_of([&] { db.add("aten::no_such_op", "pointwise", none); }),
               "aten::no_such_op is not an operator in the dispatcher");
  db.add("aten::relu", "pointwise", none);
  EXPECT_PRED2(contains, error_of([&] { db.add("aten::relu", "pointwise", none); }),
               "aten::relu already has samples");
}

TEST(BoxedArgs, FillsDefaultsAndKeywordsAndNamesMistakes) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::sum", "dim_IntList");
  const auto& schema = op.schema();
  at::Tensor t = at::ones({2, 3});
  auto full = testing::boxed_args(schema, {t, int64_t{1}}, {{"keepdim", true}});
  ASSERT_EQ(full.size(), 4u);
  EXPECT_EQ(full[1].toIntVector(), std::vector<int64_t>{1});  // int coerced to int[1]
  EXPECT_TRUE(full[2].toBool());
  EXPECT_TRUE(full[3].isNone());  // dtype default
  EXPECT_PRED2(contains, error_of([&] { testing::boxed_args(schema, {t}, {{"keepdims", true}}); }),
               "aten::sum.dim_IntList has no argument named 'keepdims'");
  EXPECT_PRED2(contains, error_of([&] { testing::boxed_args(schema, {t, 1, true, c10::IValue(), 5}, {}); }),
               "takes 4 arguments but the sample gives 5 positionally");
  EXPECT_PRED2(contains, error_of([&] { testing::boxed_args(schema, {}, {}); }),
               "gives no value for argument 'self'");
  auto add = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
  EXPECT_PRED2(contains, error_of([&] { testing::boxed_args(add.schema(), {t, t, 2}, {}); }),
               "argument 'alpha' is keyword-only");
}

TEST(GeneratedSamples, CoverSimpleSchemasAndSkipTheRest) {
  testing::SampleGen g(1);
  auto schema_of = [](const char* name, const char* overload) {
    return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).schema();
  };
  auto cumsum = testing::generated_sample(schema_of("aten::cumsum", ""), g);
  ASSERT_TRUE(cumsum.has_value());
  EXPECT_EQ(cumsum->kwargs.size(), 2u);  // self and dim; dtype keeps its default
  EXPECT_EQ(cumsum->kwargs[0].second.toTensor().sizes(), c10::IntArrayRef({8, 8}));
  EXPECT_FALSE(testing::generated_sample(schema_of("aten::add", "out"), g).has_value());        // out=
  EXPECT_FALSE(testing::generated_sample(schema_of("aten::is_nonzero", ""), g).has_value());    // returns bool
  EXPECT_FALSE(testing::generated_sample(schema_of("aten::index", "Tensor"), g).has_value());   // Tensor?[]
  const auto& gen = testing::generated_op_db();
  EXPECT_EQ(gen.find("aten::add.Tensor"), nullptr);  // hand-written samples win
  EXPECT_EQ(gen.find("aten::cumsum"), nullptr);
  ASSERT_NE(gen.find("aten::glu"), nullptr);
  EXPECT_TRUE(gen.find("aten::glu")->generated);
  EXPECT_GT(gen.ops().size(), 300u);
}

// ---- the expected-failures file -------------------------------------------------------------------

TEST(ExpectedFailures, ParsesWildcardsAndRejectsMalformedLines) {
  auto xf = testing::ExpectedFailures::parse(
      "# comment\n\naten::mean.dim uneven_f64 * fwd Partial(avg) of uneven shards\naten::foo * 2d * no rule\n",
      "xf.txt");
  ASSERT_EQ(xf.entries().size(), 2u);
  EXPECT_EQ(xf.entries()[0].line, 3);
  testing::CaseRecord r;
  r.op = "aten::mean.dim";
  r.variant = "uneven_f64";
  r.mesh = "1d";
  r.direction = "fwd";
  EXPECT_NE(xf.match(r), nullptr);
  r.direction = "bwd";
  EXPECT_EQ(xf.match(r), nullptr);
  EXPECT_PRED2(contains, error_of([] { testing::ExpectedFailures::parse("aten::x * 3d fwd why\n", "f.txt"); }),
               "f.txt:1: mesh '3d' is not one of 1d, 2d, *");
  EXPECT_PRED2(contains, error_of([] { testing::ExpectedFailures::parse("aten::x * 1d fwd\n", "f.txt"); }),
               "f.txt:1: an expected failure needs a reason");
  EXPECT_PRED2(contains, error_of([] { testing::ExpectedFailures::parse("aten::x *\n", "f.txt"); }),
               "f.txt:1: expected '<op> <variant> <mesh> <direction> <reason>'");
}

TEST(ExpectedFailures, MarksXfailAndXpass) {
  auto xf = testing::ExpectedFailures::parse("aten::a * * * known\n", "x");
  std::vector<testing::CaseRecord> rs(3);
  for (auto& r : rs) r.op = "aten::a";
  rs[0].status = "fail";
  rs[1].status = "pass";
  rs[2].status = "skip";
  testing::apply_expected_failures(rs, xf);
  EXPECT_EQ(rs[0].status, "xfail");
  EXPECT_EQ(rs[1].status, "xpass");
  EXPECT_PRED2(contains, rs[1].reason, "listed as expected to fail (known) but passed");
  EXPECT_EQ(rs[2].status, "skip");
}

TEST(ExpectedFailures, TheCheckedInFileParsesAndNamesKnownOps) {
  auto xf = testing::ExpectedFailures::load(testing::default_expected_failures_path());
  // Lines may name ops of the other libtorch line (1.13's aten::_scaled_dot_product_attention,
  // 2.x's aten::scaled_dot_product_attention): those this libtorch lacks match nothing.
  std::set<std::string> known;
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
    // libtorch 2.6 has names with kernels but no schema (aten::hardshrink_): not ops.
    if (!c10::Dispatcher::singleton().findSchema(n).has_value()) continue;
    known.insert(n.name);
    known.insert(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
  }
  for (const auto& e : xf.entries()) {
    if (e.op == "*" || !known.count(e.op)) continue;
    EXPECT_TRUE(testing::op_db().find(e.op) != nullptr)
        << "expected_failures.txt:" << e.line << " names " << e.op << ", which has no hand-written samples";
  }
}

// ---- the op suite ---------------------------------------------------------------------------------

// Failures reported per family test beyond which only a count is given.
constexpr int kMaxReportedCases = 40;

std::string camel(const std::string& s) {
  std::string out;
  bool up = true;
  for (char c : s) {
    if (c == '_') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out;
}

class OpFamilyTest : public testing::MultiThreadedTest {
 public:
  OpFamilyTest(std::string family, std::string mesh_kind, std::string id)
      : family_(std::move(family)), mesh_kind_(std::move(mesh_kind)), id_(std::move(id)) {}
  std::chrono::milliseconds timeout() const override { return std::chrono::minutes(15); }
  void TestBody() override { RunRanks(id_); }

  void RankBody() override {
    auto mesh = testing::suite_mesh(mesh_kind_, group_ptr());
    if (!mesh) GTEST_SKIP() << "a 2-D mesh needs an even world size >= 4; this run has " << group().size();
    auto records = testing::run_op_suite(*mesh, mesh_kind_, testing::ops_of_family(testing::op_db(), family_),
                                         testing::suite_options(mesh_kind_), {});
    const std::string xf_path = testing::default_expected_failures_path();
    testing::apply_expected_failures(records, testing::ExpectedFailures::load(xf_path));
    if (rank() == 0) write_results(records);
    int reported = 0, bad = 0;
    for (const auto& r : records) {
      const bool invalid_sample = r.status == "skip" && r.reason.rfind("invalid sample", 0) == 0;
      if (r.status != "fail" && r.status != "error" && r.status != "xpass" && !invalid_sample) continue;
      ++bad;
      if (++reported > kMaxReportedCases) continue;
      std::ostringstream os;
      os << r.op << " [" << r.variant << ", " << r.mesh << ", " << r.direction << "] " << r.status;
      if (!r.failing_placements.empty()) os << " with " << r.failing_placements;
      os << ": " << r.reason;
      if (r.status == "xpass") os << "\n  remove its line from " << xf_path;
      else if (!invalid_sample)
        os << "\n  to accept it, add to " << xf_path << ": " << r.op << " " << r.variant << " " << r.mesh << " "
           << r.direction << " <reason>";
      ADD_FAILURE() << os.str();
    }
    if (reported > kMaxReportedCases) ADD_FAILURE() << bad << " cases failed in all; the first " << kMaxReportedCases << " are above";
  }

 private:
  void write_results(const std::vector<testing::CaseRecord>& records) const {
    const char* dir = std::getenv("DTENSOR_OPS_RESULTS_DIR");
    if (!dir || !*dir) return;
    const std::string path = std::string(dir) + "/" + family_ + "_" + mesh_kind_ + ".json";
    std::ofstream out(path);
    ASSERT_TRUE(out.good()) << "cannot write " << path;
    out << nlohmann::json{{"schema_version", 1}, {"records", records}}.dump(1) << "\n";
  }

  std::string family_, mesh_kind_, id_;
};

const bool kFamilyTestsRegistered = [] {
  for (const std::string& family : testing::op_db().families()) {
    for (const std::string mesh_kind : {"1d", "2d"}) {
      const std::string name = camel(family) + (mesh_kind == "1d" ? "1D" : "2D");
      const std::string id = "Ops." + name;
      testing::internal::RankTestRegistrar(
          id.c_str(), [=] { return std::make_unique<OpFamilyTest>(family, mesh_kind, id); }, __FILE__, __LINE__);
      ::testing::RegisterTest("Ops", name.c_str(), nullptr, nullptr, __FILE__, __LINE__,
                              [=]() -> OpFamilyTest* { return new OpFamilyTest(family, mesh_kind, id); });
    }
  }
  return true;
}();

}  // namespace
}  // namespace dtensor
