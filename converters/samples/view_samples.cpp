// converters/samples/view_samples.cpp: samples of the view ops (t, transpose, permute,
// (un)squeeze, expand, view/reshape): sharded dims that survive, move, merge and split.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace testing {
namespace samples {

void add_view_samples(OpDb& db) {
  using IL = std::vector<int64_t>;
  db.add("aten::t", "view", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
                   OpSample("1d", {g.tensor({8})})};
  });
  db.add("aten::transpose.int", "view", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 0, 1}), OpSample("3d_neg", {g.tensor({2, 4, 6}), -1, 0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 1, 0})};
  });
  db.add("aten::permute", "view", [](SampleGen& g) {
    return Samples{OpSample("3d", {g.tensor({2, 4, 6}), IL{2, 0, 1}}), OpSample("2d", {g.tensor({8, 4}), IL{1, 0}}),
                   OpSample("uneven_f64", {g.tensor({5, 6, 3}, at::kDouble), IL{1, 2, 0}})};
  });
  db.add("aten::unsqueeze", "view", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.tensor({8, 4}), 1}), OpSample("dim0", {g.tensor({8, 4}), 0}),
                   OpSample("neg", {g.tensor({5, 6}, at::kDouble), -1})};
  });
  db.add("aten::squeeze", "view", [](SampleGen& g) {
    return Samples{OpSample("inner", {g.tensor({8, 1, 4})}), OpSample("outer", {g.tensor({1, 8, 1})})};
  });
  db.add("aten::squeeze.dim", "view", [](SampleGen& g) {
    return Samples{OpSample("col", {g.tensor({8, 1}), 1}), OpSample("noop", {g.tensor({8, 4}), 0}),
                   OpSample("mid_f64", {g.tensor({5, 1, 6}, at::kDouble), 1})};
  });
  db.add("aten::expand", "view", [](SampleGen& g) {
    return Samples{OpSample("col", {g.tensor({8, 1}), IL{8, 4}}), OpSample("new_dim", {g.tensor({4}), IL{8, 4}}),
                   OpSample("minus1", {g.tensor({5, 1}, at::kDouble), IL{-1, 6}})};
  });
  auto view_like = [](SampleGen& g) {
    return Samples{OpSample("flatten", {g.tensor({8, 4}), IL{32}}), OpSample("split", {g.tensor({8, 4}), IL{4, 2, 4}}),
                   OpSample("merge_inner", {g.tensor({4, 2, 4}), IL{4, 8}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{5, 2, 3}}),
                   OpSample("minus1", {g.tensor({8, 4}), IL{-1, 2}}),
                   // Through size-1 dims (a bias gradient summed with keepdim, then viewed).
                   OpSample("drop_ones", {g.tensor({1, 1, 8}), IL{8}}),
                   OpSample("add_ones", {g.tensor({8}), IL{1, 8, 1}})};
  };
  db.add("aten::view", "view", view_like);
  db.add("aten::reshape", "view", view_like);
  db.add("aten::view_as_real", "view", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}, at::kComplexFloat)}),
                   OpSample("uneven", {g.tensor({5, 6}, at::kComplexDouble)})};
  });
  db.add("aten::view_as_complex", "view", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4, 2})}), OpSample("uneven_f64", {g.tensor({5, 6, 2}, at::kDouble)})};
  });
  db.add("aten::_unsafe_view", "view", [](SampleGen& g) {
    return Samples{OpSample("flatten", {g.tensor({8, 4}), IL{32}}), OpSample("split", {g.tensor({8, 4}), IL{4, 2, 4}})};
  });
  db.add("aten::_reshape_alias", "view", [](SampleGen& g) {
    return Samples{OpSample("split", {g.tensor({8, 4}), IL{4, 2, 4}, IL{8, 4, 1}}).no_backward()};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
