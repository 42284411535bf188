// converters/samples/matrix_samples.cpp: samples of the matrix products: shapes whose free
// and contracted dims divide the mesh, and ones that do not.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace testing {
namespace samples {

void add_matrix_samples(OpDb& db) {
  db.add("aten::mm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({4, 8})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({6, 3}, at::kDouble)})};
  });
  db.add("aten::addmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 8}), g.tensor({8, 4}), g.tensor({4, 8})}),
                   OpSample("bias_row", {g.tensor({8}), g.tensor({8, 4}), g.tensor({4, 8})}).kw("beta", 0.5).kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({5, 3}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                           g.tensor({6, 3}, at::kDouble)})};
  });
  db.add("aten::bmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}),
                   OpSample("uneven_f64", {g.tensor({3, 5, 6}, at::kDouble), g.tensor({3, 6, 2}, at::kDouble)})};
  });
  db.add("aten::baddbmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({4, 8, 8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}),
                   OpSample("broadcast_self", {g.tensor({8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}).kw("beta", 0.5)};
  });
  db.add("aten::dot", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8}), g.tensor({8})}),
                   OpSample("uneven_f64", {g.tensor({6}, at::kDouble), g.tensor({6}, at::kDouble)})};
  });
  db.add("aten::mv", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({4})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({6}, at::kDouble)})};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
