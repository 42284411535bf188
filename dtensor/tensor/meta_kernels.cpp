// dtensor/tensor/meta_kernels.cpp: the meta kernels libtorch's C++ lacks.
//
// NOTE: [Meta kernels]
// A fake world (NOTE: [Fake world] in dtensor/comm/fake_group.h) runs a model's step on meta
// tensors: shapes, dtypes and bytes without data. libtorch computes most ops' output metadata
// in C++ (structured kernels), but some of the ops a Transformer's step calls have their meta
// kernels only in Python (torch/_meta_registrations.py), which a C++ program never loads:
// relu, native_layer_norm and its backward, index_select and embedding_dense_backward
// (Embedding), native_dropout and its backward (the same in libtorch 1.13 and 2.x); in
// libtorch 1.13 the logical ops' out variants (its scaled dot-product attention masks with
// logical_not); in 2.x where.self and its out variant and the CPU flash attention and its
// backward (the kernels scaled_dot_product_attention runs on the CPU). Each is
// registered here for the Meta key, as a boxed kernel that makes outputs of the shapes and
// dtypes the CPU kernel makes, and only when libtorch has no Meta kernel of its own for the op
// (a later libtorch that adds one keeps its own).
#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace dtensor {
namespace {

using Stack = torch::jit::Stack;

// The `n` arguments of the call, in order, popped from the stack.
std::vector<c10::IValue> pop_args(Stack* s, size_t n) {
  std::vector<c10::IValue> args(std::make_move_iterator(s->end() - static_cast<std::ptrdiff_t>(n)),
                                std::make_move_iterator(s->end()));
  s->erase(s->end() - static_cast<std::ptrdiff_t>(n), s->end());
  return args;
}

int64_t int_of(const c10::IValue& v) { return v.isInt() ? v.toInt() : v.toSymInt().expect_int(); }

std::vector<int64_t> ints_of(const c10::IValue& v) {
  std::vector<int64_t> out;
  for (const c10::IValue& e : v.toList()) out.push_back(int_of(e));
  return out;
}

at::Tensor optional_tensor(const c10::IValue& v) { return v.isNone() ? at::Tensor() : v.toTensor(); }

// An elementwise op's output: the inputs' broadcast shape, laid out in memory as the CPU's
// TensorIterator lays it out (in the inputs' memory order), of `dtype`. The output's strides
// become a DTensor's, so they must be the CPU kernel's.
at::Tensor elementwise_output(const std::vector<at::Tensor>& inputs, at::ScalarType dtype) {
  at::Tensor out;
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false).declare_static_dtype_and_device(dtype, c10::Device(c10::kMeta));
  config.add_output(out);
  for (const at::Tensor& t : inputs) config.add_input(t);
  return config.build().output();
}

// Makes `out` (an out= argument) the result: kept when it has the shape already (the CPU kernel
// writes into it as it is), else replaced by `fresh` (as the CPU's resize, with the layout the
// CPU kernel gives, and allocated so that MemTracker counts it).
void become(const at::Tensor& out, const at::Tensor& fresh) {
  if (out.sizes() == fresh.sizes()) return;
  out.set_(fresh);
}

void relu_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 1);
  const at::Tensor self = a[0].toTensor();
  s->emplace_back(elementwise_output({self}, self.scalar_type()));
}

void relu_inplace_meta(const c10::OperatorHandle&, Stack* s) {
  // In place: the argument itself is the result.
  (void)s;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd): mean and
// rstd have the input's leading dims and a 1 for each normalized one.
void native_layer_norm_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 5);
  const at::Tensor input = a[0].toTensor();
  const std::vector<int64_t> normalized = ints_of(a[1]);
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  TORCH_CHECK(axis >= 0, "native_layer_norm (meta): normalized_shape ", c10::IntArrayRef(normalized),
              " has more dims than the input ", input.sizes());
  std::vector<int64_t> stat(input.sizes().begin(), input.sizes().begin() + axis);
  stat.resize(static_cast<size_t>(input.dim()), 1);
  const auto stat_dtype = (input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16) ? at::kFloat : input.scalar_type();
  s->emplace_back(at::empty_like(input, at::MemoryFormat::Contiguous));
  s->emplace_back(at::empty(stat, input.options().dtype(stat_dtype)));
  s->emplace_back(at::empty(stat, input.options().dtype(stat_dtype)));
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input, grad_weight, grad_bias), each only where asked for.
void native_layer_norm_backward_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 8);
  const at::Tensor input = a[1].toTensor();
  const at::Tensor weight = optional_tensor(a[5]);
  const at::Tensor bias = optional_tensor(a[6]);
  const std::vector<bool> mask = a[7].toBoolList().vec();
  s->emplace_back(mask.at(0) ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor());
  s->emplace_back(mask.at(1) && weight.defined() ? at::empty_like(weight, at::MemoryFormat::Contiguous) : at::Tensor());
  s->emplace_back(mask.at(2) && bias.defined() ? at::empty_like(bias, at::MemoryFormat::Contiguous) : at::Tensor());
}

// index_select(self, dim, index): self's shape with dim's size replaced by the index count.
void index_select_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 3);
  const at::Tensor self = a[0].toTensor();
  const at::Tensor index = a[2].toTensor();
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector, got ", index.dim(), " dims");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index, got ", index.scalar_type());
  std::vector<int64_t> shape = self.sizes().vec();
  if (self.dim() > 0) shape[static_cast<size_t>(c10::maybe_wrap_dim(a[1].toInt(), self.dim()))] = index.numel();
  s->emplace_back(at::empty(shape, self.options()));
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
// [num_weights, embedding_dim].
void embedding_dense_backward_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 5);
  const at::Tensor grad = a[0].toTensor();
  s->emplace_back(at::empty({int_of(a[2]), grad.size(-1)}, grad.options()));
}

// native_dropout(input, p, train?) -> (output, mask).
void native_dropout_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 3);
  const at::Tensor input = a[0].toTensor();
  s->emplace_back(at::empty_like(input, at::MemoryFormat::Contiguous));
  s->emplace_back(at::empty_like(input, input.options().dtype(at::kBool), at::MemoryFormat::Contiguous));
}

// native_dropout_backward(grad_output, mask, scale).
void native_dropout_backward_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 3);
  s->emplace_back(at::empty_like(a[0].toTensor(), at::MemoryFormat::Contiguous));
}

// logical_not.out(self, out).
void logical_not_out_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 2);
  const at::Tensor out = a[1].toTensor();
  become(out, elementwise_output({a[0].toTensor()}, out.scalar_type()));
  s->emplace_back(out);
}

// logical_and/or/xor.out(self, other, out): the broadcast shape.
void logical_binary_out_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 3);
  const at::Tensor out = a[2].toTensor();
  become(out, elementwise_output({a[0].toTensor(), a[1].toTensor()}, out.scalar_type()));
  s->emplace_back(out);
}

// where.self(condition, self, other): the three broadcast; the dtype self and other promote to.
void where_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 3);
  const at::Tensor self = a[1].toTensor(), other = a[2].toTensor();
  s->emplace_back(elementwise_output({a[0].toTensor(), self, other}, at::result_type(self, other)));
}

// where.self_out(condition, self, other, out) (2.x's _safe_softmax calls it directly).
void where_out_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 4);
  const at::Tensor out = a[3].toTensor();
  become(out, elementwise_output({a[0].toTensor(), a[1].toTensor(), a[2].toTensor()}, out.scalar_type()));
  s->emplace_back(out);
}

// An empty tensor of `sizes` whose dims are laid out in memory in the order of `like`'s (by
// decreasing stride), as the CPU kernels lay out outputs like their inputs: a later
// .contiguous() of a transposed result is then a copy, or not, as on the CPU.
at::Tensor empty_in_layout_of(const at::Tensor& like, c10::IntArrayRef sizes, const at::TensorOptions& options) {
  const int64_t n = like.dim();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t d = 0; d < n; ++d) order[static_cast<size_t>(d)] = d;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> laid_out, inverse(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    laid_out.push_back(sizes[static_cast<size_t>(order[static_cast<size_t>(i)])]);
    inverse[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  }
  return at::empty(laid_out, options).permute(inverse);
}

// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *,
// attn_mask?, scale?) -> (output [B, H, L, Ev] in the query's dtype and memory layout,
// logsumexp [B, H, L] laid out as [B, L, H], float for reduced-precision queries).
void flash_attention_cpu_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 7);
  const at::Tensor q = a[0].toTensor(), v = a[2].toTensor();
  // Refused where the CPU kernel refuses it.
  TORCH_CHECK(a[3].toDouble() == 0.0, "_scaled_dot_product_flash_attention_for_cpu (meta): dropout > 0 is not supported, "
              "as by the CPU kernel");
  TORCH_CHECK(q.dim() == 4 && v.dim() == 4, "_scaled_dot_product_flash_attention_for_cpu (meta): expected 4-D query and "
              "value, got ", q.sizes(), " and ", v.sizes());
  const auto lse_dtype = (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) ? at::kFloat : q.scalar_type();
  s->emplace_back(empty_in_layout_of(q, {q.size(0), q.size(1), q.size(2), v.size(3)}, q.options()));
  s->emplace_back(at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(lse_dtype)).transpose(1, 2));
}

// _scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
// logsumexp, dropout_p, is_causal, *, attn_mask?, scale?) -> (grad_query, grad_key, grad_value),
// each of its input's shape.
void flash_attention_cpu_backward_meta(const c10::OperatorHandle&, Stack* s) {
  auto a = pop_args(s, 10);
  // The CPU kernel lays each gradient out as [B, L, H, E], whatever its input's layout.
  for (int i = 1; i <= 3; ++i) {
    const at::Tensor t = a[static_cast<size_t>(i)].toTensor();
    s->emplace_back(at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2));
  }
}

template <void (*F)(const c10::OperatorHandle&, Stack*)>
torch::CppFunction boxed() {
  return torch::CppFunction::makeFromBoxedFunction<F>();
}

const bool registered = [] {
  static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
  // `name`: the op and its overload, as the Library takes it ("logical_not.out"); a literal.
  auto add = [&](const char* name, torch::CppFunction fn) {
    const std::string full(name);
    const size_t dot = full.find('.');
    const std::string overload = dot == std::string::npos ? std::string() : full.substr(dot + 1);
    auto op = c10::Dispatcher::singleton().findSchema({"aten::" + full.substr(0, dot), overload});
    if (!op.has_value() || op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) return;
    lib.impl(name, std::move(fn));
  };
  add("relu", boxed<&relu_meta>());
  add("relu_", boxed<&relu_inplace_meta>());
  add("native_layer_norm", boxed<&native_layer_norm_meta>());
  add("native_layer_norm_backward", boxed<&native_layer_norm_backward_meta>());
  add("index_select", boxed<&index_select_meta>());
  add("embedding_dense_backward", boxed<&embedding_dense_backward_meta>());
  add("native_dropout", boxed<&native_dropout_meta>());
  add("native_dropout_backward", boxed<&native_dropout_backward_meta>());
  add("logical_not.out", boxed<&logical_not_out_meta>());
  add("logical_and.out", boxed<&logical_binary_out_meta>());
  add("logical_or.out", boxed<&logical_binary_out_meta>());
  add("logical_xor.out", boxed<&logical_binary_out_meta>());
  add("where.self", boxed<&where_meta>());
  add("where.self_out", boxed<&where_out_meta>());
  add("_scaled_dot_product_flash_attention_for_cpu", boxed<&flash_attention_cpu_meta>());
  add("_scaled_dot_product_flash_attention_for_cpu_backward", boxed<&flash_attention_cpu_backward_meta>());
  return true;
}();

}  // namespace
}  // namespace dtensor
