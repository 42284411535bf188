// converters/samples/embedding_samples.cpp: samples of embedding and its backward
// (dtensor/ops/embedding_rules.cpp). The tables' row counts divide the mesh and do not, so
// row-sharded lookups cover uneven and empty shards; repeated indices exercise
// scale_grad_by_freq and padding_idx in the backward.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace testing {
namespace samples {

void add_embedding_samples(OpDb& db) {
  db.add("aten::embedding", "embedding", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.index({2, 3}, 8)}),
                   OpSample("uneven_rows", {g.tensor({10, 4}), g.index({2, 3}, 10)}),
                   OpSample("1d_indices_f64", {g.tensor({6, 8}, at::kDouble), g.index({5}, 6)})};
  });
  db.add("aten::embedding_dense_backward", "embedding", [](SampleGen& g) {
    const at::Tensor repeated = at::tensor({1, 3, 3, 9, 1, 0}, at::kLong).view({2, 3});
    return Samples{
        OpSample("even", {g.tensor({2, 3, 4}), g.index({2, 3}, 8), 8, -1, false}),
        OpSample("uneven_rows", {g.tensor({2, 3, 4}), g.index({2, 3}, 10), 10, -1, false}),
        OpSample("padding_idx", {g.tensor({2, 3, 4}), repeated, 10, 3, false}),
        OpSample("scale_grad_by_freq", {g.tensor({2, 3, 4}), repeated, 10, -1, true}),
        OpSample("scale_and_padding", {g.tensor({2, 3, 4}), repeated, 10, 1, true}),
    };
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
