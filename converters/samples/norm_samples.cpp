// converters/samples/norm_samples.cpp: samples of native_layer_norm and its backward
// (dtensor/ops/norm_rules.cpp), with and without affine parameters, over one and two
// normalized dims.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace dtensor {
namespace testing {
namespace samples {

using IL = std::vector<int64_t>;

void add_norm_samples(OpDb& db) {
  const c10::IValue none;
  db.add("aten::native_layer_norm", "norm", [none](SampleGen& g) {
    return Samples{
        OpSample("affine", {g.tensor({8, 6}), IL{6}, g.tensor({6}), g.tensor({6}), 1e-5}),
        OpSample("3d_no_affine", {g.tensor({2, 4, 6}), IL{6}, none, none, 1e-5}),
        OpSample("two_dims_f64", {g.tensor({5, 2, 4}, at::kDouble), IL{2, 4}, g.tensor({2, 4}, at::kDouble), none, 1e-5}),
    };
  });
  // libtorch 2.x: RMSNorm's composite (it decomposes above DTensor).
  if (c10::Dispatcher::singleton().findSchema({"aten::_fused_rms_norm", ""}).has_value())
    db.add("aten::_fused_rms_norm", "norm", [none](SampleGen& g) {
      return Samples{OpSample("affine", {g.tensor({8, 6}), IL{6}, g.tensor({6}), 1e-5}),
                     OpSample("3d_no_weight", {g.tensor({2, 4, 6}), IL{6}, none, none}),
                     OpSample("two_dims_f64", {g.tensor({5, 2, 4}, at::kDouble), IL{2, 4}, g.tensor({2, 4}, at::kDouble), 1e-6})};
    });
  db.add("aten::native_layer_norm_backward", "norm", [](SampleGen& g) {
    // mean and rstd of the input, as the forward gives them: [rows, 1].
    const at::Tensor x = g.tensor({8, 6});
    auto fwd = at::native_layer_norm(x, {6}, {}, {}, 1e-5);
    c10::List<bool> mask;
    for (int k = 0; k < 3; ++k) mask.push_back(true);
    return Samples{OpSample("affine", {g.tensor({8, 6}), x, IL{6}, std::get<1>(fwd), std::get<2>(fwd), g.tensor({6}),
                                       g.tensor({6}), mask})
                       .no_backward()};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
