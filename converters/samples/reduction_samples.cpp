// converters/samples/reduction_samples.cpp: samples of the reductions (sum, mean, ...): whole
// tensor, one dim, several dims, keepdim, negative dims, and shapes that do not divide.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace testing {
namespace samples {

void add_reduction_samples(OpDb& db) {
  using IL = std::vector<int64_t>;
  db.add("aten::sum", "reduction", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
                   OpSample("3d", {g.tensor({2, 4, 6})})};
  });
  db.add("aten::sum.dim_IntList", "reduction", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), IL{0}}),
                   OpSample("dim1_keepdim", {g.tensor({8, 4}), IL{1}, true}),
                   OpSample("dims_neg", {g.tensor({2, 4, 6}), IL{-1, 0}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{1}})};
  });
  db.add("aten::mean", "reduction", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)})};
  });
  db.add("aten::mean.dim", "reduction", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), IL{0}}),
                   OpSample("dim1_keepdim", {g.tensor({8, 4}), IL{1}, true}),
                   OpSample("dims_3d", {g.tensor({2, 4, 6}), IL{0, 2}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{0}})};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
