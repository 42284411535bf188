// converters/samples/tensor_samples.cpp: samples of the tensor-creating and copying ops
// (*_like, copy_), triu/tril, and the ops that return plain values (equal, is_nonzero, item).
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace testing {
namespace samples {

void add_tensor_samples(OpDb& db) {
  auto like = [](bool values) {
    return [values](SampleGen& g) {
      Samples s{OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
                OpSample("to_int", {g.tensor({8, 4})}).kw("dtype", at::kLong)};
      if (!values)
        for (auto& x : s) x.shape_only();
      return s;
    };
  };
  db.add("aten::zeros_like", "tensor", like(true));
  db.add("aten::ones_like", "tensor", like(true));
  db.add("aten::empty_like", "tensor", like(false));
  db.add("aten::full_like", "tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 2.5}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), -1})};
  });
  db.add("aten::copy_", "tensor", [](SampleGen& g) {
    return Samples{OpSample("same", {g.tensor({8, 4}), g.tensor({8, 4})}),
                   OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4})}),
                   OpSample("cast", {g.tensor({5, 6}, at::kDouble), g.tensor({5, 6})})};
  });
  db.add("aten::equal", "tensor", [](SampleGen& g) {
    at::Tensor a = g.tensor({8, 4});
    at::Tensor b = a.clone();
    b.index_put_({1, 2}, 9.0);
    return Samples{OpSample("equal", {a, a.clone()}), OpSample("differ", {a, b})};
  });
  db.add("aten::is_nonzero", "tensor", [](SampleGen& g) {
    return Samples{OpSample("one", {g.positive({1})}), OpSample("zero", {at::zeros({1})})};
  });
  db.add("aten::masked_select", "tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.boolean({8, 4})}),
                   OpSample("broadcast_mask", {g.tensor({8, 4}), g.boolean({4})})};
  });
  for (const char* op : {"aten::masked_scatter", "aten::masked_scatter_"})
    db.add(op, "tensor", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}), g.boolean({8, 4}), g.tensor({8, 4})}),
                     OpSample("broadcast_mask", {g.tensor({8, 4}), g.boolean({4}), g.tensor({40})})};
    });
  db.add("aten::nonzero", "tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.boolean({8, 4})}), OpSample("int", {g.index({5, 6}, 3)})};
  });
  // Causal masks: the last two dims are position-dependent.
  for (const char* op : {"aten::triu", "aten::tril"})
    db.add(op, "tensor", [](SampleGen& g) {
      return Samples{OpSample("batched", {g.tensor({2, 4, 4})}), OpSample("diagonal1", {g.tensor({4, 4}), 1}),
                     OpSample("uneven_below", {g.tensor({3, 5, 6}, at::kDouble), -1})};
    });
  db.add("aten::_local_scalar_dense", "tensor", [](SampleGen& g) {
    return Samples{OpSample("one", {g.tensor({1})}).no_backward()};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
