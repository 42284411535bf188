// dtensor/compat.h
//
// The one place (with the comm adapter, dtensor/comm/c10d_group.cpp, where c10d's Backend
// split lives) where dtensor-cpp's code differs between the libtorch lines it builds against:
// libtorch 1.13 (Debian 12) and libtorch 2.x (Debian 13 ships 2.6). Code elsewhere calls these
// helpers instead of writing `#if` on the libtorch version.
//
//   #include <dtensor/compat.h>
//   at::Tensor out = dtensor::compat::scaled_dot_product_attention(q, k, v, mask, 0.0, true);
//   throw MyError(dtensor::compat::error_without_backtrace(msg));   // c10::Error subclass ctor
//   dtensor::compat::disable_libuv(tcp_store_options);             // before making a TCPStore
//
// What differs, and what each helper does about it:
//   - DTENSOR_TORCH_2: 1 against libtorch >= 2, else 0 (from <torch/version.h>).
//   - c10::Error's base constructor takes the backtrace as std::string in 1.13 and as a lazy
//     c10::Backtrace in 2.x: error_without_backtrace(msg) builds a c10::Error with none.
//   - Attention: 1.13 has at::_scaled_dot_product_attention(q, k, v, mask, dropout_p,
//     need_attn_weights, is_causal) -> (out, weights), whose fused path is
//     aten::_scaled_dot_product_attention_forward; 2.x has at::scaled_dot_product_attention(q, k,
//     v, mask, dropout_p, is_causal) -> out, which on CPU picks a kernel with aten::_fused_sdp_choice
//     and runs aten::_scaled_dot_product_flash_attention_for_cpu (or the math decomposition).
//     scaled_dot_product_attention() is the public op on either line; kSdpaFusedOp and
//     kSdpaSampleOps name the aten ops involved (for sharding rules and op samples).
//   - TCPStore: 2.x defaults TCPStoreOptions::useLibUV to true, and Debian's libtorch 2.6 has no
//     libuv backend; disable_libuv(opts) turns it off (a no-op on 1.13, which has no such field).
//   - c10::Allocator: allocate() is const in 1.13 and not in 2.x, and 2.x adds the pure virtual
//     copy_data(). Derive from compat::Allocator and implement do_allocate() instead.
//   - Autograd nodes: libtorch up to 2.1x holds a torch::autograd::Node in a std::shared_ptr
//     (made with the deleter torch::autograd::deleteNode); newer ones (PyTorch's "Convert
//     shared_ptr<Node> to intrusive_ptr<Node>", in the 2.15 wheel) in a c10::intrusive_ptr, and
//     deleteNode is gone. make_node<N>() makes a node in whichever the libtorch uses, told
//     apart by the type of Edge::function, so no version number is guessed.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#include <torch/version.h>

#include <c10/util/intrusive_ptr.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#define DTENSOR_TORCH_2 1
#else
#define DTENSOR_TORCH_2 0
#endif

namespace dtensor {
namespace compat {

// "1.13.0", "2.6.0": the libtorch version dtensor-cpp was compiled against.
inline constexpr const char* kTorchVersion = TORCH_VERSION;

// A c10::Error carrying `msg` and no C++ backtrace (for subclasses' constructors).
inline c10::Error error_without_backtrace(std::string msg) {
#if DTENSOR_TORCH_2
  return c10::Error(std::move(msg), /*backtrace=*/nullptr);
#else
  return c10::Error(std::move(msg), /*backtrace=*/std::string());
#endif
}

// torch.nn.functional.scaled_dot_product_attention's output (the same values on both lines).
// Defined in dtensor/compat.cpp so that only one TU includes the attention op headers.
at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const c10::optional<at::Tensor>& attn_mask, double dropout_p,
                                        bool is_causal);

// The fused op below on its own (bypassing libtorch's kernel choice); returns its output.
at::Tensor sdpa_fused(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const c10::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal);

// The public attention op's aten name (2.x: scaled_dot_product_attention -> output; 1.13:
// _scaled_dot_product_attention -> (output, weights)).
#if DTENSOR_TORCH_2
inline constexpr const char* kSdpaPublicOp = "aten::scaled_dot_product_attention";
#else
inline constexpr const char* kSdpaPublicOp = "aten::_scaled_dot_product_attention";
#endif

// Boxed arguments of the public or the fused op (for op samples): q, k, v and then the rest in
// that op's order, keyword-only ones (2.x's fused attn_mask) in `kwargs`. need_attn_weights
// exists on 1.13 only (2.x's fused op always returns its second output, the logsumexp).
enum class SdpaOp { kPublic, kFused };
struct SdpaArgs {
  std::vector<c10::IValue> args;
  std::vector<std::pair<std::string, c10::IValue>> kwargs;
};
SdpaArgs sdpa_args(SdpaOp op, std::vector<c10::IValue> qkv, c10::IValue attn_mask, double dropout_p,
                   bool need_attn_weights, bool is_causal);

// The fused aten op scaled_dot_product_attention runs on CPU when no fallback is forced
// (NOTE: [Attention forward] in dtensor/ops/matrix_rules.cpp), and its argument positions.
#if DTENSOR_TORCH_2
inline constexpr const char* kSdpaFusedOp = "aten::_scaled_dot_product_flash_attention_for_cpu";
// (query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)
inline constexpr int kSdpaDropoutArg = 3, kSdpaCausalArg = 4, kSdpaMaskArg = 5;
#else
inline constexpr const char* kSdpaFusedOp = "aten::_scaled_dot_product_attention_forward";
// (query, key, value, attn_mask, dropout_p, need_attn_weights, is_causal) -> (output, weights)
inline constexpr int kSdpaDropoutArg = 4, kSdpaCausalArg = 6, kSdpaMaskArg = 3;
#endif

// The fused op's backward where it has one (2.x: (grad_out, q, k, v, out, logsumexp, dropout_p,
// is_causal, *, attn_mask, scale) -> (grad_q, grad_k, grad_v)); nullptr on 1.13.
#if DTENSOR_TORCH_2
inline constexpr const char* kSdpaFusedBackwardOp = "aten::_scaled_dot_product_flash_attention_for_cpu_backward";
inline constexpr int kSdpaBackwardCausalArg = 7;
#else
inline constexpr const char* kSdpaFusedBackwardOp = nullptr;
inline constexpr int kSdpaBackwardCausalArg = -1;
#endif

// 2.x: the op scaled_dot_product_attention asks which kernel to run (an int); nullptr on 1.13,
// whose attention has no such step.
#if DTENSOR_TORCH_2
inline constexpr const char* kSdpaChoiceOp = "aten::_fused_sdp_choice";
#else
inline constexpr const char* kSdpaChoiceOp = nullptr;
#endif

// Turns off TCPStore's libuv backend where the options have one (libtorch 2.x).
template <class TCPStoreOptions>
void disable_libuv(TCPStoreOptions& options) {
#if DTENSOR_TORCH_2
  options.useLibUV = false;
#else
  (void)options;
#endif
}

// A c10::Allocator whose subclasses implement do_allocate() on either line.
class Allocator : public c10::Allocator {
 public:
  virtual c10::DataPtr do_allocate(size_t n) const = 0;
#if DTENSOR_TORCH_2
  c10::DataPtr allocate(size_t n) override { return do_allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return do_allocate(n); }
#endif
};

namespace detail {
template <class P>
struct IsSharedPtr : std::false_type {};
template <class T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};
}  // namespace detail

// A new autograd node N (a subclass of torch::autograd::Node, default-constructed), held as
// this libtorch holds nodes: std::shared_ptr<N> or c10::intrusive_ptr<N>. Either converts to
// what torch::autograd::set_history and Edge take. Include <torch/csrc/autograd/function.h>
// before calling it.
template <class N>
auto make_node() {
  using NodeRef = decltype(std::declval<N&>().next_edge(0).function);
  if constexpr (detail::IsSharedPtr<NodeRef>::value) {
    // deleteNode (found by argument-dependent lookup in torch::autograd) frees long chains of
    // nodes without deep recursion, as libtorch's own nodes are freed.
    return std::shared_ptr<N>(new N(), [](N* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<N>();
  }
}

}  // namespace compat
}  // namespace dtensor
