// harness/dtensor_test_base.cpp: see dtensor_test_base.h.
#include "harness/dtensor_test_base.h"

#include "converters/op_check.h"
#include "dtensor/comm/group.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <utility>

namespace dtensor {
namespace testing {

namespace {

// Tensors larger than this are not printed in failure messages.
constexpr int64_t kMaxPrintedNumel = 64;

// Turns the driver's result into gtest failures (one per failing combination kept).
void report(const OpCheckResult& r, const std::string& op_name) {
  for (const auto* dir : {&r.forward, &r.backward}) {
    const char* what = dir == &r.forward ? "" : " (backward)";
    if (dir->status == CheckStatus::kSkip && dir->reason.rfind("invalid sample", 0) == 0) {
      ADD_FAILURE() << op_name << ": " << dir->reason << " (fix the test's arguments)";
    }
    if (dir->status != CheckStatus::kFail && dir->status != CheckStatus::kError) continue;
    for (const auto& f : dir->failures)
      ADD_FAILURE() << op_name << what << (f.placements.empty() ? "" : " with " + f.placements) << ": "
                    << f.message;
    if (dir->combinations - dir->passed > static_cast<int64_t>(dir->failures.size()))
      ADD_FAILURE() << op_name << what << ": " << dir->combinations - dir->passed << " of " << dir->combinations
                    << " combinations failed in all (the first ones are shown above)";
  }
}

OpCheckOptions driver_options(const TestOpOptions& o) {
  OpCheckOptions d;
  d.rtol = o.rtol;
  d.atol = o.atol;
  d.converter = o.converter;
  d.backward = o.backward;
  return d;
}

}  // namespace

void test_op(const DeviceMesh& mesh, const c10::OperatorHandle& op,
             const std::vector<c10::IValue>& args, const TestOpOptions& options) {
  std::ostringstream name;
  name << op.operator_name();
  report(check_op(mesh, op, args, driver_options(options)), name.str());
}

void test_op(const DeviceMesh& mesh, const TensorOpFn& op, const std::vector<c10::IValue>& args,
             const TestOpOptions& options) {
  report(check_op(
             mesh, options.op_name,
             [&op](std::vector<c10::IValue> stack) { return std::vector<c10::IValue>{c10::IValue(op(stack))}; },
             /*written_arg=*/-1, args, driver_options(options)),
         options.op_name);
}

void test_op(const DeviceMesh& mesh, const std::string& name, const std::string& overload,
             const std::vector<c10::IValue>& args, const TestOpOptions& options) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  test_op(mesh, op, args, options);
}

::testing::AssertionResult tensors_close(const at::Tensor& expected, const at::Tensor& actual,
                                         double rtol, double atol) {
  if (!expected.defined() || !actual.defined()) {
    if (expected.defined() == actual.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << (actual.defined() ? "expected an undefined tensor" : "got an undefined tensor");
  }
  if (expected.sizes() != actual.sizes()) {
    return ::testing::AssertionFailure()
           << "shape " << actual.sizes() << " differs from the expected " << expected.sizes();
  }
  if (expected.scalar_type() != actual.scalar_type()) {
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type()
                                         << " differs from the expected "
                                         << expected.scalar_type();
  }
  const at::Tensor e = expected.detach().cpu();
  const at::Tensor a = actual.detach().cpu();
  const bool inexact = e.is_floating_point() || e.is_complex();
  const bool close = inexact ? at::allclose(a, e, rtol, atol, /*equal_nan=*/true) : at::equal(a, e);
  if (close) return ::testing::AssertionSuccess();

  const at::Tensor diff = inexact ? (a - e).abs() : (a.to(at::kDouble) - e.to(at::kDouble)).abs();
  // Formatted here: AssertionResult would print doubles with 17 digits.
  std::ostringstream os;
  os << "values differ: max abs diff " << diff.max().item<double>();
  if (inexact) os << " (rtol " << rtol << ", atol " << atol << ")";
  if (e.numel() <= kMaxPrintedNumel) os << "\nexpected:\n" << e << "\nactual:\n" << a;
  return ::testing::AssertionFailure() << os.str();
}

}  // namespace testing
}  // namespace dtensor
