// converters/samples/view_samples.cpp: samples of the view ops (t, transpose, permute, movedim,
// (un)squeeze and their in-place forms, expand, repeat, view/reshape/flatten/unflatten,
// split/chunk/unbind, slice/narrow/select, diagonal, as_strided, and the backward ops of
// select, slice and diagonal): sharded dims that survive, move, merge, split or get cut, on
// shapes that divide the mesh and shapes that do not.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>

namespace dtensor {
namespace testing {
namespace samples {

namespace {
using IL = std::vector<int64_t>;

// An op and its in-place form, with the same samples.
void add_both(OpDb& db, const std::string& op, const std::string& inplace, const SampleFn& fn) {
  db.add(op, "view", fn);
  db.add(inplace, "view", fn);
}
}  // namespace

void add_view_samples(OpDb& db) {
  // ---- permutations ----
  add_both(db, "aten::t", "aten::t_", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4})}), OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}),
                   OpSample("1d", {g.tensor({8})})};
  });
  add_both(db, "aten::transpose.int", "aten::transpose_", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 0, 1}), OpSample("3d_neg", {g.tensor({2, 4, 6}), -1, 0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 1, 0})};
  });
  db.add("aten::permute", "view", [](SampleGen& g) {
    return Samples{OpSample("3d", {g.tensor({2, 4, 6}), IL{2, 0, 1}}), OpSample("2d", {g.tensor({8, 4}), IL{1, 0}}),
                   OpSample("uneven_f64", {g.tensor({5, 6, 3}, at::kDouble), IL{1, 2, 0}}),
                   OpSample("neg", {g.tensor({2, 4, 6}), IL{-1, -3, -2}})};
  });
  db.add("aten::movedim.int", "view", [](SampleGen& g) {
    return Samples{OpSample("3d", {g.tensor({2, 4, 6}), 0, 2}), OpSample("neg_f64", {g.tensor({5, 6, 3}, at::kDouble), -1, 0})};
  });
  db.add("aten::movedim.intlist", "view", [](SampleGen& g) {
    return Samples{OpSample("two", {g.tensor({2, 4, 6}), IL{0, 1}, IL{2, 0}}),
                   OpSample("uneven_f64", {g.tensor({5, 6, 3}, at::kDouble), IL{-1}, IL{0}})};
  });

  // ---- adding and removing dims of size 1 ----
  add_both(db, "aten::unsqueeze", "aten::unsqueeze_", [](SampleGen& g) {
    return Samples{OpSample("dim1", {g.tensor({8, 4}), 1}), OpSample("dim0", {g.tensor({8, 4}), 0}),
                   OpSample("neg", {g.tensor({5, 6}, at::kDouble), -1})};
  });
  // [2, 1, 4]: dim 0 split 4 ways has shards of 1 element, which a local squeeze() would drop.
  add_both(db, "aten::squeeze", "aten::squeeze_", [](SampleGen& g) {
    return Samples{OpSample("inner", {g.tensor({8, 1, 4})}), OpSample("outer", {g.tensor({1, 8, 1})}),
                   OpSample("size1_shards", {g.tensor({2, 1, 4})}),
                   OpSample("uneven_f64", {g.tensor({5, 1, 6}, at::kDouble)})};
  });
  // libtorch 2.x: squeeze.dims names several dims (a named dim that is not 1 stays).
  if (c10::Dispatcher::singleton().findSchema({"aten::squeeze", "dims"}).has_value())
    add_both(db, "aten::squeeze.dims", "aten::squeeze_.dims", [](SampleGen& g) {
      return Samples{OpSample("two", {g.tensor({1, 8, 1}), IL{0, 2}}), OpSample("one_of_two", {g.tensor({8, 1, 4}), IL{0, 1}}),
                     OpSample("size1_shards", {g.tensor({2, 1, 4}), IL{-2}}),
                     OpSample("uneven_f64", {g.tensor({5, 1, 6}, at::kDouble), IL{1, 2}})};
    });
  add_both(db, "aten::squeeze.dim", "aten::squeeze_.dim", [](SampleGen& g) {
    return Samples{OpSample("col", {g.tensor({8, 1}), 1}), OpSample("noop", {g.tensor({8, 4}), 0}),
                   OpSample("mid_f64", {g.tensor({5, 1, 6}, at::kDouble), 1}),
                   OpSample("size1_shards_neg", {g.tensor({2, 1, 4}), -2})};
  });

  // ---- broadcasting and tiling ----
  for (const char* op : {"aten::expand", "aten::expand_copy"})
    db.add(op, "view", [](SampleGen& g) {
      return Samples{OpSample("col", {g.tensor({8, 1}), IL{8, 4}}), OpSample("new_dim", {g.tensor({4}), IL{8, 4}}),
                     OpSample("minus1", {g.tensor({5, 1}, at::kDouble), IL{-1, 6}})};
    });
  db.add("aten::expand_as", "view", [](SampleGen& g) {
    return Samples{OpSample("col", {g.tensor({8, 1}), g.tensor({8, 4})}),
                   OpSample("new_dim_f64", {g.tensor({6}, at::kDouble), g.tensor({5, 6}, at::kDouble)})};
  });
  db.add("aten::repeat", "view", [](SampleGen& g) {
    return Samples{OpSample("cols", {g.tensor({8, 4}), IL{1, 2}}), OpSample("new_dims", {g.tensor({4}), IL{2, 1}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{2, 1}}),
                   OpSample("3d", {g.tensor({2, 4, 6}), IL{1, 1, 1, 2}})};
  });

  // ---- view / reshape (NOTE: [Views of uneven shards]) ----
  // flatten [7, 2] -> [14] keeps 4-way shards of 7 rows (2,2,2,1 rows = 4,4,4,2 elements);
  // [5, 6] -> [30] does not (2,2,1,0 rows against 8,8,8,6 elements).
  auto view_like = [](SampleGen& g) {
    return Samples{OpSample("flatten", {g.tensor({8, 4}), IL{32}}), OpSample("split", {g.tensor({8, 4}), IL{4, 2, 4}}),
                   OpSample("merge_inner", {g.tensor({4, 2, 4}), IL{4, 8}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{5, 2, 3}}),
                   OpSample("minus1", {g.tensor({8, 4}), IL{-1, 2}}),
                   OpSample("flatten_uneven_exact", {g.tensor({7, 2}), IL{14}}),
                   OpSample("flatten_uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{30}}),
                   OpSample("regroup", {g.tensor({4, 6}), IL{2, 12}}),
                   OpSample("size1_dims", {g.tensor({8, 1, 4}), IL{1, 8, 4, 1}}),
                   OpSample("split_lead", {g.tensor({12, 2}), IL{6, 2, 2}}),
                   // Through size-1 dims (a bias gradient summed with keepdim, then viewed).
                   OpSample("drop_ones", {g.tensor({1, 1, 8}), IL{8}}),
                   OpSample("add_ones", {g.tensor({8}), IL{1, 8, 1}})};
  };
  db.add("aten::view", "view", view_like);
  db.add("aten::view_copy", "view", view_like);
  // view_copy.dtype(self, dtype): the same bits as another dtype (the last dim scales by the
  // ratio of the element sizes).
  for (const char* op : {"aten::view.dtype", "aten::view_copy.dtype"})
    db.add(op, "view", [](SampleGen& g) {
      return Samples{OpSample("same_size", {g.tensor({8, 4}), at::kInt}).no_backward(),
                     OpSample("halves_f64", {g.tensor({5, 6}, at::kDouble), at::kFloat}).no_backward()};
    });
  db.add("aten::reshape", "view", view_like);
  db.add("aten::_unsafe_view", "view", [](SampleGen& g) {
    return Samples{OpSample("flatten", {g.tensor({8, 4}), IL{32}}), OpSample("split", {g.tensor({8, 4}), IL{4, 2, 4}}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{30}})};
  });
  db.add("aten::_reshape_alias", "view", [](SampleGen& g) {
    return Samples{OpSample("split", {g.tensor({8, 4}), IL{4, 2, 4}, IL{8, 4, 1}}).no_backward(),
                   OpSample("flatten_f64", {g.tensor({5, 6}, at::kDouble), IL{30}, IL{1}}).no_backward()};
  });
  db.add("aten::flatten.using_ints", "view", [](SampleGen& g) {
    return Samples{OpSample("inner", {g.tensor({2, 4, 6}), 1, 2}), OpSample("all_f64", {g.tensor({5, 6}, at::kDouble)}),
                   OpSample("neg", {g.tensor({2, 4, 6}), -3, -2})};
  });
  db.add("aten::unflatten.int", "view", [](SampleGen& g) {
    return Samples{OpSample("inner", {g.tensor({8, 12}), 1, IL{3, 4}}),
                   OpSample("uneven_f64", {g.tensor({30}, at::kDouble), 0, IL{5, 6}}),
                   OpSample("neg_minus1", {g.tensor({4, 8}), -1, IL{2, -1}})};
  });
  db.add("aten::view_as_real", "view", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}, at::kComplexFloat)}),
                   OpSample("uneven", {g.tensor({5, 6}, at::kComplexDouble)})};
  });
  db.add("aten::view_as_complex", "view", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4, 2})}), OpSample("uneven_f64", {g.tensor({5, 6, 2}, at::kDouble)})};
  });

  // ---- splitting ----
  auto split_size = [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 3, 0}), OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), 2, -1}),
                   OpSample("3d", {g.tensor({2, 4, 6}), 4, 2})};
  };
  db.add("aten::split.Tensor", "view", split_size);
  db.add("aten::unsafe_split.Tensor", "view", split_size);
  auto split_sizes = [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), IL{3, 5}, 0}),
                   OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), IL{1, 2, 3}, -1})};
  };
  db.add("aten::split_with_sizes", "view", split_sizes);
  db.add("aten::unsafe_split_with_sizes", "view", split_sizes);
  db.add("aten::chunk", "view", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 3, 0}), OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), 4, -1})};
  });
  db.add("aten::unbind.int", "view", [](SampleGen& g) {
    return Samples{OpSample("cols", {g.tensor({8, 4}), 1}), OpSample("neg_f64", {g.tensor({5, 3}, at::kDouble), -1}),
                   OpSample("3d", {g.tensor({2, 4, 6}), 0})};
  });

  // ---- slicing ----
  const c10::IValue none;
  db.add("aten::slice.Tensor", "view", [none](SampleGen& g) {
    return Samples{OpSample("rows_step", {g.tensor({8, 4}), 0, 1, 7, 2}),
                   OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), 1, -4, none}),
                   OpSample("whole", {g.tensor({8, 4}), 0, 0, std::numeric_limits<int64_t>::max()}),
                   OpSample("3d", {g.tensor({2, 4, 6}), 2, 1, 5, 3})};
  });
  auto narrow_samples = [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), 0, 2, 4}), OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), -1, 1, 3}),
                   OpSample("whole", {g.tensor({8, 4}), 0, 0, 8})};
  };
  db.add("aten::narrow", "view", narrow_samples);
  db.add("aten::narrow_copy", "view", narrow_samples);
  db.add("aten::select.int", "view", [](SampleGen& g) {
    return Samples{OpSample("row", {g.tensor({8, 4}), 0, 3}), OpSample("neg_f64", {g.tensor({5, 6}, at::kDouble), 1, -1}),
                   OpSample("3d", {g.tensor({2, 4, 6}), 2, 5})};
  });
  db.add("aten::diagonal", "view", [](SampleGen& g) {
    return Samples{OpSample("main", {g.tensor({8, 4})}), OpSample("3d", {g.tensor({2, 4, 6}), 1, -1, 0}),
                   OpSample("below_f64", {g.tensor({5, 6}, at::kDouble), -2})};
  });
  // NOTE: [as_strided on DTensors]: the identity keeps shards; other calls replicate.
  db.add("aten::as_strided", "view", [](SampleGen& g) {
    return Samples{OpSample("identity", {g.tensor({8, 4}), IL{8, 4}, IL{4, 1}}),
                   OpSample("transposed", {g.tensor({8, 4}), IL{4, 8}, IL{1, 4}}),
                   OpSample("overlap_f64", {g.tensor({5, 6}, at::kDouble), IL{3, 3}, IL{1, 1}, 2})};
  });

  // ---- backward ops ----
  db.add("aten::select_backward", "view", [](SampleGen& g) {
    return Samples{OpSample("row", {g.tensor({4}), IL{8, 4}, 0, 3}), OpSample("col", {g.tensor({8}), IL{8, 4}, 1, 2}),
                   OpSample("neg_f64", {g.tensor({5}, at::kDouble), IL{5, 6}, -1, -1})};
  });
  db.add("aten::slice_backward", "view", [](SampleGen& g) {
    return Samples{OpSample("rows_step", {g.tensor({3, 4}), IL{8, 4}, 0, 1, 7, 2}),
                   OpSample("whole", {g.tensor({8, 4}), IL{8, 4}, 0, 0, std::numeric_limits<int64_t>::max(), 1}),
                   OpSample("cols_f64", {g.tensor({5, 2}, at::kDouble), IL{5, 6}, 1, 2, 6, 2})};
  });
  db.add("aten::diagonal_backward", "view", [](SampleGen& g) {
    return Samples{OpSample("main", {g.tensor({4}), IL{8, 4}, 0, 0, 1}),
                   OpSample("3d", {g.tensor({4, 1}), IL{2, 4, 6}, 1, -1, 0}),
                   OpSample("below_f64", {g.tensor({3}, at::kDouble), IL{5, 6}, -2, 0, 1})};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
