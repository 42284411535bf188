// suites/dtensor/libtorch_compat_test.cpp: what dtensor-cpp assumes of the libtorch it is
// built against, checked on every libtorch line CI builds (Debian's 1.13, today's pip wheel).
#include "dtensor/compat.h"
#include "dtensor/tensor/dtensor_impl.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <array>
#include <tuple>

#include <string>
#include <vector>

namespace dtensor {
namespace {

// NOTE: [DTensor dispatch key] (dtensor/tensor/dtensor_impl.h): DTensors carry
// DispatchKey::Fake, which upstream marks for deletion. The key is ours only while libtorch
// registers nothing of its own on it: a kernel of libtorch's for some op on that key would run
// instead of our fallback for that op (and a fallback of libtorch's would make registering
// ours fail when the library loads). A new libtorch release that takes the key fails here,
// naming the ops, before any sharding test fails in a way that points elsewhere.
TEST(LibtorchCompat, TheDTensorKeyHasOurFallbackAndNoKernelOfLibtorchs) {
  auto& dispatcher = c10::Dispatcher::singleton();
  EXPECT_TRUE(dispatcher.hasBackendFallbackForDispatchKey(kDTensorKey))
      << "dtensor-cpp's fallback (dtensor/tensor/dispatch.cpp) is not registered on " << kDTensorKey;
  std::vector<std::string> taken;
  size_t ops = 0;
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op) continue;
    ++ops;
    if (op->hasKernelForDispatchKey(kDTensorKey)) taken.push_back(c10::toString(name));
  }
  EXPECT_GT(ops, 1000u) << "the dispatcher lists too few operators to say anything";
  std::string names;
  for (size_t i = 0; i < taken.size() && i < 20; ++i) names += " " + taken[i];
  EXPECT_TRUE(taken.empty()) << "libtorch " << compat::kTorchVersion << " registers kernels of its own on "
                             << kDTensorKey << " for " << taken.size() << " ops:" << names
                             << " (choose another key: NOTE: [DTensor dispatch key])";
}

// NOTE: [Device context] (dtensor/nn/device_context.h) takes DeferredInit, the key libtorch
// reserves for torchdistX's deferred initialisation, on the same terms.
TEST(LibtorchCompat, TheDeviceContextKeyHasOurFallbackAndNoKernelOfLibtorchs) {
  auto& dispatcher = c10::Dispatcher::singleton();
  EXPECT_TRUE(dispatcher.hasBackendFallbackForDispatchKey(c10::DispatchKey::DeferredInit))
      << "dtensor-cpp's fallback (dtensor/nn/device_context.cpp) is not registered on DeferredInit";
  std::vector<std::string> taken;
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (op && op->hasKernelForDispatchKey(c10::DispatchKey::DeferredInit)) taken.push_back(c10::toString(name));
  }
  EXPECT_TRUE(taken.empty()) << "libtorch " << compat::kTorchVersion << " registers kernels of its own on DeferredInit for "
                             << taken.size() << " ops, e.g. " << (taken.empty() ? "" : taken[0]);
}

// NOTE: [Meta kernels] (dtensor/tensor/meta_kernels.cpp): every op a Transformer's step calls
// runs on meta tensors, and the meta outputs have the shapes and dtypes of the CPU kernel's.
void expect_like(const at::Tensor& meta, const at::Tensor& cpu, const char* what) {
  ASSERT_EQ(meta.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  EXPECT_TRUE(meta.is_meta()) << what;
  EXPECT_EQ(meta.sizes(), cpu.sizes()) << what;
  EXPECT_EQ(meta.scalar_type(), cpu.scalar_type()) << what;
  EXPECT_EQ(meta.strides(), cpu.strides()) << what << " (a DTensor's output takes the meta kernel's strides)";
}

TEST(LibtorchCompat, MetaKernelsGiveTheCpuKernelsShapes) {
  const at::Tensor x = at::randn({2, 3, 8});
  const at::Tensor w = at::randn({8}), b = at::randn({8});
  auto m = [](const at::Tensor& t) { return t.to(c10::kMeta); };

  expect_like(at::relu(m(x)), at::relu(x), "relu");
  const at::Tensor xt = x.transpose(0, 2);  // not contiguous: the output follows its layout
  expect_like(at::relu(m(xt)), at::relu(xt), "relu of a transposed tensor");
  at::Tensor r = m(x).clone();
  EXPECT_TRUE(at::relu_(r).is_same(r)) << "relu_ returns its argument";

  const auto cpu_ln = at::native_layer_norm(x, {8}, w, b, 1e-5);
  const auto meta_ln = at::native_layer_norm(m(x), {8}, m(w), m(b), 1e-5);
  expect_like(std::get<0>(meta_ln), std::get<0>(cpu_ln), "native_layer_norm output");
  expect_like(std::get<1>(meta_ln), std::get<1>(cpu_ln), "native_layer_norm mean");
  expect_like(std::get<2>(meta_ln), std::get<2>(cpu_ln), "native_layer_norm rstd");
  const at::Tensor g = at::randn({2, 3, 8});
  for (const std::array<bool, 3>& mask : {std::array<bool, 3>{true, true, true}, std::array<bool, 3>{true, false, false}}) {
    const auto cpu_bw = at::native_layer_norm_backward(g, x, {8}, std::get<1>(cpu_ln), std::get<2>(cpu_ln), w, b, mask);
    const auto meta_bw = at::native_layer_norm_backward(m(g), m(x), {8}, std::get<1>(meta_ln), std::get<2>(meta_ln),
                                                        m(w), m(b), mask);
    expect_like(std::get<0>(meta_bw), std::get<0>(cpu_bw), "native_layer_norm_backward grad_input");
    expect_like(std::get<1>(meta_bw), std::get<1>(cpu_bw), "native_layer_norm_backward grad_weight");
    expect_like(std::get<2>(meta_bw), std::get<2>(cpu_bw), "native_layer_norm_backward grad_bias");
  }

  const at::Tensor table = at::randn({10, 6});
  const at::Tensor idx = at::tensor(std::vector<int64_t>{3, 0, 5, 3});  // in range on both dims of the table
  expect_like(at::index_select(m(table), 0, m(idx)), at::index_select(table, 0, idx), "index_select dim 0");
  expect_like(at::index_select(m(table), -1, m(idx)), at::index_select(table, -1, idx), "index_select dim -1");
  expect_like(at::embedding(m(table), m(idx)), at::embedding(table, idx), "embedding");
  const at::Tensor eg = at::randn({4, 6});
  expect_like(at::embedding_dense_backward(m(eg), m(idx), 10, -1, false),
              at::embedding_dense_backward(eg, idx, 10, -1, false), "embedding_dense_backward");

  const auto cpu_do = at::native_dropout(x, 0.5, true);
  const auto meta_do = at::native_dropout(m(x), 0.5, true);
  expect_like(std::get<0>(meta_do), std::get<0>(cpu_do), "native_dropout output");
  expect_like(std::get<1>(meta_do), std::get<1>(cpu_do), "native_dropout mask");
  expect_like(at::native_dropout_backward(m(g), std::get<1>(meta_do), 2.0),
              at::native_dropout_backward(g, std::get<1>(cpu_do), 2.0), "native_dropout_backward");

  const at::Tensor bits = at::rand({3, 1}) > 0.5, other = at::rand({1, 4}) > 0.5;
  const at::Tensor xf = at::randn({3, 4}), yd = at::randn({1}, at::kDouble);
  expect_like(at::logical_not(m(bits)), at::logical_not(bits), "logical_not");
  expect_like(at::logical_or(m(bits), m(other)), at::logical_or(bits, other), "logical_or");
  expect_like(at::logical_and(m(bits), m(other)), at::logical_and(bits, other), "logical_and");
  expect_like(at::where(m(bits), m(xf), m(yd)), at::where(bits, xf, yd), "where");
  const at::Tensor bt = (at::rand({4, 3}) > 0.5).t(), xft = at::randn({4, 3}).t();
  expect_like(at::where(m(bt), m(xft), m(xft)), at::where(bt, xft, xft), "where of transposed tensors");
  expect_like(at::logical_not(m(bt)), at::logical_not(bt), "logical_not of a transposed tensor");
  expect_like(at::logical_xor(m(bt), m(bt)), at::logical_xor(bt, bt), "logical_xor of transposed tensors");
  at::Tensor where_out = m(at::empty({0}, at::kDouble));
  at::where_out(where_out, m(bits), m(xf.to(at::kDouble)), m(yd));
  expect_like(where_out, at::where(bits, xf, yd), "where.self_out");
#if DTENSOR_TORCH_2
  const at::Tensor q = at::randn({1, 2, 5, 4}), k = at::randn({1, 2, 6, 4}), v = at::randn({1, 2, 6, 4});
  const auto cpu_fa = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, true);
  const auto meta_fa = at::_scaled_dot_product_flash_attention_for_cpu(m(q), m(k), m(v), 0.0, true);
  expect_like(std::get<0>(meta_fa), std::get<0>(cpu_fa), "flash attention output");
  expect_like(std::get<1>(meta_fa), std::get<1>(cpu_fa), "flash attention logsumexp");
  // A query laid out as [B, L, H, E] (a projection's view, transposed): the output follows it.
  const at::Tensor qt = at::randn({1, 5, 2, 4}).transpose(1, 2), kt = at::randn({1, 6, 2, 4}).transpose(1, 2);
  const auto cpu_ft = at::_scaled_dot_product_flash_attention_for_cpu(qt, kt, kt, 0.0, true);
  const auto meta_ft = at::_scaled_dot_product_flash_attention_for_cpu(m(qt), m(kt), m(kt), 0.0, true);
  expect_like(std::get<0>(meta_ft), std::get<0>(cpu_ft), "flash attention output of a transposed query");
  const auto cpu_bt = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      std::get<0>(cpu_ft), qt, kt, kt, std::get<0>(cpu_ft), std::get<1>(cpu_ft), 0.0, true);
  const auto meta_bt = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      std::get<0>(meta_ft), m(qt), m(kt), m(kt), std::get<0>(meta_ft), std::get<1>(meta_ft), 0.0, true);
  expect_like(std::get<0>(meta_bt), std::get<0>(cpu_bt), "flash attention grad_query of a transposed query");
  expect_like(std::get<1>(meta_bt), std::get<1>(cpu_bt), "flash attention grad_key of a transposed key");
  const at::Tensor go = at::randn_like(std::get<0>(cpu_fa));
  const auto cpu_fb = at::_scaled_dot_product_flash_attention_for_cpu_backward(go, q, k, v, std::get<0>(cpu_fa),
                                                                               std::get<1>(cpu_fa), 0.0, true);
  const auto meta_fb = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      m(go), m(q), m(k), m(v), std::get<0>(meta_fa), std::get<1>(meta_fa), 0.0, true);
  expect_like(std::get<0>(meta_fb), std::get<0>(cpu_fb), "flash attention grad_query");
  expect_like(std::get<1>(meta_fb), std::get<1>(cpu_fb), "flash attention grad_key");
  expect_like(std::get<2>(meta_fb), std::get<2>(cpu_fb), "flash attention grad_value");
#endif
  const at::Tensor sq = at::randn({1, 2, 5, 4});
  expect_like(compat::scaled_dot_product_attention(m(sq), m(sq), m(sq), {}, 0.0, true),
              compat::scaled_dot_product_attention(sq, sq, sq, {}, 0.0, true), "scaled_dot_product_attention");

  // Through autograd: layer_norm and embedding forward and backward on meta leaves.
  const at::Tensor w6 = at::randn({6});
  at::Tensor mw = m(w6).requires_grad_(), mt = m(table).requires_grad_();
  at::layer_norm(at::embedding(mt, m(idx)), {6}, mw).sum().backward();
  expect_like(mw.grad(), w6, "layer_norm's weight gradient");
  expect_like(mt.grad(), table, "embedding's weight gradient");
}

}  // namespace
}  // namespace dtensor
