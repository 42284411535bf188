// converters/samples/softmax_loss_samples.cpp: samples of _softmax, _log_softmax, their
// backwards, and nll_loss (dtensor/ops/softmax_loss_rules.cpp): every reduction, class
// weights and ignore_index; nll_loss2d alike.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>

namespace dtensor {
namespace testing {
namespace samples {

void add_softmax_loss_samples(OpDb& db) {
  for (const char* op : {"aten::_softmax", "aten::_log_softmax"})
    db.add(op, "softmax", [](SampleGen& g) {
      return Samples{OpSample("last_dim", {g.tensor({8, 6}), -1, false}),
                     OpSample("first_dim", {g.tensor({8, 6}), 0, false}),
                     OpSample("3d_uneven_f64", {g.tensor({3, 5, 6}, at::kDouble), 1, false})};
    });
  // libtorch 2.x only (scaled_dot_product_attention's math path): rows of -inf give 0, not NaN.
  if (c10::Dispatcher::singleton().findSchema({"aten::_safe_softmax", ""}).has_value())
    db.add("aten::_safe_softmax", "softmax", [](SampleGen& g) {
      at::Tensor masked = g.tensor({8, 6});
      masked.select(0, 2).fill_(-std::numeric_limits<float>::infinity());
      return Samples{OpSample("last_dim", {g.tensor({8, 6}), -1}), OpSample("first_dim", {g.tensor({8, 6}), 0}),
                     OpSample("masked_row", {masked, 1}),
                     OpSample("3d_uneven_f64", {g.tensor({3, 5, 6}, at::kDouble), 1})};
    });
  for (const char* op : {"aten::_softmax_backward_data", "aten::_log_softmax_backward_data"})
    db.add(op, "softmax", [](SampleGen& g) {
      return Samples{OpSample("last_dim", {g.tensor({8, 6}), g.tensor({8, 6}).softmax(1), 1, at::kFloat}),
                     OpSample("first_dim", {g.tensor({8, 6}), g.tensor({8, 6}).softmax(0), 0, at::kFloat})};
    });
  // nll_loss_forward(self, target, weight, reduction, ignore_index); reduction: 0 none, 1 mean, 2 sum.
  db.add("aten::nll_loss_forward", "loss", [](SampleGen& g) {
    Samples s;
    const char* names[] = {"none", "mean", "sum"};
    for (int64_t reduction : {0, 1, 2}) {
      const std::string r = names[reduction];
      s.push_back(OpSample(r, {g.tensor({8, 5}).log_softmax(1), g.index({8}, 5), c10::IValue(), reduction, -100}));
      s.push_back(OpSample(r + "_weighted_ignore",
                           {g.tensor({8, 5}).log_softmax(1), g.index({8}, 5), g.positive({5}), reduction, 2}));
    }
    s.push_back(OpSample("uneven_rows", {g.tensor({6, 5}).log_softmax(1), g.index({6}, 5), c10::IValue(), 1, -100}));
    return s;
  });
  db.add("aten::nll_loss_backward", "loss", [](SampleGen& g) {
    Samples s;
    const char* names[] = {"none", "mean", "sum"};
    for (int64_t reduction : {0, 1, 2}) {
      const at::Tensor self = g.tensor({8, 5}).log_softmax(1), target = g.index({8}, 5), weight = g.positive({5});
      const at::Tensor total_weight = std::get<1>(at::nll_loss_forward(self, target, weight, reduction, 2));
      const at::Tensor grad = reduction == 0 ? g.tensor({8}) : g.tensor({});
      s.push_back(OpSample(names[reduction], {grad, self, target, weight, reduction, 2, total_weight}));
    }
    return s;
  });
  // nll_loss2d on [N, C, H, W] scores and [N, H, W] targets (NOTE: [Mean nll_loss stays Partial]).
  db.add("aten::nll_loss2d_forward", "loss", [](SampleGen& g) {
    Samples s;
    const char* names[] = {"none", "mean", "sum"};
    for (int64_t reduction : {0, 1, 2}) {
      const std::string r = names[reduction];
      s.push_back(OpSample(r, {g.tensor({4, 3, 4, 2}).log_softmax(1), g.index({4, 4, 2}, 3), c10::IValue(), reduction, -100}));
      s.push_back(OpSample(r + "_weighted_ignore_uneven", {g.tensor({3, 3, 5, 2}, at::kDouble).log_softmax(1),
                                                           g.index({3, 5, 2}, 3), g.positive({3}, at::kDouble), reduction, 1}));
    }
    return s;
  });
  db.add("aten::nll_loss2d_backward", "loss", [](SampleGen& g) {
    Samples s;
    const char* names[] = {"none", "mean", "sum"};
    for (int64_t reduction : {0, 1, 2}) {
      const at::Tensor self = g.tensor({4, 3, 4, 2}).log_softmax(1), target = g.index({4, 4, 2}, 3),
                       weight = g.positive({3});
      const at::Tensor total_weight = std::get<1>(at::nll_loss2d_forward(self, target, weight, reduction, 1));
      const at::Tensor grad = reduction == 0 ? g.tensor({4, 4, 2}) : g.tensor({});
      s.push_back(OpSample(names[reduction], {grad, self, target, weight, reduction, 1, total_weight}));
    }
    return s;
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
