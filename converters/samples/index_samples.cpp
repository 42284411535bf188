// converters/samples/index_samples.cpp: samples of the indexing ops (index_select, gather, the
// scatter family, index_add, index.Tensor and index_put with long indices and bool masks),
// family "tensor". Index tensors are int64 from SampleGen::index; where an op's result would
// depend on the order of writes to one position (scatter, index_put without accumulate), the
// indices are unique along the written dim (a permutation from argsort).
#include "converters/samples/samples.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace testing {
namespace samples {

namespace {

using IL = std::vector<int64_t>;
using Indices = c10::List<c10::optional<at::Tensor>>;

// Indices in [0, shape[dim]) that never repeat along `dim`: the first `count` entries of a
// random permutation of every line along `dim`.
at::Tensor unique_along(SampleGen& g, std::vector<int64_t> shape, int64_t dim, int64_t count) {
  return g.tensor(shape).argsort(dim).narrow(dim, 0, count).contiguous();
}

Indices indices(std::initializer_list<c10::optional<at::Tensor>> entries) {
  Indices l;
  for (const auto& e : entries) l.push_back(e);
  return l;
}

// A scatter-like op and its in-place form, with the same samples.
void add_both(OpDb& db, const std::string& op, const SampleFn& fn) {
  db.add(op, "tensor", fn);
  const auto dot = op.find('.');
  db.add(dot == std::string::npos ? op + "_" : op.substr(0, dot) + "_" + op.substr(dot), "tensor", fn);
}

}  // namespace

void add_index_samples(OpDb& db) {
  db.add("aten::index_select", "tensor", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({5}, 8)}),
                   OpSample("cols", {g.tensor({8, 4}), 1, g.index({8}, 4)}),
                   OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), -1, g.index({3}, 6)}),
                   OpSample("scalar_index", {g.tensor({8, 4}), 0, g.index({}, 8)})};
  });
  db.add("aten::gather", "tensor", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({8, 4}, 8)}),
                   OpSample("cols_narrow", {g.tensor({8, 4}), 1, g.index({8, 2}, 4)}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), -1, g.index({5, 6}, 6)}),
                   OpSample("smaller_index", {g.tensor({8, 4}), 0, g.index({4, 4}, 8)})};
  });

  // ---- scatter family (self, dim, index, src | value) ----
  auto scatter_src = [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, unique_along(g, {8, 4}, 0, 8), g.tensor({8, 4})}),
                   OpSample("cols_narrow", {g.tensor({8, 4}), 1, unique_along(g, {8, 4}, 1, 2), g.tensor({8, 2})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), -1, unique_along(g, {5, 6}, 1, 6),
                                           g.tensor({5, 6}, at::kDouble)})};
  };
  add_both(db, "aten::scatter.src", scatter_src);
  add_both(db, "aten::scatter.value", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({3, 4}, 8), 1.5}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 1, g.index({5, 2}, 6), -2})};
  });
  add_both(db, "aten::scatter.reduce", [](SampleGen& g) {
    return Samples{OpSample("add", {g.tensor({8, 4}), 0, g.index({8, 4}, 8), g.tensor({8, 4})}).kw("reduce", std::string("add")),
                   OpSample("multiply_f64", {g.tensor({5, 6}, at::kDouble), 1, g.index({5, 3}, 6), g.tensor({5, 3}, at::kDouble)})
                       .kw("reduce", std::string("multiply"))};
  });
  add_both(db, "aten::scatter.value_reduce", [](SampleGen& g) {
    return Samples{OpSample("add", {g.tensor({8, 4}), 0, g.index({8, 4}, 8), 2}).kw("reduce", std::string("add")),
                   OpSample("multiply_f64", {g.tensor({5, 6}, at::kDouble), 1, g.index({5, 3}, 6), 3})
                       .kw("reduce", std::string("multiply"))};
  });
  add_both(db, "aten::scatter_add", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({8, 4}, 8), g.tensor({8, 4})}),
                   OpSample("cols_narrow", {g.tensor({8, 4}), 1, g.index({8, 2}, 4), g.tensor({8, 2})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 0, g.index({5, 6}, 5), g.tensor({5, 6}, at::kDouble)})};
  });
  add_both(db, "aten::scatter_reduce.two", [](SampleGen& g) {
    return Samples{OpSample("sum", {g.tensor({8, 4}), 0, g.index({8, 4}, 8), g.tensor({8, 4}), std::string("sum")}),
                   OpSample("amax_f64", {g.tensor({5, 6}, at::kDouble), 1, g.index({5, 6}, 6), g.tensor({5, 6}, at::kDouble),
                                         std::string("amax")}),
                   OpSample("mean_no_self", {g.tensor({8, 4}), 0, g.index({8, 4}, 8), g.tensor({8, 4}), std::string("mean")})
                       .kw("include_self", false)};
  });
  add_both(db, "aten::index_add", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({5}, 8), g.tensor({5, 4})}),
                   OpSample("cols_alpha", {g.tensor({8, 4}), 1, g.index({3}, 4), g.tensor({8, 3})}).kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), -1, g.index({6}, 6), g.tensor({5, 6}, at::kDouble)})};
  });

  // index_reduce(self, dim, index, source, reduce, include_self)
  add_both(db, "aten::index_reduce", [](SampleGen& g) {
    return Samples{OpSample("rows_prod", {g.tensor({8, 4}), 0, g.index({5}, 8), g.tensor({5, 4}), std::string("prod")}),
                   OpSample("cols_amax", {g.tensor({8, 4}), 1, g.index({3}, 4), g.tensor({8, 3}), std::string("amax")}),
                   OpSample("mean_exclude_self_f64", {g.tensor({5, 6}, at::kDouble), -1, g.index({6}, 6),
                                                      g.tensor({5, 6}, at::kDouble), std::string("mean")})
                       .kw("include_self", false),
                   OpSample("amin", {g.tensor({8, 4}), 0, g.index({5}, 8), g.tensor({5, 4}), std::string("amin")})};
  });
  // index_fill(self, dim, index, value): a Scalar value, or a 0-dim tensor.
  add_both(db, "aten::index_fill.int_Scalar", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({3}, 8), 1.5}),
                   OpSample("cols_zero", {g.tensor({8, 4}), 1, g.index({2}, 4), 0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), -1, g.index({4}, 6), -2.0})};
  });
  add_both(db, "aten::index_fill.int_Tensor", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, g.index({3}, 8), g.tensor({})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 1, g.index({4}, 6), g.tensor({}, at::kDouble)})};
  });

  // ---- advanced indexing (NOTE: [Advanced indexing layout]) ----
  const c10::optional<at::Tensor> all;  // ':'
  db.add("aten::index.Tensor", "tensor", [all](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), indices({g.index({5}, 8)})}),
                   OpSample("cols", {g.tensor({8, 4}), indices({all, g.index({6}, 4)})}),
                   OpSample("pairs", {g.tensor({8, 4}), indices({g.index({6}, 8), g.index({6}, 4)})}),
                   OpSample("index_2d", {g.tensor({8, 4}), indices({g.index({2, 4}, 8)})}),
                   OpSample("apart", {g.tensor({2, 4, 6}), indices({g.index({4}, 2), all, g.index({4}, 6)})}),
                   OpSample("broadcast", {g.tensor({8, 4}), indices({g.index({4, 1}, 8), g.index({3}, 4)})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), indices({all, g.index({5}, 6)})}),
                   OpSample("mask", {g.tensor({8, 4}), indices({g.boolean({8, 4})})}),
                   OpSample("row_mask", {g.tensor({8, 4}), indices({g.boolean({8})})})};
  });
  // index_put: values have the shape of self[indices] (or broadcast to it).
  auto index_put = [all](SampleGen& g) {
    at::Tensor mask = g.boolean({8, 4});
    const int64_t hits = mask.sum().item<int64_t>();
    return Samples{
        OpSample("rows", {g.tensor({8, 4}), indices({unique_along(g, {8}, 0, 5)}), g.tensor({5, 4})}),
        OpSample("cols", {g.tensor({8, 4}), indices({all, unique_along(g, {4}, 0, 3)}), g.tensor({8, 3})}),
        OpSample("accumulate", {g.tensor({8, 4}), indices({g.index({6}, 8)}), g.tensor({6, 4}), true}),
        OpSample("broadcast_values", {g.tensor({8, 4}), indices({all, unique_along(g, {4}, 0, 2)}), g.tensor({2})}),
        OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), indices({unique_along(g, {5}, 0, 3)}),
                                g.tensor({3, 6}, at::kDouble)}),
        OpSample("mask", {g.tensor({8, 4}), indices({mask}), g.tensor({hits})}),
        OpSample("mask_scalar", {g.tensor({8, 4}), indices({g.boolean({8, 4})}), g.tensor({})})};
  };
  db.add("aten::index_put", "tensor", index_put);
  db.add("aten::index_put_", "tensor", index_put);
  db.add("aten::_index_put_impl_", "tensor", index_put);
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
