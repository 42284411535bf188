// converters/samples/tensor_samples.cpp: samples of the tensor-creating, joining and copying
// ops (*_like, new_*, cat, stack, roll, contiguous, copy_), triu/tril, and the ops that
// return plain values (equal, is_nonzero, item). The indexing ops are in index_samples.cpp.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

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
  // new_*: the same shape as self (the output may follow self's shards) and another shape.
  using IL = std::vector<int64_t>;
  auto new_factory = [](bool values, std::vector<c10::IValue> extra) {
    return [values, extra](SampleGen& g) {
      auto args = [&](at::Tensor self, IL size) {
        std::vector<c10::IValue> a{self, size};
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
      };
      Samples s{OpSample("same_shape", args(g.tensor({8, 4}), {8, 4})), OpSample("other_shape", args(g.tensor({8, 4}), {3, 5})),
                OpSample("uneven_f64", args(g.tensor({5, 6}, at::kDouble), {5, 6})),
                OpSample("to_int", args(g.tensor({8, 4}), {8, 4})).kw("dtype", at::kLong)};
      for (auto& x : s) values ? x.no_backward() : x.shape_only();
      return s;
    };
  };
  db.add("aten::new_zeros", "tensor", new_factory(true, {}));
  db.add("aten::new_ones", "tensor", new_factory(true, {}));
  db.add("aten::new_full", "tensor", new_factory(true, {2.5}));
  db.add("aten::new_empty", "tensor", new_factory(false, {}));
  db.add("aten::new_empty_strided", "tensor", [](SampleGen& g) {
    return Samples{OpSample("same_shape", {g.tensor({8, 4}), IL{8, 4}, IL{4, 1}}).shape_only(),
                   OpSample("transposed_f64", {g.tensor({5, 6}, at::kDouble), IL{6, 5}, IL{1, 6}}).shape_only()};
  });

  // ---- joining ----
  using TL = std::vector<at::Tensor>;
  db.add("aten::cat", "tensor", [](SampleGen& g) {
    return Samples{OpSample("rows", {TL{g.tensor({8, 4}), g.tensor({8, 4})}, 0}),
                   OpSample("cols_three", {TL{g.tensor({8, 4}), g.tensor({8, 2}), g.tensor({8, 4})}, -1}),
                   OpSample("uneven_f64", {TL{g.tensor({5, 6}, at::kDouble), g.tensor({3, 6}, at::kDouble)}, 0}),
                   OpSample("legacy_empty", {TL{g.tensor({8, 4}), g.tensor({0}), g.tensor({8, 4})}, 1})};
  });
  db.add("aten::stack", "tensor", [](SampleGen& g) {
    return Samples{OpSample("front", {TL{g.tensor({8, 4}), g.tensor({8, 4})}, 0}),
                   OpSample("back", {TL{g.tensor({8, 4}), g.tensor({8, 4})}, -1}),
                   OpSample("mid_f64", {TL{g.tensor({5, 6}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                           g.tensor({5, 6}, at::kDouble)},
                                        1})};
  });

  // ---- reordering ----
  db.add("aten::roll", "tensor", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), IL{2}, IL{0}}), OpSample("both", {g.tensor({8, 4}), IL{1, -1}, IL{0, 1}}),
                   OpSample("flat_f64", {g.tensor({5, 6}, at::kDouble), IL{3}})};
  });
  // contiguous(memory_format) reaches the rules as clone(memory_format).
  db.add("aten::contiguous", "tensor", [](SampleGen& g) {
    return Samples{OpSample("channels_last", {g.tensor({2, 4, 4, 2})}).kw("memory_format", at::MemoryFormat::ChannelsLast),
                   OpSample("transposed_f64", {g.tensor({6, 5}, at::kDouble).t()})};
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
  // libtorch 2.x only: masked_scatter's gradient of source, of source's sizes (numel >= the
  // mask's count).
  if (c10::Dispatcher::singleton().findSchema({"aten::masked_scatter_backward", ""}).has_value())
    db.add("aten::masked_scatter_backward", "tensor", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}), g.boolean({8, 4}), IL{8, 4}}),
                     OpSample("broadcast_mask", {g.tensor({8, 4}), g.boolean({4}), IL{40}})};
    });
  db.add("aten::nonzero", "tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.boolean({8, 4})}), OpSample("int", {g.index({5, 6}, 3)})};
  });
  db.add("aten::_unique", "tensor", [](SampleGen& g) {
    return Samples{OpSample("sorted_inverse", {g.index({8, 4}, 5), true, true}), OpSample("1d", {g.index({7}, 3)})};
  });
  // Causal masks: the last two dims are position-dependent.
  for (const char* op : {"aten::triu", "aten::tril", "aten::triu_", "aten::tril_"})
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
