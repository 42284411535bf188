// harness/dtensor_test_base.h
//
// Fixtures for DTensor op tests, the C++ counterparts of PyTorch's DTensorTestBase (ranks
// as processes) and DTensorOpTestBase (ranks as threads), with test_op: run an op on plain
// tensors, then on every sharding of its tensor arguments (DTensorConverter), and check
// that every DTensor output gathers back to the plain result.
//
//   class AddTest : public dtensor::testing::DTensorOpTestBase {};
//
//   DTENSOR_TEST_F(AddTest, EveryPlacement) {       // the body runs in every rank
//     DeviceMesh mesh = build_device_mesh();        // 1-D, all ranks
//     test_op(mesh, "aten::add", "Tensor", {at::randn({8, 4}), at::randn({8, 4}), 1});
//     test_op(mesh, [](const std::vector<c10::IValue>& a) {
//       return a[0].toTensor() * 2;
//     }, {at::randn({8, 4})});
//   }
//
// Every function here except tensors_close is COLLECTIVE over the mesh: every rank must
// call it with the same op, argument shapes and dtypes, and options (the values of the
// mesh's first rank are the ones distributed). Random arguments need the same seed on every
// rank, or else they differ only in values, which is fine: see DTensorConverter.
#pragma once

#include "converters/dtensor_converter.h"
#include "converters/op_check.h"
#include "dtensor/mesh/device_mesh.h"
#include "harness/multi_rank_test.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace dtensor {
namespace testing {

// Default tolerances of test_op (float32 reductions over shards reorder additions).
constexpr double kDefaultTestOpRtol = kDefaultCheckRtol;
constexpr double kDefaultTestOpAtol = kDefaultCheckAtol;

struct TestOpOptions {
  // Passes when |actual - expected| <= atol + rtol * |expected| (at::allclose) for floating
  // and complex dtypes; other dtypes must be equal.
  double rtol = kDefaultTestOpRtol;
  double atol = kDefaultTestOpAtol;
  // Which placements to try (Partial, uneven shards, per mesh dim).
  DTensorConverterOptions converter;
  // Also check the gradients of the floating inputs (a fixed random output gradient flows
  // back through full_tensor() and the op); not for ops that write an input.
  bool backward = false;
  // Name used in failure messages for an op given as a function.
  std::string op_name = "op";
};

// An op given as a function of its arguments (the same stack layout DTensorConverter
// takes) returning one tensor.
using TensorOpFn = std::function<at::Tensor(const std::vector<c10::IValue>& args)>;

// Collective. Runs `op` on `args`, then for every DTensorConverter combination runs it on
// the converted args and checks (EXPECT) each output tensor: it must be a DTensor, and its
// full_tensor() must match the plain output's shape, dtype and values (and, with `backward`,
// the gradients must match); a failure names the op, the combination and the output.
// Combinations the converter cannot build are failures too. The checking itself is
// converters/op_check.h's check_op; this reports its result through gtest.
//
// An exception from the op on DTensors is reported as a failure and the next combination
// runs; this relies on the op failing alike on every rank (sharding errors do). In-place
// ops are fine: the plain run gets clones of the tensors.
void test_op(const DeviceMesh& mesh, const c10::OperatorHandle& op,
             const std::vector<c10::IValue>& args, const TestOpOptions& options = {});
void test_op(const DeviceMesh& mesh, const TensorOpFn& op, const std::vector<c10::IValue>& args,
             const TestOpOptions& options = {});
// The op found by c10::Dispatcher::singleton().findSchemaOrThrow(name, overload), e.g.
// ("aten::add", "Tensor"), ("aten::sum", "") (the overload-less one), called boxed: `args`
// must hold every argument of the schema, defaults included.
void test_op(const DeviceMesh& mesh, const std::string& name, const std::string& overload,
             const std::vector<c10::IValue>& args, const TestOpOptions& options = {});

// Not collective. Success when `actual` has `expected`'s shape and dtype and its values
// match (see TestOpOptions); the failure message says which of these differs, with the
// largest absolute difference.
::testing::AssertionResult tensors_close(const at::Tensor& expected, const at::Tensor& actual,
                                         double rtol = kDefaultTestOpRtol,
                                         double atol = kDefaultTestOpAtol);

namespace internal {
// The fixture helpers, written once for both rank kinds.
template <class RankTest>
class DTensorTestMixin : public RankTest {
 public:
  // Collective (every rank, in the body): a 1-D mesh over all ranks of the test's group, on
  // device_type() (PyTorch: DeviceMesh(device_type, list(range(world_size)))).
  DeviceMesh build_device_mesh() const {
    return init_device_mesh(this->device_type(), {this->group().size()}, {}, this->group_ptr());
  }

  void test_op(const DeviceMesh& mesh, const c10::OperatorHandle& op,
               const std::vector<c10::IValue>& args, const TestOpOptions& options = {}) const {
    ::dtensor::testing::test_op(mesh, op, args, options);
  }
  void test_op(const DeviceMesh& mesh, const TensorOpFn& op,
               const std::vector<c10::IValue>& args, const TestOpOptions& options = {}) const {
    ::dtensor::testing::test_op(mesh, op, args, options);
  }
  void test_op(const DeviceMesh& mesh, const std::string& name, const std::string& overload,
               const std::vector<c10::IValue>& args, const TestOpOptions& options = {}) const {
    ::dtensor::testing::test_op(mesh, name, overload, args, options);
  }
};
}  // namespace internal

// Ranks as processes over gloo (nccl with enough GPUs); see MultiProcessTest.
class DTensorTestBase : public internal::DTensorTestMixin<MultiProcessTest> {};

// Ranks as threads over a ThreadGroup; see MultiThreadedTest.
// device_type() is "cpu": the threaded group works on host memory.
class DTensorOpTestBase : public internal::DTensorTestMixin<MultiThreadedTest> {};

}  // namespace testing
}  // namespace dtensor
