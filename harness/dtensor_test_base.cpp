// harness/dtensor_test_base.cpp: see dtensor_test_base.h.
#include "harness/dtensor_test_base.h"

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

// An op called boxed: arguments in, outputs out.
using BoxedFn = std::function<std::vector<c10::IValue>(std::vector<c10::IValue>)>;

// Tensors larger than this are not printed in failure messages.
constexpr int64_t kMaxPrintedNumel = 64;

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

// Fresh tensors (same values and requires_grad) so that an in-place op run on plain tensors
// does not change the arguments the converter distributes afterwards.
std::vector<c10::IValue> clone_tensors(const std::vector<c10::IValue>& args) {
  return detail::map_tensors(args, [](const at::Tensor& t) {
    at::Tensor copy = t.detach().clone();
    if (t.requires_grad()) copy.requires_grad_(true);
    return copy;
  });
}

// The algorithm behind every test_op overload (all ranks run the same steps, so the
// collectives inside - distribute_tensor, the op, full_tensor - line up).
void run_test_op(const DeviceMesh& mesh, const std::string& op_name, const BoxedFn& call,
                 const std::vector<c10::IValue>& args, const TestOpOptions& options) {
  // 1. The reference: the op on plain tensors.
  std::vector<at::Tensor> expected;
  try {
    expected = detail::flatten_tensors(call(clone_tensors(args)));
  } catch (const std::exception& e) {
    ADD_FAILURE() << op_name << " threw on plain tensors (fix the test's arguments): "
                  << message_of(e);
    return;
  }

  // 2. Every combination of placements of the tensor arguments.
  DTensorConverter converter(mesh, args, options.converter);
  std::vector<c10::IValue> converted;
  while (converter.next(converted)) {
    const std::string where = op_name + " with " + converter.current_placements_string();
    std::vector<at::Tensor> outputs;
    try {
      outputs = detail::flatten_tensors(call(std::move(converted)));
    } catch (const comm::CollectiveError&) {
      throw;  // the group is broken: the next combination would hang
    } catch (const std::exception& e) {
      ADD_FAILURE() << where << " threw: " << message_of(e);
      continue;
    }
    if (outputs.size() != expected.size()) {
      ADD_FAILURE() << where << " returned " << outputs.size()
                    << " tensors; on plain tensors it returned " << expected.size();
      continue;
    }

    // 3. Each output gathered back must match the reference.
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!is_dtensor(outputs[i])) {
        ADD_FAILURE() << where << ": output " << i << " is a plain tensor, not a DTensor";
        continue;
      }
      at::Tensor full;
      try {
        full = full_tensor(outputs[i]);
      } catch (const comm::CollectiveError&) {
        throw;
      } catch (const std::exception& e) {
        ADD_FAILURE() << where << ": full_tensor of output " << i << " (" << dtensor::to_string(outputs[i])
                      << ") threw: " << message_of(e);
        continue;
      }
      EXPECT_TRUE(tensors_close(expected[i], full, options.rtol, options.atol))
          << where << ": output " << i << " (" << get_spec(outputs[i]).to_string() << ")";
    }
  }

  // 4. Every combination could be converted.
  std::ostringstream why;
  for (const std::string& e : converter.errors()) why << "\n  " << e;
  EXPECT_TRUE(converter.successful())
      << op_name << ": " << converter.misses() << " of " << converter.num_combinations()
      << " placement combinations could not be converted:" << why.str();
}

}  // namespace

void test_op(const DeviceMesh& mesh, const c10::OperatorHandle& op,
             const std::vector<c10::IValue>& args, const TestOpOptions& options) {
  std::ostringstream name;
  name << op.operator_name();
  run_test_op(mesh, name.str(),
              [op](std::vector<c10::IValue> stack) {
                op.callBoxed(&stack);
                return stack;
              },
              args, options);
}

void test_op(const DeviceMesh& mesh, const TensorOpFn& op, const std::vector<c10::IValue>& args,
             const TestOpOptions& options) {
  run_test_op(mesh, options.op_name,
              [&op](std::vector<c10::IValue> stack) {
                return std::vector<c10::IValue>{c10::IValue(op(stack))};
              },
              args, options);
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
