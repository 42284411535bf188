// dtensor/parallel/fused_matmul.cpp: NOTE: [Pipelined collective matmul] (fused_matmul.h).
#include "dtensor/parallel/fused_matmul.h"

#include "dtensor/compat.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <string>
#include <vector>

namespace dtensor {

namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

// Checks the operands of `op` and returns `dim` wrapped into [0, a.dim() - 1).
int64_t check_operands(const char* op, const char* dim_name, const at::Tensor& a, const at::Tensor& b,
                       int64_t dim, const comm::GroupPtr& group) {
  TORCH_CHECK(group != nullptr, op, ": the group is null");
  TORCH_CHECK(a.defined() && b.defined(), op, ": a and b must be defined tensors");
  TORCH_CHECK(a.dim() >= 2, op, ": a must have at least 2 dims, got a of shape ", a.sizes());
  TORCH_CHECK(b.dim() == 2, op, ": b must be 2-D [k, n], got b of shape ", b.sizes());
  TORCH_CHECK(a.size(-1) == b.size(0), op, ": a's last dim (", a.size(-1), ") must equal b's first (", b.size(0),
              "); a is ", a.sizes(), ", b is ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": a is ", a.scalar_type(), " but b is ", b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), op, ": a is on ", a.device(), " but b is on ", b.device());
  TORCH_CHECK(dim >= -a.dim() && dim < a.dim(), op, ": ", dim_name, " ", dim, " is out of range for a of ", a.dim(),
              " dims");
  const int64_t wrapped = dim < 0 ? dim + a.dim() : dim;
  TORCH_CHECK(wrapped != a.dim() - 1, op, ": ", dim_name, " ", dim,
              " is a's last dim, the one the matmul contracts; use another dim");
  return wrapped;
}

// The rows of `x` along `dim` bound for block k of n.
at::Tensor block(const at::Tensor& x, int64_t dim, int64_t k, int64_t n) {
  const int64_t len = x.size(dim) / n;
  return x.narrow(dim, k * len, len);
}

// sum over blocks k of a_k^T @ g_k, each flattened to [rows, features]: the gradient of b
// when the rows of `a` (blocks of a gathered tensor) met `b` in a matmul whose output gradient
// is `g`, split the same way.
at::Tensor grad_of_b(const std::vector<at::Tensor>& a_blocks, const std::vector<at::Tensor>& g_blocks) {
  at::Tensor out;
  for (size_t k = 0; k < a_blocks.size(); ++k) {
    // flatten, not reshape(-1, features): an uneven shard may have no features at all.
    const at::Tensor a2 = a_blocks[k].flatten(0, -2);
    const at::Tensor g2 = g_blocks[k].flatten(0, -2);
    if (out.defined()) out.addmm_(a2.t(), g2);
    else out = at::mm(a2.t(), g2);
  }
  return out;
}

struct Gathered {
  std::vector<at::Tensor> blocks;  // every rank's a_shard, in rank order
  at::Tensor out;                  // cat(blocks, dim) @ b
};

// The forward of fused_all_gather_matmul, without autograd.
Gathered all_gather_matmul(const at::Tensor& a_shard, const at::Tensor& b, int64_t dim, comm::Group& group) {
  const int n = group.size(), me = group.rank();
  std::vector<int64_t> shape{n};
  for (int64_t s : a_shard.sizes()) shape.push_back(s);
  at::Tensor buffer = at::empty(shape, a_shard.options());
  buffer.select(0, me).copy_(a_shard);
  Gathered g;
  std::vector<comm::WorkPtr> works;
  for (int k = 0; k < n; ++k) {
    g.blocks.push_back(buffer.select(0, k));
    works.push_back(group.broadcast_async(g.blocks.back(), k));
  }
  // This rank's block needs no communication; the others arrive in issue (rank) order.
  std::vector<at::Tensor> outs(n);
  outs[me] = at::matmul(g.blocks[me], b);
  for (int k = 0; k < n; ++k) {
    if (k == me) continue;
    works[k]->wait();
    outs[k] = at::matmul(g.blocks[k], b);
  }
  works[me]->wait();  // this rank's own broadcast: its peers may still be receiving it
  g.out = at::cat(outs, dim);
  return g;
}

// The forward of fused_matmul_reduce_scatter, without autograd.
at::Tensor matmul_reduce_scatter(const at::Tensor& a, const at::Tensor& b, int64_t dim, comm::Group& group) {
  const int n = group.size(), me = group.rank();
  std::vector<at::Tensor> partials(n), received;
  std::vector<comm::WorkPtr> works;
  for (int k = 0; k < n; ++k) {
    partials[k] = at::matmul(block(a, dim, k, n), b).contiguous();
    if (k == me)
      for (int r = 0; r < n; ++r) received.push_back(at::empty_like(partials[k]));
    works.push_back(group.gather_async(partials[k], k == me ? received : std::vector<at::Tensor>{}, k));
  }
  comm::wait_all(works);
  at::Tensor out = received[0].clone();
  for (int r = 1; r < n; ++r) out.add_(received[r]);
  return out;
}

// A node with the two inputs a and b.
struct FusedMatmulBackward : Node {
  comm::GroupPtr group;
  int64_t dim = 0;
  at::Tensor b;                    // detached
  std::vector<at::Tensor> blocks;  // all-gather-matmul: the gathered a; matmul-reduce-scatter: a's blocks
  bool all_gather = true;
  std::string name() const override {
    return all_gather ? "dtensor::FusedAllGatherMatmulBackward" : "dtensor::FusedMatmulReduceScatterBackward";
  }
  variable_list apply(variable_list&& grads) override {
    at::Tensor g = grads[0];
    if (!g.defined()) return {at::Tensor(), at::Tensor()};
    at::NoGradGuard no_grad;
    const int64_t n = group->size();
    at::Tensor grad_a, grad_b;
    if (all_gather) {
      // out = gathered(a) @ b: grad_a = reduce_scatter(g @ b^T), grad_b = gathered(a)^T @ g.
      if (should_compute_output(0)) grad_a = matmul_reduce_scatter(g, b.t(), dim, *group);
      if (should_compute_output(1)) {
        std::vector<at::Tensor> g_blocks;
        for (int64_t k = 0; k < n; ++k) g_blocks.push_back(block(g, dim, k, n));
        grad_b = grad_of_b(blocks, g_blocks);
      }
    } else {
      // out = reduce_scatter(a @ b): grad_a = gathered(g) @ b^T, grad_b = a^T @ gathered(g).
      Gathered gg = all_gather_matmul(g, b.t(), dim, *group);
      if (should_compute_output(0)) grad_a = gg.out;
      if (should_compute_output(1)) grad_b = grad_of_b(blocks, gg.blocks);
    }
    return {grad_a, grad_b};
  }
};

// Makes `node` the grad_fn of `out` (a and b are its inputs).
template <class NodePtr>
at::Tensor attach(at::Tensor out, const at::Tensor& a, const at::Tensor& b, NodePtr node) {
  if (!at::GradMode::is_enabled() || !(a.requires_grad() || b.requires_grad())) return out;
  node->set_next_edges(torch::autograd::collect_next_edges(a, b));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace

at::Tensor fused_all_gather_matmul(const at::Tensor& a_shard, const at::Tensor& b, int64_t gather_dim,
                                   const comm::GroupPtr& group) {
  const int64_t dim = check_operands("fused_all_gather_matmul", "gather_dim", a_shard, b, gather_dim, group);
  const bool grad = at::GradMode::is_enabled() && (a_shard.requires_grad() || b.requires_grad());
  Gathered g;
  {
    at::NoGradGuard no_grad;
    g = all_gather_matmul(a_shard.detach(), b.detach(), dim, *group);
  }
  if (!grad) return g.out;
  auto node = compat::make_node<FusedMatmulBackward>();
  node->group = group;
  node->dim = dim;
  node->b = b.detach();
  node->blocks = b.requires_grad() ? std::move(g.blocks) : std::vector<at::Tensor>{};
  node->all_gather = true;
  return attach(g.out, a_shard, b, node);
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& a, const at::Tensor& b, int64_t scatter_dim,
                                       const comm::GroupPtr& group) {
  const int64_t dim = check_operands("fused_matmul_reduce_scatter", "scatter_dim", a, b, scatter_dim, group);
  const int64_t n = group->size();
  TORCH_CHECK(a.size(dim) % n == 0, "fused_matmul_reduce_scatter: a.size(", dim, ") = ", a.size(dim),
              " is not divisible by the group size ", n, " (a is ", a.sizes(), ")");
  const bool grad = at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad());
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = matmul_reduce_scatter(a.detach(), b.detach(), dim, *group);
  }
  if (!grad) return out;
  auto node = compat::make_node<FusedMatmulBackward>();
  node->group = group;
  node->dim = dim;
  node->b = b.detach();
  if (b.requires_grad())
    for (int64_t k = 0; k < n; ++k) node->blocks.push_back(block(a.detach(), dim, k, n));
  node->all_gather = false;
  return attach(out, a, b, node);
}

}  // namespace dtensor
