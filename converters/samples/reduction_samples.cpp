// converters/samples/reduction_samples.cpp: samples of the reductions (sum, nansum, count_nonzero,
// mean, prod, amax/amin, max/min, argmax/argmin, median/nanmedian/mode/kthvalue, all/any, std/var,
// norms, logsumexp), the scans (cumsum, cumprod, logcumsumexp) and the ops their backward formulas
// call (flip, value_selecting_reduction_backward). Each op gets: the whole tensor or one dim of an
// even shape ([8, 4]: both dims divide 4 and 2x2), keepdim, a negative dim, several dims of a 3-D
// tensor, an uneven shape ([5, 6] in float64: 4 ranks leave one shard of each dim empty), and
// integer / bool inputs where the op takes them. Overloads that decompose into another one before
// they reach the DTensor key (std.dim -> std.correction, ...) have samples too: they check the
// decomposition on DTensors.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>
#include <tuple>

namespace dtensor {
namespace testing {
namespace samples {
namespace {

using IL = std::vector<int64_t>;
constexpr double kInf = std::numeric_limits<double>::infinity();
const c10::IValue kNone;

// Integer values with ties, in [-2, 2).
at::Tensor ints(SampleGen& g, std::vector<int64_t> shape) { return g.tensor(std::move(shape), at::kLong); }

// Samples of an op (self, dim, keepdim) reducing one dim: `dim` is an int, or an int list
// when `list` (then two dims at once too).
Samples one_dim(SampleGen& g, bool list) {
  auto d = [list](int64_t x) { return list ? c10::IValue(IL{x}) : c10::IValue(x); };
  Samples s{OpSample("dim0", {g.tensor({8, 4}), d(0)}), OpSample("dim1_keepdim", {g.tensor({8, 4}), d(1), true}),
            OpSample("neg_3d", {g.tensor({2, 4, 6}), d(-1)}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), d(0)}),
            OpSample("uneven_dim1_f64", {g.tensor({5, 6}, at::kDouble), d(1), true})};
  if (list) s.push_back(OpSample("dims_3d", {g.tensor({2, 4, 6}), IL{0, -1}}));
  return s;
}

// one_dim plus an integer input (forward only: no gradient).
Samples one_dim_and_int(SampleGen& g, bool list) {
  Samples s = one_dim(g, list);
  s.push_back(OpSample("int", {ints(g, {8, 4}), list ? c10::IValue(IL{1}) : c10::IValue(int64_t{1})}));
  return s;
}

// Samples of an op reducing the whole tensor (self only).
Samples whole(SampleGen& g) {
  return {OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
          OpSample("3d", {g.tensor({2, 4, 6})})};
}

Samples whole_and_int(SampleGen& g) {
  Samples s = whole(g);
  s.push_back(OpSample("int", {ints(g, {8, 4})}));
  return s;
}

// Shards that are uneven but never empty ([7, 4]: 7 rows on 4 ranks are 2, 2, 2, 1).
OpSample uneven_nonempty(SampleGen& g, c10::IValue dim) {
  return OpSample("uneven_nonempty", {g.tensor({7, 4}), std::move(dim)});
}

// Adds `op` with the samples of `fn` to the reduction family.
void add(OpDb& db, const std::string& op, SampleFn fn) { db.add(op, "reduction", std::move(fn)); }

void add_sum_mean_prod(OpDb& db) {
  add(db, "aten::sum", [](SampleGen& g) {
    Samples s = whole_and_int(g);
    s.push_back(OpSample("bool", {g.boolean({8, 4})}));
    s.push_back(OpSample("dtype_f64", {g.tensor({8, 4})}).kw("dtype", at::kDouble));
    return s;
  });
  add(db, "aten::sum.dim_IntList", [](SampleGen& g) {
    Samples s = one_dim_and_int(g, /*list=*/true);
    s.push_back(OpSample("dtype_f64", {g.tensor({8, 4}), IL{0}}).kw("dtype", at::kDouble));
    s.push_back(OpSample("bool_keepdim", {g.boolean({8, 4}), IL{1}, true}));
    return s;
  });
  add(db, "aten::sum.IntList_out", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), IL{0}}).kw("out", g.tensor({4})),
                   OpSample("dim1_keepdim", {g.tensor({8, 4}), IL{1}, true}).kw("out", g.tensor({8, 1}))};
  });
  add(db, "aten::nansum", [](SampleGen& g) {
    at::Tensor with_nan = g.tensor({8, 4});
    with_nan.index_put_({3, 2}, std::numeric_limits<float>::quiet_NaN());
    Samples s = one_dim_and_int(g, /*list=*/true);
    s.push_back(OpSample("nan_dim0", {with_nan, IL{0}}));
    s.push_back(OpSample("all", {g.tensor({5, 6}, at::kDouble)}));
    return s;
  });
  add(db, "aten::count_nonzero", [](SampleGen& g) {
    auto mixed = g.tensor({8, 4}, at::kLong, 0.0, 2.0);
    return Samples{OpSample("all", {mixed}), OpSample("dim0", {g.tensor({8, 4}, at::kLong, 0.0, 2.0), 0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble).gt(0).to(at::kDouble), 1})};
  });
  add(db, "aten::count_nonzero.dim_IntList", [](SampleGen& g) {
    return Samples{OpSample("dims", {g.tensor({2, 4, 6}, at::kLong, 0.0, 2.0), IL{0, -1}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble).gt(0).to(at::kDouble), IL{0}})};
  });
  add(db, "aten::mean", [](SampleGen& g) {
    Samples s = whole(g);
    s.push_back(OpSample("int_dtype_f64", {ints(g, {8, 4})}).kw("dtype", at::kDouble));
    return s;
  });
  add(db, "aten::mean.dim", [](SampleGen& g) {
    Samples s = one_dim(g, /*list=*/true);
    s.push_back(OpSample("dtype_f64", {g.tensor({8, 4}), IL{1}}).kw("dtype", at::kDouble));
    s.push_back(OpSample("all_none", {g.tensor({8, 4}), kNone}));
    return s;
  });
  add(db, "aten::mean.out", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), IL{0}}).kw("out", g.tensor({4})),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{0}}).kw("out", g.tensor({6}, at::kDouble))};
  });
  // Values in [0.5, 2) keep the products of 32 elements well inside float32.
  add(db, "aten::prod", [](SampleGen& g) {
    return Samples{OpSample("even", {g.positive({8, 4})}), OpSample("uneven_f64", {g.positive({5, 6}, at::kDouble)}),
                   OpSample("signs_3d", {g.tensor({2, 4, 6}, at::kFloat, -1.5, 1.5)}),
                   OpSample("int", {g.tensor({4, 3}, at::kLong, 1.0, 3.0)}),
                   OpSample("int_dtype_f64", {g.tensor({4, 3}, at::kLong, 1.0, 3.0)}).kw("dtype", at::kDouble)};
  });
  add(db, "aten::prod.dim_int", [](SampleGen& g) {
    at::Tensor with_zero = g.positive({8, 4});
    with_zero.index_put_({2, 1}, 0.0);
    return Samples{OpSample("dim0", {g.positive({8, 4}), 0}), OpSample("dim1_keepdim", {g.positive({8, 4}), 1, true}),
                   OpSample("neg_3d", {g.positive({2, 4, 6}), -1}),
                   OpSample("uneven_f64", {g.positive({5, 6}, at::kDouble), 0}),
                   OpSample("int", {g.tensor({8, 4}, at::kLong, 1.0, 3.0), 1}),
                   OpSample("dtype_f64", {g.positive({8, 4}), 0}).kw("dtype", at::kDouble),
                   OpSample("with_zero", {with_zero, 0})};
  });
  add(db, "aten::prod.int_out", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.positive({8, 4}), 1}).kw("out", g.tensor({8}))};
  });
}

// out= overloads served by their functional overload's rule ("aten::sum" serves sum.out):
// the out tensor keeps its placements, so some combinations are refused (Partial out tensors
// of a reduction that cannot keep them Partial) and the others must match.
void add_out_overloads(OpDb& db) {
  add(db, "aten::sum.out", [](SampleGen& g) { return Samples{OpSample("even", {g.tensor({8, 4})}).kw("out", g.tensor({}))}; });
  add(db, "aten::prod.out", [](SampleGen& g) {
    return Samples{OpSample("even", {g.positive({8, 4})}).kw("out", g.tensor({}))};
  });
  add(db, "aten::amax.out", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), IL{0}}).kw("out", g.tensor({4}))};
  });
  add(db, "aten::argmax.out", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.tensor({8, 4}), 1}).kw("out", g.index({8}, 4))};
  });
  add(db, "aten::logsumexp.out", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.tensor({8, 4}), IL{1}}).kw("out", g.tensor({8}))};
  });
  add(db, "aten::linalg_vector_norm.out", [](SampleGen& g) {
    return Samples{OpSample("p1_dim0", {g.tensor({8, 4}), 1.0, IL{0}}).kw("out", g.tensor({4}))};
  });
}

void add_extrema(OpDb& db) {
  for (const char* op : {"aten::amax", "aten::amin"}) {
    add(db, op, [](SampleGen& g) {
      Samples s = one_dim_and_int(g, /*list=*/true);
      s.push_back(OpSample("all", {g.tensor({8, 4}), IL{}}));
      s.push_back(OpSample("all_uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{}}));
      s.push_back(uneven_nonempty(g, IL{0}));
      s.push_back(OpSample("bool", {g.boolean({8, 4}), IL{0}}));
      return s;
    });
  }
  for (const char* op : {"aten::max", "aten::min"}) {
    add(db, op, [](SampleGen& g) {
      Samples s = whole_and_int(g);
      s.push_back(OpSample("uneven_nonempty", {g.tensor({7, 4})}));
      s.push_back(OpSample("bool", {g.boolean({8, 4})}));
      return s;
    });
  }
  for (const char* op : {"aten::max.dim", "aten::min.dim"}) {
    add(db, op, [](SampleGen& g) { return one_dim_and_int(g, /*list=*/false); });
  }
  // dim None: the index into the flattened tensor.
  for (const char* op : {"aten::argmax", "aten::argmin"}) {
    add(db, op, [](SampleGen& g) {
      Samples s = one_dim_and_int(g, /*list=*/false);
      s.push_back(OpSample("all", {g.tensor({8, 4}), kNone}));
      s.push_back(OpSample("all_uneven_f64", {g.tensor({5, 6}, at::kDouble), kNone}));
      return s;
    });
  }
  // The gradient of max/min.dim: grad and indices have the forward's output shape. Forward
  // only: on DTensors the op runs as a unit below autograd (NOTE: [Composite ops run whole]).
  add(db, "aten::value_selecting_reduction_backward", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.tensor({8}), 1, g.index({8}, 4), IL{8, 4}, false}).no_backward(),
                   OpSample("dim0_keepdim", {g.tensor({1, 4}), 0, g.index({1, 4}, 8), IL{8, 4}, true}).no_backward(),
                   OpSample("neg_3d", {g.tensor({2, 4}), -1, g.index({2, 4}, 6), IL{2, 4, 6}, false}).no_backward(),
                   OpSample("uneven_f64", {g.tensor({6}, at::kDouble), 0, g.index({6}, 5), IL{5, 6}, false})
                       .no_backward()};
  });
}

void add_logical(OpDb& db) {
  // Integers in [0, 2) make all() and any() differ across rows.
  auto mixed = [](SampleGen& g, std::vector<int64_t> shape) { return g.tensor(std::move(shape), at::kLong, 0.0, 2.0); };
  for (const char* op : {"aten::all", "aten::any"}) {
    add(db, op, [mixed](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
                     OpSample("int", {mixed(g, {8, 4})}), OpSample("bool", {g.boolean({8, 4})})};
    });
  }
  for (const char* op : {"aten::all.dim", "aten::any.dim"}) {
    add(db, op, [mixed](SampleGen& g) {
      return Samples{OpSample("dim0", {mixed(g, {8, 4}), 0}), OpSample("dim1_keepdim", {mixed(g, {8, 4}), 1, true}),
                     OpSample("neg_3d", {mixed(g, {2, 4, 6}), -1}),
                     OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 0}),
                     OpSample("bool", {g.boolean({8, 4}), 1})};
    });
  }
  // all.dims / any.dims (libtorch 2.x): a list of dims, or none (every dim).
  for (const char* op : {"aten::all.dims", "aten::any.dims"}) {
    if (!c10::Dispatcher::singleton().findSchema({std::string(op).substr(0, 9), "dims"}).has_value()) continue;
    add(db, op, [mixed](SampleGen& g) {
      return Samples{OpSample("dims01_3d", {mixed(g, {2, 4, 6}), IL{0, 1}}),
                     OpSample("dim1_keepdim", {mixed(g, {8, 4}), IL{1}, true}),
                     OpSample("every_dim_f64", {g.tensor({5, 6}, at::kDouble), c10::IValue()})};
    });
  }
  for (const char* op : {"aten::all.out", "aten::any.out"}) {
    add(db, op, [mixed](SampleGen& g) {
      return Samples{OpSample("dim0", {mixed(g, {8, 4}), 0}).kw("out", g.boolean({4}))};
    });
  }
  for (const char* op : {"aten::all.all_out", "aten::any.all_out"}) {
    add(db, op, [mixed](SampleGen& g) { return Samples{OpSample("even", {mixed(g, {8, 4})}).kw("out", g.boolean({}))}; });
  }
}

void add_moments(OpDb& db) {
  // The overloads that reach the DTensor key.
  for (const char* op : {"aten::std.correction", "aten::var.correction", "aten::std_mean.correction",
                         "aten::var_mean.correction"}) {
    add(db, op, [](SampleGen& g) {
      // correction None is the default (1).
      return Samples{OpSample("dim1", {g.tensor({8, 4}), IL{1}}).kw("correction", kNone),
                     OpSample("dim0_correction0", {g.tensor({8, 4}), IL{0}}).kw("correction", 0),
                     OpSample("all", {g.tensor({8, 4}), kNone}).kw("correction", kNone),
                     OpSample("dims_3d_keepdim", {g.tensor({2, 4, 6}), IL{0, -1}}).kw("correction", 2).kw("keepdim", true),
                     OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{0}}).kw("correction", kNone)};
    });
  }
  // The overloads that decompose into them.
  for (const char* op : {"aten::std", "aten::var", "aten::std_mean", "aten::var_mean"}) {
    add(db, op, [](SampleGen& g) {
      return Samples{OpSample("unbiased", {g.tensor({8, 4})}), OpSample("biased_f64", {g.tensor({5, 6}, at::kDouble), false})};
    });
  }
  for (const char* op : {"aten::std.dim", "aten::var.dim", "aten::std_mean.dim", "aten::var_mean.dim"}) {
    add(db, op, [](SampleGen& g) {
      return Samples{OpSample("dim1", {g.tensor({8, 4}), IL{1}}),
                     OpSample("dim0_biased_keepdim", {g.tensor({8, 4}), IL{0}, false, true}),
                     OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{-1}})};
    });
  }
}

void add_norms(OpDb& db) {
  add(db, "aten::norm.Scalar", [](SampleGen& g) {
    return Samples{OpSample("p2", {g.tensor({8, 4})}), OpSample("p1", {g.tensor({8, 4}), 1.0}),
                   OpSample("pinf", {g.tensor({8, 4}), kInf}), OpSample("p2_uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
                   OpSample("pinf_uneven_f64", {g.tensor({5, 6}, at::kDouble), kInf})};
  });
  add(db, "aten::norm.ScalarOpt_dim", [](SampleGen& g) {
    return Samples{OpSample("p2_dim1", {g.tensor({8, 4}), 2.0, IL{1}}),
                   OpSample("p1_dim0_keepdim", {g.tensor({8, 4}), 1.0, IL{0}, true}),
                   OpSample("pinf_dim0", {g.tensor({8, 4}), kInf, IL{0}}),
                   OpSample("pinf_uneven_nonempty", {g.tensor({7, 4}), kInf, IL{0}}),
                   OpSample("p3_dims_3d", {g.tensor({2, 4, 6}), 3.0, IL{0, -1}}),
                   OpSample("p1_uneven_f64", {g.tensor({5, 6}, at::kDouble), 1.0, IL{0}}),
                   OpSample("pnone_uneven_f64", {g.tensor({5, 6}, at::kDouble), kNone, IL{1}})};
  });
  add(db, "aten::norm.ScalarOpt_dtype", [](SampleGen& g) {
    return Samples{OpSample("p2_f64", {g.tensor({8, 4}), 2.0}).kw("dtype", at::kDouble),
                   OpSample("p1_f64", {g.tensor({8, 4}), 1.0}).kw("dtype", at::kDouble)};
  });
  add(db, "aten::norm.ScalarOpt_dim_dtype", [](SampleGen& g) {
    return Samples{OpSample("p1_dim0_f64", {g.tensor({8, 4}), 1.0, IL{0}, false}).kw("dtype", at::kDouble),
                   OpSample("pinf_dim1_f64", {g.tensor({8, 4}), kInf, IL{1}, true}).kw("dtype", at::kDouble)};
  });
  add(db, "aten::linalg_vector_norm", [](SampleGen& g) {
    return Samples{OpSample("p2", {g.tensor({8, 4})}),
                   OpSample("p1_dim1", {g.tensor({8, 4}), 1.0, IL{1}}),
                   OpSample("pinf_dim0_keepdim", {g.tensor({8, 4}), kInf, IL{0}, true}),
                   OpSample("pneginf", {g.tensor({8, 4}), -kInf}),
                   OpSample("p0_dim0", {g.tensor({8, 4}), 0.0, IL{0}}),
                   OpSample("p2_dims_3d", {g.tensor({2, 4, 6}), 2.0, IL{-1, 0}}),
                   OpSample("pinf_uneven_f64", {g.tensor({5, 6}, at::kDouble), kInf, IL{0}}),
                   OpSample("p1_uneven_f64", {g.tensor({5, 6}, at::kDouble), 1.0}),
                   OpSample("p2_dtype_f64", {g.tensor({8, 4}), 2.0, IL{1}}).kw("dtype", at::kDouble)};
  });
  // libtorch 2.15: sum of |x|^p over dims (vector norms' inner part).
  if (c10::Dispatcher::singleton().findSchema({"aten::linalg__powsum", ""}).has_value())
    add(db, "aten::linalg__powsum", [](SampleGen& g) {
      return Samples{OpSample("p2", {g.tensor({8, 4})}),
                     OpSample("p3_dim1", {g.tensor({8, 4}), 3.0, IL{1}}),
                     OpSample("p0_dim0_keepdim", {g.tensor({8, 4}), 0.0, IL{0}, true}),
                     OpSample("pinf_uneven_f64", {g.tensor({5, 6}, at::kDouble), kInf, IL{0}}),
                     OpSample("pneginf_dim1", {g.tensor({8, 4}), -kInf, IL{1}}),
                     OpSample("p1_dims_3d", {g.tensor({2, 4, 6}), 1.0, IL{-1, 0}})};
    });
  add(db, "aten::logsumexp", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.tensor({8, 4}), IL{1}}), OpSample("dim0_keepdim", {g.tensor({8, 4}), IL{0}, true}),
                   OpSample("dims_3d", {g.tensor({2, 4, 6}), IL{0, -1}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{0}})};
  });
}

void add_scans(OpDb& db) {
  add(db, "aten::cumsum", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), 0}), OpSample("dim1", {g.tensor({8, 4}), 1}),
                   OpSample("neg_3d", {g.tensor({2, 4, 6}), -1}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 0}),
                   OpSample("int", {ints(g, {8, 4}), 1}),
                   OpSample("dtype_f64", {g.tensor({8, 4}), 1}).kw("dtype", at::kDouble)};
  });
  add(db, "aten::cumprod", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.positive({8, 4}), 0}), OpSample("dim1", {g.positive({8, 4}), 1}),
                   OpSample("neg_3d", {g.positive({2, 4, 6}), -1}),
                   OpSample("uneven_f64", {g.positive({5, 6}, at::kDouble), 1}),
                   OpSample("int", {g.tensor({8, 4}, at::kLong, 1.0, 3.0), 0})};
  });
  for (const char* op : {"aten::cumsum_", "aten::cumprod_"}) {
    add(db, op, [](SampleGen& g) {
      return Samples{OpSample("dim0", {g.positive({8, 4}), 0}), OpSample("uneven_f64", {g.positive({5, 6}, at::kDouble), 1})};
    });
  }
  for (const char* op : {"aten::logcumsumexp", "aten::_logcumsumexp"}) {
    add(db, op, [](SampleGen& g) {
      return Samples{OpSample("dim0", {g.tensor({8, 4}), 0}), OpSample("neg_3d", {g.tensor({2, 4, 6}), -1}),
                     OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 1})};
    });
  }
  // Distinct values (a permutation), so that the indices of sort / topk are unique.
  auto distinct = [](SampleGen& g, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return (at::randperm(n, at::detail::createCPUGenerator(g.seed()), at::kLong).to(at::kFloat) / 7 - 2).reshape(shape);
  };
  for (const char* op : {"aten::cummax", "aten::cummin"})
    add(db, op, [distinct](SampleGen& g) {
      return Samples{OpSample("dim0", {distinct(g, {8, 4}), 0}), OpSample("neg_3d", {distinct(g, {2, 4, 6}), -1}),
                     OpSample("uneven", {distinct(g, {5, 6}), 1})};
    });
  // cummaxmin_backward(grad, input, indices, dim): the indices of cummax on the input. Forward
  // only: on DTensors the op runs as a unit below autograd (NOTE: [Composite ops run whole]).
  add(db, "aten::cummaxmin_backward", [distinct](SampleGen& g) {
    Samples s;
    for (auto [variant, shape, dim] : {std::make_tuple("dim0", IL{8, 4}, int64_t{0}),
                                       std::make_tuple("neg_3d", IL{2, 4, 6}, int64_t{-1})}) {
      const at::Tensor input = distinct(g, shape);
      s.push_back(OpSample(variant, {g.tensor(shape), input, std::get<1>(at::cummax(input, dim)), dim}).no_backward());
    }
    return s;
  });
  add(db, "aten::sort", [distinct](SampleGen& g) {
    return Samples{OpSample("dim1", {distinct(g, {8, 4}), 1}), OpSample("dim0_desc", {distinct(g, {8, 4}), 0, true}),
                   OpSample("neg_3d", {distinct(g, {2, 4, 6}), -1}),
                   OpSample("uneven_f64", {distinct(g, {5, 6}).to(at::kDouble), 0})};
  });
  add(db, "aten::sort.stable", [distinct](SampleGen& g) {
    return Samples{OpSample("dim0", {distinct(g, {8, 4})}).kw("stable", true).kw("dim", 0),
                   OpSample("last_3d", {distinct(g, {2, 4, 6})}).kw("stable", true)};
  });
  add(db, "aten::topk", [distinct](SampleGen& g) {
    return Samples{OpSample("k2_dim1", {distinct(g, {8, 4}), 2, 1}), OpSample("k3_dim0_smallest", {distinct(g, {8, 4}), 3, 0, false}),
                   OpSample("last_3d", {distinct(g, {2, 4, 6}), 4}),
                   OpSample("uneven_f64", {distinct(g, {5, 6}).to(at::kDouble), 2, 0})};
  });
  // Order statistics: distinct values (unique medians and k-th values, and their indices);
  // mode gets few distinct values, so that the most frequent one is not just the smallest.
  for (const char* op : {"aten::median.dim", "aten::nanmedian.dim"})
    add(db, op, [distinct](SampleGen& g) {
      return Samples{OpSample("dim1", {distinct(g, {8, 5}), 1}), OpSample("dim0_keepdim", {distinct(g, {7, 4}), 0, true}),
                     OpSample("neg_3d", {distinct(g, {2, 4, 6}), -1}),
                     OpSample("uneven_f64", {distinct(g, {5, 6}).to(at::kDouble), 0})};
    });
  for (const char* op : {"aten::median", "aten::nanmedian"})
    add(db, op, [distinct](SampleGen& g) {
      return Samples{OpSample("even", {distinct(g, {8, 5})}), OpSample("3d", {distinct(g, {2, 4, 6})}),
                     OpSample("uneven_f64", {distinct(g, {5, 7}).to(at::kDouble)})};
    });
  add(db, "aten::kthvalue", [distinct](SampleGen& g) {
    return Samples{OpSample("k2_dim1", {distinct(g, {8, 5}), 2, 1}), OpSample("k3_dim0_keepdim", {distinct(g, {8, 4}), 3, 0, true}),
                   OpSample("last_3d", {distinct(g, {2, 4, 6}), 4}),
                   OpSample("uneven_f64", {distinct(g, {5, 6}).to(at::kDouble), 1, 0})};
  });
  add(db, "aten::mode", [](SampleGen& g) {
    auto repeats = [&](std::vector<int64_t> shape, at::ScalarType dtype) {
      return g.index(std::move(shape), 3).to(dtype) * 0.5 - 0.25;
    };
    return Samples{OpSample("dim1", {repeats({8, 6}, at::kFloat), 1}), OpSample("dim0_keepdim", {repeats({8, 4}, at::kFloat), 0, true}),
                   OpSample("last_3d", {repeats({2, 4, 6}, at::kFloat)}),
                   OpSample("uneven_f64", {repeats({5, 6}, at::kDouble), 0})};
  });
  add(db, "aten::flip", [](SampleGen& g) {
    return Samples{OpSample("dim0", {g.tensor({8, 4}), IL{0}}), OpSample("neg", {g.tensor({8, 4}), IL{-1}}),
                   OpSample("dims_3d", {g.tensor({2, 4, 6}), IL{0, 2}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{1}}), OpSample("int", {ints(g, {8, 4}), IL{0}})};
  });
}

}  // namespace

void add_reduction_samples(OpDb& db) {
  add_sum_mean_prod(db);
  add_out_overloads(db);
  add_extrema(db);
  add_logical(db);
  add_moments(db);
  add_norms(db);
  add_scans(db);
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
