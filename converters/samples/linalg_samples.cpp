// converters/samples/linalg_samples.cpp: samples of dtensor/ops/linalg_rules.cpp: the linear
// algebra decompositions and solves on batches of matrices (well-conditioned inputs, a batch
// that divides the mesh and one that does not, a single matrix), diag / diag_embed /
// diagonal_copy, dist, histc, the FFT primitives, is_same_size, and one sample for every
// overload of the _foreach_* ops with a rule, built from its schema.
#include "converters/samples/samples.h"
#include "dtensor/ops/registry.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>
#include <set>
#include <string>

namespace dtensor {
namespace testing {
namespace samples {

namespace {

bool op_in_dispatcher(const char* name) {
  return c10::Dispatcher::singleton().findSchema({name, ""}).has_value();
}

using IL = std::vector<int64_t>;

// [*batch, n, n] matrices far from singular: random + n * I.
at::Tensor square(SampleGen& g, IL batch, int64_t n, at::ScalarType dtype = at::kFloat) {
  IL shape = batch;
  shape.push_back(n);
  shape.push_back(n);
  return g.tensor(shape, dtype, -1, 1) + at::eye(n, dtype) * static_cast<double>(n);
}

// Symmetric positive definite: A A^T + n * I.
at::Tensor spd(SampleGen& g, IL batch, int64_t n, at::ScalarType dtype = at::kFloat) {
  IL shape = batch;
  shape.push_back(n);
  shape.push_back(n);
  const at::Tensor a = g.tensor(shape, dtype, -1, 1);
  return at::matmul(a, a.transpose(-2, -1)) + at::eye(n, dtype) * static_cast<double>(n);
}

void add_decompositions(OpDb& db) {
  db.add("aten::_linalg_svd", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch_tall", {g.tensor({4, 5, 3}), false, true}),
                   OpSample("uneven_batch_f64_full", {g.tensor({3, 4, 4}, at::kDouble), true, true}),
                   OpSample("matrix", {g.tensor({6, 4}), false, true}),
                   OpSample("values_only", {g.tensor({4, 3, 5}), false, false})};
  });
  db.add("aten::linalg_qr", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch_reduced", {g.tensor({4, 5, 3}), std::string("reduced")}),
                   OpSample("uneven_batch_f64_complete", {g.tensor({3, 4, 4}, at::kDouble), std::string("complete")}),
                   OpSample("matrix_r", {g.tensor({6, 4}), std::string("r")}).no_backward()};
  });
  db.add("aten::_linalg_eigh", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {spd(g, {4}, 4), std::string("L"), true}),
                   OpSample("uneven_batch_f64_upper", {spd(g, {3}, 3, at::kDouble), std::string("U"), true}),
                   OpSample("values_only", {spd(g, {4}, 3), std::string("L"), false})};
  });
  // The composite decompositions (they reach _linalg_svd, linalg_qr, _linalg_eigh); their out=
  // overloads (svd.U, linalg_svd.U, qr.Q, linalg_eigh.eigvals) take the first sample.
  db.add("aten::svd", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch_tall", {g.tensor({4, 5, 3})}),
                   OpSample("uneven_batch_f64_full", {g.tensor({3, 4, 4}, at::kDouble), false}),
                   OpSample("matrix_values_only", {g.tensor({6, 4}), true, false}).no_backward()};
  });
  db.add("aten::linalg_svd", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch_tall", {g.tensor({4, 5, 3}), false}),
                   OpSample("uneven_batch_f64_full", {g.tensor({3, 4, 4}, at::kDouble), true}),
                   OpSample("matrix", {g.tensor({6, 4}), false})};
  });
  // aten::qr and aten::cholesky (deprecated for linalg_qr / linalg_cholesky) are gone from
  // today's libtorch: their samples exist where the ops do.
  if (op_in_dispatcher("aten::qr"))
    db.add("aten::qr", "linalg", [](SampleGen& g) {
      return Samples{OpSample("batch_reduced", {g.tensor({4, 5, 3})}),
                     OpSample("uneven_batch_f64_complete", {g.tensor({3, 4, 4}, at::kDouble), false})};
    });
  db.add("aten::linalg_eigh", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {spd(g, {4}, 4)}),
                   OpSample("uneven_batch_f64_upper", {spd(g, {3}, 3, at::kDouble), std::string("U")})};
  });
  for (const char* op : {"aten::_linalg_det", "aten::_linalg_slogdet", "aten::linalg_inv_ex", "aten::linalg_matrix_exp"})
    db.add(op, "linalg", [](SampleGen& g) {
      return Samples{OpSample("batch", {square(g, {4}, 3)}), OpSample("uneven_batch_f64", {square(g, {3}, 4, at::kDouble)}),
                     OpSample("batch_2d", {square(g, {2, 4}, 2)})};
    });
  if (op_in_dispatcher("aten::cholesky"))
    db.add("aten::cholesky", "linalg", [](SampleGen& g) {
      return Samples{OpSample("batch", {spd(g, {4}, 3)}), OpSample("uneven_batch_f64_upper", {spd(g, {3}, 4, at::kDouble), true})};
    });
  db.add("aten::cholesky_inverse", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {at::linalg_cholesky(spd(g, {4}, 3))}),
                   OpSample("uneven_batch_f64_upper", {at::linalg_cholesky(spd(g, {3}, 4, at::kDouble), true), true}),
                   OpSample("matrix", {at::linalg_cholesky(spd(g, {}, 4))})};
  });
  db.add("aten::linalg_cholesky_ex", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {spd(g, {4}, 3)}), OpSample("uneven_batch_f64_upper", {spd(g, {3}, 4, at::kDouble)}).kw("upper", true)};
  });
  db.add("aten::linalg_lu_factor_ex", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {square(g, {4}, 3)}), OpSample("uneven_batch_f64", {square(g, {3}, 4, at::kDouble)})};
  });
  db.add("aten::linalg_lu", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch_wide", {g.tensor({4, 3, 5})}), OpSample("uneven_batch_f64", {square(g, {3}, 4, at::kDouble)})};
  });
  db.add("aten::lu_unpack", "linalg", [](SampleGen& g) {
    auto lu = at::linalg_lu_factor(square(g, {4}, 3));
    auto lu64 = at::linalg_lu_factor(square(g, {3}, 4, at::kDouble));
    return Samples{OpSample("batch", {std::get<0>(lu), std::get<1>(lu)}),
                   OpSample("uneven_batch_f64", {std::get<0>(lu64), std::get<1>(lu64)})};
  });
  db.add("aten::linalg_eig", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {spd(g, {4}, 3)}).no_backward(),
                   OpSample("uneven_batch_f64", {spd(g, {3}, 3, at::kDouble)}).no_backward()};
  });
  db.add("aten::geqrf", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {g.tensor({4, 5, 3})}).no_backward(),
                   OpSample("uneven_batch_f64", {g.tensor({3, 4, 4}, at::kDouble)}).no_backward()};
  });
  db.add("aten::linalg_householder_product", "linalg", [](SampleGen& g) {
    auto qr = at::geqrf(g.tensor({4, 5, 3}));
    auto qr64 = at::geqrf(g.tensor({3, 4, 4}, at::kDouble));
    return Samples{OpSample("batch", {std::get<0>(qr), std::get<1>(qr)}),
                   OpSample("uneven_batch_f64", {std::get<0>(qr64), std::get<1>(qr64)})};
  });
  db.add("aten::linalg_ldl_factor_ex", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {spd(g, {4}, 3)}).no_backward(),
                   OpSample("uneven_batch_f64", {spd(g, {3}, 4, at::kDouble)}).no_backward()};
  });
  db.add("aten::linalg_pinv.atol_rtol_tensor", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {g.tensor({4, 5, 3})}), OpSample("uneven_batch_f64", {g.tensor({3, 4, 4}, at::kDouble)})};
  });
  db.add("aten::linalg_lstsq", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {g.tensor({4, 5, 3}), g.tensor({4, 5, 2})}),
                   OpSample("uneven_batch_f64", {g.tensor({3, 4, 4}, at::kDouble), g.tensor({3, 4, 1}, at::kDouble)})};
  });
}

void add_solves(OpDb& db) {
  db.add("aten::_linalg_solve_ex", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {square(g, {4}, 3), g.tensor({4, 3, 2})}),
                   OpSample("batch_vector", {square(g, {4}, 3), g.tensor({4, 3})}),
                   OpSample("uneven_batch_f64_right", {square(g, {3}, 4, at::kDouble), g.tensor({3, 2, 4}, at::kDouble)})
                       .kw("left", false),
                   OpSample("broadcast_b", {square(g, {4}, 3), g.tensor({3, 2})})};
  });
  auto upper = [](SampleGen& g, IL batch, int64_t n, at::ScalarType dtype = at::kFloat) {
    return square(g, std::move(batch), n, dtype).triu();
  };
  db.add("aten::linalg_solve_triangular", "linalg", [upper](SampleGen& g) {
    return Samples{OpSample("batch", {upper(g, {4}, 3), g.tensor({4, 3, 2})}).kw("upper", true),
                   OpSample("uneven_batch_f64_right", {upper(g, {3}, 4, at::kDouble), g.tensor({3, 2, 4}, at::kDouble)})
                       .kw("upper", true)
                       .kw("left", false)};
  });
  db.add("aten::triangular_solve", "linalg", [upper](SampleGen& g) {
    return Samples{OpSample("batch", {g.tensor({4, 3, 2}), upper(g, {4}, 3)}),
                   OpSample("uneven_batch_f64_lower", {g.tensor({3, 4, 1}, at::kDouble),
                                                        upper(g, {3}, 4, at::kDouble).transpose(-2, -1).contiguous(), false})};
  });
  db.add("aten::cholesky_solve", "linalg", [](SampleGen& g) {
    return Samples{OpSample("batch", {g.tensor({4, 3, 2}), at::linalg_cholesky(spd(g, {4}, 3))}),
                   OpSample("uneven_batch_f64_upper",
                            {g.tensor({3, 4, 1}, at::kDouble), at::linalg_cholesky(spd(g, {3}, 4, at::kDouble), true), true})};
  });
  db.add("aten::linalg_lu_solve", "linalg", [](SampleGen& g) {
    auto lu = at::linalg_lu_factor(square(g, {4}, 3));
    auto lu64 = at::linalg_lu_factor(square(g, {3}, 4, at::kDouble));
    return Samples{OpSample("batch", {std::get<0>(lu), std::get<1>(lu), g.tensor({4, 3, 2})}),
                   OpSample("uneven_batch_f64", {std::get<0>(lu64), std::get<1>(lu64), g.tensor({3, 4, 1}, at::kDouble)})};
  });
  db.add("aten::linalg_ldl_solve", "linalg", [](SampleGen& g) {
    auto ldl = at::linalg_ldl_factor(spd(g, {4}, 3));
    auto ldl64 = at::linalg_ldl_factor(spd(g, {3}, 4, at::kDouble));
    return Samples{OpSample("batch", {std::get<0>(ldl), std::get<1>(ldl), g.tensor({4, 3, 2})}).no_backward(),
                   OpSample("uneven_batch_f64", {std::get<0>(ldl64), std::get<1>(ldl64), g.tensor({3, 4, 1}, at::kDouble)})
                       .no_backward()};
  });
  db.add("aten::ormqr", "linalg", [](SampleGen& g) {
    auto qr = at::geqrf(g.tensor({4, 5, 3}));
    auto qr64 = at::geqrf(g.tensor({3, 4, 4}, at::kDouble));
    return Samples{OpSample("batch", {std::get<0>(qr), std::get<1>(qr), g.tensor({4, 5, 2})}).no_backward(),
                   OpSample("uneven_batch_f64_transpose",
                            {std::get<0>(qr64), std::get<1>(qr64), g.tensor({3, 4, 2}, at::kDouble), true, true})
                       .no_backward()};
  });
}

void add_other(OpDb& db) {
  // Ops PyTorch's DTensor op test passes that had no rule here (dtensor/ops/tensor_rules.cpp).
  auto sorted = [](SampleGen& g, int64_t n, at::ScalarType dtype = at::kFloat) {
    return std::get<0>(g.tensor({n}, dtype).sort());
  };
  db.add("aten::bucketize.Tensor", "tensor", [sorted](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), sorted(g, 5)}).no_backward(),
                   OpSample("right_int32", {g.tensor({8, 4}), sorted(g, 3)}).kw("out_int32", true).kw("right", true).no_backward(),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), sorted(g, 4, at::kDouble)}).no_backward()};
  });
  db.add("aten::bucketize.Scalar", "tensor", [sorted](SampleGen& g) {
    return Samples{OpSample("scalar", {0.3, sorted(g, 5)}), OpSample("right", {-0.5, sorted(g, 6)}).kw("right", true)};
  });
  db.add("aten::constant_pad_nd", "tensor", [](SampleGen& g) {
    return Samples{OpSample("last_dim", {g.tensor({8, 4}), IL{1, 2}}),
                   OpSample("middle_dim_value", {g.tensor({8, 4, 2}), IL{0, 0, 1, 1}, 1.5}),
                   OpSample("crop_uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{-1, 1}})};
  });
  db.add("aten::slice_scatter", "tensor", [](SampleGen& g) {
    return Samples{OpSample("cols_step", {g.tensor({8, 4}), g.tensor({8, 2}), 1, 0, 4, 2}),
                   OpSample("rows", {g.tensor({8, 4}), g.tensor({3, 4}), 0, 2, 5}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({2, 6}, at::kDouble), 0, 1, 3})};
  });
  // select_scatter(self, src, dim, index); diagonal_scatter(self, src, offset, dim1, dim2)
  db.add("aten::select_scatter", "tensor", [](SampleGen& g) {
    return Samples{OpSample("col", {g.tensor({8, 4}), g.tensor({8}), 1, 2}),
                   OpSample("row_3d", {g.tensor({2, 4, 6}), g.tensor({2, 6}), 1, -1}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({6}, at::kDouble), 0, 3})};
  });
  db.add("aten::diagonal_scatter", "tensor", [](SampleGen& g) {
    return Samples{OpSample("main", {g.tensor({8, 8}), g.tensor({8})}),
                   OpSample("offset_3d", {g.tensor({4, 6, 6}), g.tensor({4, 5}), 1, 1, 2}),
                   OpSample("batch_last_f64", {g.tensor({5, 6, 3}, at::kDouble), g.tensor({3, 5}, at::kDouble), 0, 0, 1})};
  });
  db.add("aten::split_with_sizes_copy", "tensor", [](SampleGen& g) {
    return Samples{OpSample("rows", {g.tensor({8, 4}), IL{3, 5}, 0}), OpSample("cols", {g.tensor({8, 6}), IL{2, 4}, 1}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{1, 4}})};
  });
  // Composites PyTorch's DTensor op test passes whose generated [8, 8] sample is invalid: they
  // decompose into ops with rules; these samples give them valid arguments.
  using TL = std::vector<at::Tensor>;
  const c10::IValue none;
  db.add("aten::cartesian_prod", "tensor", [](SampleGen& g) {
    return Samples{OpSample("two", {TL{g.tensor({4}), g.tensor({3})}}),
                   OpSample("three_f64", {TL{g.tensor({5}, at::kDouble), g.tensor({2}, at::kDouble), g.tensor({3}, at::kDouble)}})};
  });
  db.add("aten::meshgrid", "tensor", [](SampleGen& g) {
    return Samples{OpSample("two", {TL{g.tensor({4}), g.tensor({3})}})};
  });
  db.add("aten::meshgrid.indexing", "tensor", [](SampleGen& g) {
    return Samples{OpSample("ij", {TL{g.tensor({4}), g.tensor({3})}}).kw("indexing", std::string("ij")),
                   OpSample("xy_f64", {TL{g.tensor({5}, at::kDouble), g.tensor({2}, at::kDouble)}}).kw("indexing", std::string("xy"))};
  });
  db.add("aten::dsplit.int", "tensor", [](SampleGen& g) {
    return Samples{OpSample("three", {g.tensor({4, 2, 6}), 3})};
  });
  db.add("aten::dsplit.array", "tensor", [](SampleGen& g) {
    return Samples{OpSample("uneven_f64", {g.tensor({5, 2, 6}, at::kDouble), IL{1, 4}})};
  });
  db.add("aten::take_along_dim", "tensor", [none](SampleGen& g) {
    return Samples{OpSample("cols", {g.tensor({8, 4}), g.index({8, 4}, 4), 1}),
                   OpSample("rows_narrow_f64", {g.tensor({5, 6}, at::kDouble), g.index({3, 6}, 5), 0}),
                   OpSample("flat", {g.tensor({8, 4}), g.index({6}, 32), none})};
  });
  db.add("aten::item", "tensor", [](SampleGen& g) {
    return Samples{OpSample("one_element", {g.tensor({1})}), OpSample("zero_dim_f64", {g.tensor({}, at::kDouble)})};
  });
  db.add("aten::layer_norm", "norm", [none](SampleGen& g) {
    return Samples{OpSample("affine", {g.tensor({8, 6}), IL{6}, g.tensor({6}), g.tensor({6}), 1e-5, false}),
                   OpSample("two_dims_f64", {g.tensor({5, 2, 4}, at::kDouble), IL{2, 4}, none, none, 1e-5, false})};
  });
  db.add("aten::nll_loss", "loss", [none](SampleGen& g) {
    return Samples{OpSample("mean", {g.tensor({8, 5}).log_softmax(1), g.index({8}, 5), none, 1, -100}),
                   OpSample("sum_weighted_ignore", {g.tensor({8, 5}).log_softmax(1), g.index({8}, 5), g.positive({5}), 2, 2}),
                   OpSample("none_f64", {g.tensor({5, 3}, at::kDouble).log_softmax(1), g.index({5}, 3), none, 0, -100})};
  });
  db.add("aten::linalg_cond.p_str", "linalg", [](SampleGen& g) {
    const at::Tensor eye = at::eye(3).expand({4, 3, 3});
    return Samples{OpSample("fro_batch", {g.tensor({4, 3, 3}) * 0.3 + eye, std::string("fro")}),
                   OpSample("nuc_uneven_f64", {g.tensor({5, 3, 3}, at::kDouble) * 0.3 + at::eye(3, at::kDouble), std::string("nuc")})};
  });
  db.add("aten::_linalg_check_errors", "linalg", [](SampleGen&) {
    return Samples{OpSample("batch_ok", {at::zeros({4}, at::kInt), std::string("linalg.inv")}).kw("is_matrix", false),
                   OpSample("matrix_ok", {at::zeros({}, at::kInt), std::string("linalg.cholesky")}).kw("is_matrix", true)};
  });
  db.add("aten::diag", "tensor", [](SampleGen& g) {
    return Samples{OpSample("vector", {g.tensor({6})}), OpSample("vector_offset", {g.tensor({5}), 2}),
                   OpSample("matrix", {g.tensor({8, 6})}), OpSample("matrix_neg_offset_f64", {g.tensor({5, 6}, at::kDouble), -1})};
  });
  db.add("aten::diag_embed", "tensor", [](SampleGen& g) {
    return Samples{OpSample("batch", {g.tensor({8, 3})}), OpSample("offset_dims", {g.tensor({4, 3}), 1, 0, 2}),
                   OpSample("uneven_f64", {g.tensor({5, 2, 3}, at::kDouble), -1, -1, -3})};
  });
  db.add("aten::diagonal_copy", "tensor", [](SampleGen& g) {
    return Samples{OpSample("batch_last", {g.tensor({8, 4, 4}), 0, 1, 2}), OpSample("first_two", {g.tensor({4, 4, 8})}),
                   OpSample("offset_f64", {g.tensor({5, 6, 3}, at::kDouble), 1, -1, 0})};
  });
  db.add("aten::dist", "reduction", [](SampleGen& g) {
    return Samples{OpSample("p2", {g.tensor({8, 4}), g.tensor({8, 4})}),
                   OpSample("p1_broadcast", {g.tensor({8, 4}), g.tensor({4}), 1}),
                   OpSample("p0", {g.tensor({8, 4}), g.tensor({8, 4}).round(), 0}).no_backward(),
                   OpSample("pinf_uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                                std::numeric_limits<double>::infinity()}),
                   OpSample("p3", {g.tensor({8, 4}), g.tensor({8, 4}), 3})};
  });
  db.add("aten::histc", "reduction", [](SampleGen& g) {
    return Samples{OpSample("range", {g.tensor({8, 4}), 10, -2, 2}),
                   OpSample("uneven_f64_range", {g.tensor({5, 6}, at::kDouble), 7, -1.5, 1}),
                   OpSample("data_range", {g.tensor({8, 4}), 6})};
  });
  // The FFT primitives (torch.fft.* decompose into these). normalization: 0 none, 1 1/sqrt(n), 2 1/n.
  db.add("aten::_fft_c2c", "fft", [](SampleGen& g) {
    return Samples{OpSample("last_dim", {g.tensor({8, 6}, at::kComplexFloat), IL{1}, 0, true}),
                   OpSample("first_dim_inverse", {g.tensor({8, 6}, at::kComplexFloat), IL{0}, 2, false}),
                   OpSample("two_dims_uneven_f64", {g.tensor({5, 4, 6}, at::kComplexDouble), IL{1, 2}, 1, true})};
  });
  db.add("aten::_fft_r2c", "fft", [](SampleGen& g) {
    return Samples{OpSample("onesided", {g.tensor({8, 6}), IL{1}, 0, true}),
                   OpSample("full_uneven_f64", {g.tensor({5, 6}, at::kDouble), IL{0}, 2, false})};
  });
  db.add("aten::_fft_c2r", "fft", [](SampleGen& g) {
    return Samples{OpSample("last_dim", {g.tensor({8, 4}, at::kComplexFloat), IL{1}, 2, 6}),
                   OpSample("uneven_f64", {g.tensor({5, 3, 4}, at::kComplexDouble), IL{1, 2}, 0, 6})};
  });
  db.add("aten::is_same_size", "tensor", [](SampleGen& g) {
    return Samples{OpSample("same", {g.tensor({8, 4}), g.tensor({8, 4})}),
                   OpSample("different", {g.tensor({8, 4}), g.tensor({7, 4})}),
                   OpSample("uneven_same", {g.tensor({5, 6}), g.tensor({5, 6})})};
  });
}

// ---- _foreach_* -------------------------------------------------------------------------------

enum class Domain { kAny, kPositive, kUnit };

// `name` without the trailing underscore of an in-place variant.
Domain foreach_domain(std::string name) {
  if (!name.empty() && name.back() == '_') name.pop_back();
  for (const char* n : {"_foreach_log", "_foreach_log10", "_foreach_log1p", "_foreach_log2", "_foreach_sqrt",
                        "_foreach_rsqrt", "_foreach_reciprocal", "_foreach_div", "_foreach_pow", "_foreach_lgamma", "_foreach_addcdiv"})
    if (name == std::string("aten::") + n) return Domain::kPositive;
  if (name == "aten::_foreach_acos" || name == "aten::_foreach_asin") return Domain::kUnit;
  return Domain::kAny;
}

at::Tensor foreach_tensor(SampleGen& g, IL shape, Domain d) {
  if (d == Domain::kPositive) return g.positive(std::move(shape));
  if (d == Domain::kUnit) return g.tensor(std::move(shape), at::kFloat, -0.9, 0.9);
  return g.tensor(std::move(shape));
}

// The arguments of one sample from the schema: each Tensor[] gets three tensors ([8, 4],
// uneven [5, 6], [6]); a Tensor a 0-dim one (addcmul/addcdiv's `scalars` tensor: one value per
// list element); Scalar `scalar`; Scalar[] one value per tensor; keyword-only arguments keep
// their defaults, and so does every argument from the first defaulted one of another type on
// (libtorch 2.x's `ScalarType? dtype=None` of _foreach_norm). False for another argument type
// without a default, and for out= overloads: their samples come from the functional overload's
// (NOTE: [Out= samples from the functional overload]), whatever precedes their out= arguments.
bool foreach_args(const c10::FunctionSchema& s, const std::string& name, SampleGen& g, double scalar,
                  std::vector<c10::IValue>& args) {
  const Domain dom = foreach_domain(name);
  const bool scalars_tensor = name.rfind("aten::_foreach_addcmul", 0) == 0 || name.rfind("aten::_foreach_addcdiv", 0) == 0;
  bool defaults = false;  // the rest of the positional arguments keep their defaults
  for (const auto& a : s.arguments()) {
    if (a.kwarg_only()) {
      if (a.alias_info() && a.alias_info()->isWrite()) return false;  // out=
      if (!a.default_value()) return false;
      continue;
    }
    if (defaults) {
      if (!a.default_value()) return false;
      continue;
    }
    const std::string t = a.type()->str();
    if (t == "Tensor[]") {
      std::vector<at::Tensor> l{foreach_tensor(g, {8, 4}, dom), foreach_tensor(g, {5, 6}, dom), foreach_tensor(g, {6}, dom)};
      args.emplace_back(l);
    } else if (t == "Tensor") {
      args.emplace_back(scalars_tensor ? g.positive({3}) : g.positive({}));
    } else if (t == "Scalar") {
      args.emplace_back(scalar);
    } else if (t == "Scalar[]") {
      c10::impl::GenericList scalars(c10::NumberType::get());  // Scalar[]: a list of numbers
      for (double v : {0.5, 1.25, 0.75}) scalars.push_back(v);
      args.emplace_back(scalars);
    } else if (!a.default_value()) {
      return false;
    } else {
      defaults = true;
    }
  }
  return true;
}

// Every overload of every _foreach_* name with a rule (ops::ops_with_rules()).
void add_foreach_samples(OpDb& db) {
  std::set<std::string> names;
  for (const auto& r : ops::ops_with_rules())
    if (r.rfind("aten::_foreach_", 0) == 0) names.insert(r);
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
    if (!names.count(n.name)) continue;
    auto h = c10::Dispatcher::singleton().findSchema(n);
    if (!h || !h->hasSchema()) continue;
    const c10::FunctionSchema schema = h->schema();
    const std::string name = n.name;
    std::vector<c10::IValue> probe;
    SampleGen probe_gen(0);
    if (!foreach_args(schema, name, probe_gen, 1, probe)) continue;
    db.add(op_key(schema), "foreach", [schema, name](SampleGen& g) {
      Samples out;
      const bool norm = name == "aten::_foreach_norm" || name == "aten::_foreach_powsum";
      const std::vector<std::pair<std::string, double>> variants =
          norm ? std::vector<std::pair<std::string, double>>{{"ord2", 2}, {"ord1", 1},
                                                             {"ord_inf", std::numeric_limits<double>::infinity()}}
               : std::vector<std::pair<std::string, double>>{{"lists", 0.75}};
      for (const auto& [variant, scalar] : variants) {
        std::vector<c10::IValue> args;
        foreach_args(schema, name, g, scalar, args);
        out.push_back(OpSample(variant, std::move(args)));
      }
      return out;
    });
  }
}

}  // namespace

void add_linalg_samples(OpDb& db) {
  add_decompositions(db);
  add_solves(db);
  add_other(db);
  add_foreach_samples(db);
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
