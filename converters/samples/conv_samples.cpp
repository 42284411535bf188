// converters/samples/conv_samples.cpp: samples of the convolutions (NOTE: [Convolution
// sharding] in dtensor/ops/conv_rules.cpp): 1-D and 2-D, with and without bias, groups,
// strides/padding/dilation, transposed, and batch and channel sizes that do not divide the
// mesh. aten::convolution_backward is checked directly and as the backward of the others.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

#include <array>

namespace dtensor {
namespace testing {
namespace samples {

namespace {

using Ints = std::vector<int64_t>;

// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
OpSample convolution(const char* variant, at::Tensor input, at::Tensor weight, c10::IValue bias, Ints stride,
                     Ints padding, Ints dilation, bool transposed, Ints output_padding, int64_t groups) {
  return OpSample(variant, {std::move(input), std::move(weight), std::move(bias), stride, padding, dilation, transposed,
                            output_padding, groups});
}

}  // namespace

void add_conv_samples(OpDb& db) {
  db.add("aten::convolution", "conv", [](SampleGen& g) {
    return Samples{
        convolution("conv2d", g.tensor({4, 3, 6, 6}), g.tensor({4, 3, 3, 3}), g.tensor({4}), {1, 1}, {1, 1}, {1, 1},
                    false, {0, 0}, 1),
        convolution("conv1d_uneven_f64", g.tensor({5, 3, 7}, at::kDouble), g.tensor({6, 3, 3}, at::kDouble),
                    g.tensor({6}, at::kDouble), {2}, {0}, {1}, false, {0}, 1),
        convolution("groups_no_bias", g.tensor({4, 4, 6, 6}), g.tensor({4, 2, 3, 3}), c10::IValue(), {1, 1}, {0, 0},
                    {2, 2}, false, {0, 0}, 2),
        convolution("transposed", g.tensor({4, 3, 5, 5}), g.tensor({3, 2, 3, 3}), g.tensor({2}), {2, 2}, {1, 1},
                    {1, 1}, true, {1, 1}, 1),
    };
  });
  // convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
  // transposed, output_padding, groups, output_mask)
  db.add("aten::convolution_backward", "conv", [](SampleGen& g) {
    auto sample = [](const char* variant, at::Tensor grad, at::Tensor input, at::Tensor weight, c10::IValue bias_sizes,
                     Ints stride, Ints padding, int64_t groups, std::array<bool, 3> mask) {
      return OpSample(variant, {std::move(grad), std::move(input), std::move(weight), std::move(bias_sizes), stride,
                                padding, Ints(stride.size(), 1), false, Ints(stride.size(), 0), groups,
                                c10::List<bool>({mask[0], mask[1], mask[2]})});
    };
    return Samples{
        sample("conv2d", g.tensor({4, 4, 6, 6}), g.tensor({4, 3, 6, 6}), g.tensor({4, 3, 3, 3}), Ints{4}, {1, 1}, {1, 1},
               1, {true, true, true}),
        sample("conv1d_uneven_f64", g.tensor({5, 6, 3}, at::kDouble), g.tensor({5, 3, 7}, at::kDouble),
               g.tensor({6, 3, 3}, at::kDouble), Ints{6}, {2}, {0}, 1, {true, true, true}),
        sample("groups_input_grad_only", g.tensor({4, 4, 4, 4}), g.tensor({4, 4, 6, 6}), g.tensor({4, 2, 3, 3}),
               c10::IValue(), {1, 1}, {0, 0}, 2, {true, false, false}),
    };
  });
  db.add("aten::conv2d", "conv", [](SampleGen& g) {
    return Samples{
        OpSample("bias", {g.tensor({4, 3, 6, 6}), g.tensor({8, 3, 3, 3}), g.tensor({8})}).kw("padding", 1),
        OpSample("stride_uneven_f64", {g.tensor({3, 2, 7, 5}, at::kDouble), g.tensor({5, 2, 3, 3}, at::kDouble)})
            .kw("stride", 2),
    };
  });
  db.add("aten::conv1d", "conv", [](SampleGen& g) {
    return Samples{
        OpSample("bias", {g.tensor({4, 3, 8}), g.tensor({4, 3, 3}), g.tensor({4})}),
        OpSample("dilation_groups", {g.tensor({4, 4, 9}), g.tensor({6, 2, 3})}).kw("dilation", 2).kw("groups", 2),
    };
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
