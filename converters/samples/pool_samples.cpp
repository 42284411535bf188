// converters/samples/pool_samples.cpp: samples of pooling, unpooling, upsampling and grid
// sampling (NOTE: [Pooling keeps the leading dims' shards] in dtensor/ops/pool_rules.cpp), 1-D to
// 3-D, batched and unbatched, with batch and channel sizes that do not divide the mesh. Each
// backward op has samples of its own (arguments made by its forward op on the same values) and
// is also checked as the backward of its forward op.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <tuple>

namespace dtensor {
namespace testing {
namespace samples {

namespace {

using Ints = std::vector<int64_t>;

void add(OpDb& db, const std::string& op, SampleFn fn) {
  if (c10::Dispatcher::singleton().findSchema({op, ""}).has_value()) db.add(op, "pool", std::move(fn));
}

// Inputs of k spatial dims: even (batch 4, 3 channels), uneven float64 (batch 5, 2 channels)
// and unbatched (3 channels, 2-D only). Sizes 6 (and 5 for the uneven one) per spatial dim. The
// 3-D ops and the ops of several tensors (backward ops, unpooling, grid sampling) get the even
// one only: on a 2-D mesh the pairwise covering design of three 5-dim tensors runs thousands of
// combinations per sample (the op suite's time), and the backward ops are also checked as their
// forward ops' backward, uneven shapes included. Their samples are forward only (no double
// backward), and on 1-D meshes only (backward_op_samples).
struct Input {
  const char* variant;
  at::Tensor x;
};
std::vector<Input> inputs(SampleGen& g, int64_t k, bool backward_op = false) {
  auto shape = [k](Ints lead, int64_t side) {
    for (int64_t i = 0; i < k; ++i) lead.push_back(side);
    return lead;
  };
  std::vector<Input> in{{"even", g.tensor(shape({4, 3}, 6))}};
  if (backward_op || k == 3) return in;
  in.push_back({"uneven_f64", g.tensor(shape({5, 2}, 5), at::kDouble)});
  if (k == 2) in.push_back({"unbatched", g.tensor(shape({3}, 6))});
  return in;
}

Ints rep(int64_t k, int64_t v) { return Ints(static_cast<size_t>(k), v); }

// A backward op's own samples: forward only, and on 1-D meshes only. On a 2-D mesh its forward
// op's gradient check calls it on the same layouts, and its own three 4- or 5-dim tensors would
// take the pairwise covering design's ~260 combinations per sample there.
void backward_op_samples(Samples& s) {
  for (auto& sample : s) sample.no_backward().only_1d("a backward op, checked on 2-D meshes as its forward op's gradient");
}

void add_pooling(OpDb& db, int64_t k) {
  const std::string d = std::to_string(k) + "d";
  // max_pool{k}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
  add(db, "aten::max_pool" + d + "_with_indices", [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k)) s.push_back(OpSample(in.variant, {in.x, rep(k, 2)}));
    if (k == 2)
      s.push_back(OpSample("k3_s2_pad1_ceil", {g.tensor({4, 3, 5, 5}), rep(k, 3), rep(k, 2), rep(k, 1), rep(k, 1), true}));
    return s;
  });
  // ..._backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)
  add(db, "aten::max_pool" + d + "_with_indices_backward", [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      auto fwd = k == 2 ? at::max_pool2d_with_indices(in.x, rep(k, 2), rep(k, 2))
                        : at::max_pool3d_with_indices(in.x, rep(k, 2), rep(k, 2));
      s.push_back(OpSample(in.variant, {g.tensor(std::get<0>(fwd).sizes().vec(), in.x.scalar_type()), in.x, rep(k, 2),
                                        rep(k, 2), rep(k, 0), rep(k, 1), false, std::get<1>(fwd)}));
    }
    backward_op_samples(s);
    return s;
  });
  // adaptive_max_pool{k}d(self, output_size) and its backward(grad_output, self, indices).
  add(db, "aten::adaptive_max_pool" + d, [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k)) s.push_back(OpSample(in.variant, {in.x, rep(k, 3)}));
    return s;
  });
  add(db, "aten::adaptive_max_pool" + d + "_backward", [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      auto fwd = k == 2 ? at::adaptive_max_pool2d(in.x, rep(k, 3)) : at::adaptive_max_pool3d(in.x, rep(k, 3));
      s.push_back(OpSample(in.variant, {g.tensor(std::get<0>(fwd).sizes().vec(), in.x.scalar_type()), in.x,
                                        std::get<1>(fwd)}));
    }
    backward_op_samples(s);
    return s;
  });
  // fractional_max_pool{k}d(self, kernel_size, output_size, random_samples (N, C, k) in [0, 1))
  auto random_samples = [k](SampleGen& g, const at::Tensor& x) {
    const int64_t n = x.dim() == k + 2 ? x.size(0) : 1, c = x.size(x.dim() - k - 1);
    return g.tensor({n, c, k}, x.scalar_type(), 0.0, 1.0);
  };
  add(db, "aten::fractional_max_pool" + d, [k, random_samples](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k)) s.push_back(OpSample(in.variant, {in.x, rep(k, 2), rep(k, 3), random_samples(g, in.x)}));
    return s;
  });
  // ..._backward(grad_output, self, kernel_size, output_size, indices)
  add(db, "aten::fractional_max_pool" + d + "_backward", [k, random_samples](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      auto fwd = k == 2 ? at::fractional_max_pool2d(in.x, rep(k, 2), rep(k, 3), random_samples(g, in.x))
                        : at::fractional_max_pool3d(in.x, rep(k, 2), rep(k, 3), random_samples(g, in.x));
      s.push_back(OpSample(in.variant, {g.tensor(std::get<0>(fwd).sizes().vec(), in.x.scalar_type()), in.x, rep(k, 2),
                                        rep(k, 3), std::get<1>(fwd)}));
    }
    backward_op_samples(s);
    return s;
  });
  // max_unpool2d(self, indices, output_size); max_unpool3d(..., stride, padding): the values and
  // indices of a max pool with kernel 2 and stride 2, back to the input's size.
  add(db, "aten::max_unpool" + d, [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      auto fwd = k == 2 ? at::max_pool2d_with_indices(in.x, rep(k, 2), rep(k, 2))
                        : at::max_pool3d_with_indices(in.x, rep(k, 2), rep(k, 2));
      const Ints size(in.x.sizes().end() - k, in.x.sizes().end());
      OpSample sample(in.variant, {std::get<0>(fwd), std::get<1>(fwd), size});
      if (k == 3) {
        sample.args.push_back(rep(k, 2));
        sample.args.push_back(rep(k, 0));
      }
      s.push_back(std::move(sample));
    }
    return s;
  });
  // avg_pool{k}d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
  add(db, "aten::avg_pool" + d, [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k)) s.push_back(OpSample(in.variant, {in.x, rep(k, 2)}));
    if (k > 1)
      s.push_back(OpSample("pad_no_count_divisor", {inputs(g, k)[0].x, rep(k, 3), rep(k, 2), rep(k, 1), true, false})
                      .kw("divisor_override", k == 2 ? 5 : 7));
    return s;
  });
  add(db, "aten::avg_pool" + d + "_backward", [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      const at::Tensor out = k == 2 ? at::avg_pool2d(in.x, rep(k, 2)) : at::avg_pool3d(in.x, rep(k, 2));
      s.push_back(OpSample(in.variant, {g.tensor(out.sizes().vec(), in.x.scalar_type()), in.x, rep(k, 2), rep(k, 2),
                                        rep(k, 0), false, true, c10::IValue()}));
    }
    backward_op_samples(s);
    return s;
  });
  // _adaptive_avg_pool{k}d(self, output_size) and its backward(grad_output, self)
  add(db, "aten::_adaptive_avg_pool" + d, [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k)) s.push_back(OpSample(in.variant, {in.x, rep(k, 4)}));
    return s;
  });
  add(db, "aten::_adaptive_avg_pool" + d + "_backward", [k](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      Ints out = in.x.sizes().vec();
      for (int64_t i = 0; i < k; ++i) out[out.size() - 1 - static_cast<size_t>(i)] = 4;
      s.push_back(OpSample(in.variant, {g.tensor(out, in.x.scalar_type()), in.x}));
    }
    backward_op_samples(s);
    return s;
  });
}

// upsample_*(self, output_size, [align_corners,] scales...) and their backward(grad_output,
// output_size, input_size, [align_corners,] scales...).
void add_upsampling(OpDb& db, const std::string& name, int64_t k, bool align_corners) {
  add(db, "aten::" + name, [k, align_corners](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k)) {
      if (std::string(in.variant) == "unbatched") continue;  // upsampling takes (N, C, *spatial)
      OpSample sample(in.variant, {in.x, rep(k, 9)});
      if (align_corners) sample.args.push_back(std::string(in.variant) == "even");
      s.push_back(std::move(sample));
    }
    return s;
  });
  add(db, "aten::" + name + "_backward", [k, align_corners](SampleGen& g) {
    Samples s;
    for (auto& in : inputs(g, k, /*backward_op=*/true)) {
      if (std::string(in.variant) == "unbatched") continue;
      Ints out = in.x.sizes().vec();
      for (int64_t i = 0; i < k; ++i) out[out.size() - 1 - static_cast<size_t>(i)] = 9;
      OpSample sample(in.variant, {g.tensor(out, in.x.scalar_type()), rep(k, 9), in.x.sizes().vec()});
      if (align_corners) sample.args.push_back(false);
      s.push_back(std::move(sample));
    }
    backward_op_samples(s);
    return s;
  });
}

}  // namespace

void add_pool_samples(OpDb& db) {
  for (int64_t k : {2, 3}) add_pooling(db, k);
  // The 1-D poolings decompose into the 2-D ones above DTensor.
  auto one_d = [](int64_t size) {
    return [size](SampleGen& g) {
      Samples s;
      for (auto& in : inputs(g, 1)) s.push_back(OpSample(in.variant, {in.x, Ints{size}}));
      return s;
    };
  };
  add(db, "aten::avg_pool1d", one_d(2));
  add(db, "aten::max_pool1d_with_indices", one_d(2));
  add(db, "aten::adaptive_avg_pool1d", one_d(3));
  add(db, "aten::adaptive_max_pool1d", one_d(3));
  for (int64_t k : {1, 2, 3}) {
    const std::string d = std::to_string(k) + "d";
    add_upsampling(db, "upsample_nearest" + d, k, false);
    add_upsampling(db, "_upsample_nearest_exact" + d, k, false);
  }
  add_upsampling(db, "upsample_linear1d", 1, true);
  add_upsampling(db, "upsample_bilinear2d", 2, true);
  add_upsampling(db, "upsample_bicubic2d", 2, true);
  add_upsampling(db, "upsample_trilinear3d", 3, true);
  add_upsampling(db, "_upsample_bilinear2d_aa", 2, true);
  add_upsampling(db, "_upsample_bicubic2d_aa", 2, true);
  add_upsampling(db, "_upsample_lanczos2d_aa", 2, true);  // libtorch 2.x
  // grid_sampler_{2,3}d(input, grid, interpolation_mode, padding_mode, align_corners)
  for (int64_t k : {2, 3}) {
    const std::string d = std::to_string(k) + "d";
    auto grid = [k](SampleGen& g, int64_t n, at::ScalarType dt) {
      Ints shape{n};
      for (int64_t i = 0; i < k; ++i) shape.push_back(3);
      shape.push_back(k);
      return g.tensor(shape, dt, -1.1, 1.1);
    };
    add(db, "aten::grid_sampler_" + d, [k, grid](SampleGen& g) {
      Samples s;
      for (auto& in : inputs(g, k, /*backward_op=*/true)) {
        if (std::string(in.variant) == "unbatched") continue;
        // bilinear, zeros padding; nearest, border padding, aligned corners
        s.push_back(OpSample(in.variant, {in.x, grid(g, in.x.size(0), in.x.scalar_type()), 0, 0, false}));
        if (k == 2)
          s.push_back(OpSample(std::string(in.variant) + "_nearest_border",
                               {in.x, grid(g, in.x.size(0), in.x.scalar_type()), 1, 1, true}));
      }
      return s;
    });
    // ..._backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask)
    add(db, "aten::grid_sampler_" + d + "_backward", [k, grid](SampleGen& g) {
      Samples s;
      for (auto& in : inputs(g, k, /*backward_op=*/true)) {
        if (std::string(in.variant) == "unbatched") continue;
        const at::Tensor gr = grid(g, in.x.size(0), in.x.scalar_type());
        Ints out{in.x.size(0), in.x.size(1)};
        for (int64_t i = 0; i < k; ++i) out.push_back(3);
        s.push_back(OpSample(in.variant, {g.tensor(out, in.x.scalar_type()), in.x, gr, 0, 0, false,
                                          c10::List<bool>({true, true})}));
      }
      backward_op_samples(s);
      return s;
    });
  }
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
