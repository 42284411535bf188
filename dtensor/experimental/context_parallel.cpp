// dtensor/experimental/context_parallel.cpp: see NOTE: [Context parallel].
#include "dtensor/experimental/context_parallel.h"

#include "dtensor/experimental/load_balancer.h"
#include "dtensor/experimental/ring_attention.h"
#include "dtensor/nn/functional_internal.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>

namespace dtensor {
namespace experimental {

namespace {

namespace F = nn::functional;

bool& scope_open() {
  thread_local bool open = false;
  return open;
}

// The number of pieces the layout cuts a sequence into.
int64_t pieces(int64_t world, const ContextParallelOptions& o) { return o.load_balance ? 2 * world : world; }

// This rank's part of `t` along `dim`.
at::Tensor local_part(const at::Tensor& t, int64_t dim, int64_t world, int64_t rank, const ContextParallelOptions& o) {
  if (o.load_balance) return HeadTailLoadBalancer(t.size(dim), world).shard(t, dim, rank);
  const int64_t n = t.size(dim) / world;
  return t.narrow(dim, rank * n, n).clone(at::MemoryFormat::Contiguous);
}

void check_buffers(const DeviceMesh& mesh, const std::vector<at::Tensor>& buffers, const std::vector<int64_t>& dims,
                   const std::vector<at::Tensor>& no_restore, const ContextParallelOptions& o) {
  TORCH_CHECK(!scope_open(), "context_parallel: a context_parallel scope is already open on this thread");
  TORCH_CHECK(mesh.ndim() == 1, "context_parallel: the mesh must be 1-D (pass mesh[\"cp\"] of a larger one), got ",
              mesh.ndim(), " dims");
  TORCH_CHECK(buffers.size() == dims.size(), "context_parallel: ", buffers.size(), " buffers but ", dims.size(),
              " buffer_seq_dims; give one sequence dim per buffer");
  const int64_t world = mesh.size();
  for (size_t i = 0; i < buffers.size(); ++i) {
    const at::Tensor& b = buffers[i];
    const std::string what = "context_parallel: buffer " + std::to_string(i);
    TORCH_CHECK(b.defined(), what, " is undefined");
    TORCH_CHECK(dims[i] >= -b.dim() && dims[i] < b.dim(), what, " of shape ", b.sizes(), " has no dim ", dims[i]);
    TORCH_CHECK(!b.requires_grad(), what, " requires grad; context_parallel shards inputs (tokens, labels, "
                "positional tables), not parameters");
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK(!buffers[j].is_same(b), what, " is buffer ", j, " again; give each tensor once");
    }
    const int64_t n = b.size(c10::maybe_wrap_dim(dims[i], b.dim()));
    TORCH_CHECK(n % pieces(world, o) == 0, what, " has sequence length ", n, " along dim ", dims[i],
                ", not divisible by ", pieces(world, o), o.load_balance ? " (2 chunks per rank for the head-tail "
                "load balancer, over " : " (one chunk per rank, over ", world, " ranks)");
  }
  for (const auto& t : no_restore) {
    bool found = false;
    for (const auto& b : buffers) found = found || b.is_same(t);
    TORCH_CHECK(found, "context_parallel: a tensor in no_restore_buffers is not one of the buffers");
  }
}

}  // namespace

struct ContextParallel::Impl {
  std::vector<at::Tensor> buffers;
  // What each buffer held before (undefined for a buffer in no_restore_buffers).
  std::vector<at::Tensor> originals;
  F::detail::AttentionOverride previous;
};

ContextParallel::ContextParallel(const DeviceMesh& mesh, std::vector<at::Tensor> buffers,
                                 std::vector<int64_t> buffer_seq_dims, std::vector<at::Tensor> no_restore_buffers,
                                 ContextParallelOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_buffers(mesh, buffers, buffer_seq_dims, no_restore_buffers, options);
  const int64_t world = mesh.size(), rank = mesh.get_local_rank();
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) {
      at::Tensor& b = buffers[i];
      bool restore = true;
      for (const auto& t : no_restore_buffers) restore = restore && !b.is_same(t);
      impl_->originals.push_back(restore ? b.detach() : at::Tensor());
      const at::Tensor part = local_part(b, c10::maybe_wrap_dim(buffer_seq_dims[i], b.dim()), world, rank, options);
      b.set_(part);
    }
  }
  impl_->buffers = std::move(buffers);
  comm::GroupPtr group = mesh.get_group();
  impl_->previous = F::detail::exchange_attention_override(
      [group, options](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                       double dropout_p, bool is_causal) {
        TORCH_CHECK(!mask.defined(), "scaled_dot_product_attention under context_parallel: attn_mask is not "
                    "supported by ring attention (the sequence is sharded); use is_causal");
        TORCH_CHECK(dropout_p == 0.0, "scaled_dot_product_attention under context_parallel: dropout_p = ", dropout_p,
                    " is not supported by ring attention");
        RingAttentionOptions o;
        o.is_causal = is_causal;
        o.load_balanced = options.load_balance;
        return ring_attention(q, k, v, group, o);
      });
  scope_open() = true;
}

ContextParallel::~ContextParallel() {
  F::detail::exchange_attention_override(std::move(impl_->previous));
  scope_open() = false;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < impl_->buffers.size(); ++i)
    if (impl_->originals[i].defined()) impl_->buffers[i].set_(impl_->originals[i]);
}

ContextParallel context_parallel(const DeviceMesh& mesh, std::vector<at::Tensor> buffers,
                                 std::vector<int64_t> buffer_seq_dims, std::vector<at::Tensor> no_restore_buffers,
                                 ContextParallelOptions options) {
  return ContextParallel(mesh, std::move(buffers), std::move(buffer_seq_dims), std::move(no_restore_buffers), options);
}

std::vector<at::Tensor> context_parallel_unshard(const DeviceMesh& mesh, const std::vector<at::Tensor>& buffers,
                                                 const std::vector<int64_t>& seq_dims,
                                                 ContextParallelOptions options) {
  TORCH_CHECK(mesh.ndim() == 1, "context_parallel_unshard: the mesh must be 1-D, got ", mesh.ndim(), " dims");
  TORCH_CHECK(buffers.size() == seq_dims.size(), "context_parallel_unshard: ", buffers.size(), " buffers but ",
              seq_dims.size(), " seq_dims");
  const int64_t world = mesh.size();
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const at::Tensor& b = buffers[i];
    const int64_t d = c10::maybe_wrap_dim(seq_dims[i], b.dim());
    const at::Tensor local = b.detach().movedim(d, 0).contiguous();
    std::vector<int64_t> sizes = local.sizes().vec();
    sizes[0] *= world;
    at::Tensor gathered = at::empty(sizes, local.options());
    mesh.get_group()->all_gather_into(gathered, local);
    gathered = gathered.movedim(0, d);
    if (options.load_balance && world > 1) gathered = HeadTailLoadBalancer(sizes[0], world).unshard(gathered, d);
    out.push_back(gathered.contiguous());
  }
  return out;
}

}  // namespace experimental
}  // namespace dtensor
