// dtensor/experimental/ring_attention.cpp: see NOTE: [Ring attention].
#include "dtensor/experimental/ring_attention.h"

#include "dtensor/comm/work.h"
#include "dtensor/experimental/load_balancer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

namespace dtensor {
namespace experimental {

namespace {

// The ring of a group: every rank sends to the next and receives from the previous one.
class Ring {
 public:
  explicit Ring(comm::GroupPtr group) : group_(std::move(group)), w_(group_->size()), r_(group_->rank()) {}
  int64_t size() const { return w_; }
  int64_t rank() const { return r_; }
  // The rank whose keys/values this rank holds at step i.
  int64_t source(int64_t step) const { return (r_ - step + w_) % w_; }

  // Starts sending the 1-D `buf` to the next rank; returns the buffer the previous rank's
  // arrives in and the work to wait for (none on a ring of one).
  std::pair<at::Tensor, comm::WorkPtr> start_shift(const at::Tensor& buf) const {
    if (w_ == 1) return {buf, nullptr};
    at::Tensor out = at::empty_like(buf);
    std::vector<int64_t> in_splits(w_, 0), out_splits(w_, 0);
    in_splits[(r_ + 1) % w_] = buf.numel();
    out_splits[(r_ - 1 + w_) % w_] = buf.numel();
    comm::WorkPtr work = group_->all_to_all_single_async(out, buf, out_splits, in_splits);
    return {out, std::move(work)};
  }

  const comm::GroupPtr& group() const { return group_; }

 private:
  comm::GroupPtr group_;
  int64_t w_;
  int64_t r_;
};

// The rows of the local queries and of the visiting keys one step computes; `masked`: the
// causal mask by global positions applies (step 0 only).
struct Block {
  int64_t q0, qn, k0, kn;
  bool masked;
};

// NOTE: [Ring attention] says which block each step computes.
std::optional<Block> block_of(const Ring& ring, int64_t source, int64_t L, int64_t S, const RingAttentionOptions& o) {
  const int64_t r = ring.rank();
  if (!o.is_causal) return Block{0, L, 0, S, false};
  if (source == r) return Block{0, L, 0, S, true};
  if (o.load_balanced) return source < r ? Block{0, L, 0, S / 2, false} : Block{L / 2, L / 2, 0, S, false};
  if (source < r) return Block{0, L, 0, S, false};
  return std::nullopt;
}

// The causal mask of step 0 ([L, L], true where a query may attend): by the tokens' global
// positions in the head-tail layout, or plain lower-triangular for contiguous shards.
at::Tensor own_mask(const Ring& ring, int64_t L, bool load_balanced) {
  const at::Tensor pos = load_balanced && ring.size() > 1 ? HeadTailLoadBalancer(L * ring.size(), ring.size()).positions(ring.rank())
                                       : at::arange(L, at::kLong);
  return pos.unsqueeze(1) >= pos.unsqueeze(0);
}

// State the backward needs besides the saved tensors.
struct RingState : torch::CustomClassHolder {
  RingState(comm::GroupPtr g, RingAttentionOptions o) : ring(std::move(g)), options(o) {}
  Ring ring;
  RingAttentionOptions options;
};

// The keys and values as one flat float32 buffer, and views back into one.
struct KVLayout {
  c10::IntArrayRef k_sizes, v_sizes;
  int64_t nk;
  at::Tensor k(const at::Tensor& flat) const { return flat.narrow(0, 0, nk).view(k_sizes); }
  at::Tensor v(const at::Tensor& flat) const { return flat.narrow(0, nk, flat.numel() - nk).view(v_sizes); }
};

at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, double scale) {
  at::Tensor s = at::matmul(q, k.transpose(-2, -1)).mul_(scale);
  if (mask.defined()) s.masked_fill_(mask.logical_not(), -std::numeric_limits<float>::infinity());
  return s;
}

// One block's output and log-sum-exp per query.
std::pair<at::Tensor, at::Tensor> forward_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const at::Tensor& mask, double scale) {
  const at::Tensor s = scores(q, k, mask, scale);
  at::Tensor lse = at::logsumexp(s, -1);
  return {at::matmul(at::exp(s - lse.unsqueeze(-1)), v), lse};
}

// Merges a block's output and log-sum-exp into out/lse (views of the rows it covers).
void merge(at::Tensor out, at::Tensor lse, const at::Tensor& out_b, const at::Tensor& lse_b) {
  out.sub_(at::sigmoid(lse_b - lse).unsqueeze(-1) * (out - out_b));
  lse.sub_(at::log_sigmoid(lse - lse_b));
}

std::pair<at::Tensor, at::Tensor> ring_forward(const Ring& ring, const RingAttentionOptions& o, const at::Tensor& q,
                                               const at::Tensor& k, const at::Tensor& v) {
  const int64_t L = q.size(-2), S = k.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const KVLayout layout{k.sizes(), v.sizes(), k.numel()};
  const at::Tensor mask = o.is_causal ? own_mask(ring, L, o.load_balanced) : at::Tensor();
  at::Tensor out, lse;
  at::Tensor kv = at::cat({k.reshape(-1), v.reshape(-1)});
  for (int64_t i = 0; i < ring.size(); ++i) {
    std::pair<at::Tensor, comm::WorkPtr> next;
    if (i + 1 < ring.size()) next = ring.start_shift(kv);
    if (auto b = block_of(ring, ring.source(i), L, S, o)) {
      auto [out_b, lse_b] = forward_block(q.narrow(-2, b->q0, b->qn), layout.k(kv).narrow(-2, b->k0, b->kn),
                                          layout.v(kv).narrow(-2, b->k0, b->kn), b->masked ? mask : at::Tensor(), scale);
      // Step 0's block (this rank's own keys) covers every query: it starts the merge.
      if (i == 0) std::tie(out, lse) = std::make_pair(out_b, lse_b);
      else merge(out.narrow(-2, b->q0, b->qn), lse.narrow(-1, b->q0, b->qn), out_b, lse_b);
    }
    if (next.second) next.second->wait();
    if (next.first.defined()) kv = next.first;
  }
  return {out, lse};
}

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, c10::intrusive_ptr<RingState> state) {
    const at::Tensor q = query.to(at::kFloat), k = key.to(at::kFloat), v = value.to(at::kFloat);
    auto [out, lse] = ring_forward(state->ring, state->options, q, k, v);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    ctx->saved_data["dtypes"] = std::vector<int64_t>{static_cast<int64_t>(query.scalar_type()),
                                                     static_cast<int64_t>(key.scalar_type()),
                                                     static_cast<int64_t>(value.scalar_type())};
    return out.to(query.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

// One block's gradient: adds to dq, dk, dv (views of the rows it covers).
void backward_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                    double scale, const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta,
                    at::Tensor dq, at::Tensor dk, at::Tensor dv) {
  const at::Tensor p = at::exp(scores(q, k, mask, scale) - lse.unsqueeze(-1));
  dv.add_(at::matmul(p.transpose(-2, -1), dout));
  const at::Tensor ds = p * (at::matmul(dout, v.transpose(-2, -1)) - delta.unsqueeze(-1));
  dq.add_(at::matmul(ds, k).mul_(scale));
  dk.add_(at::matmul(ds.transpose(-2, -1), q).mul_(scale));
}

torch::autograd::variable_list RingAttentionFunction::backward(torch::autograd::AutogradContext* ctx,
                                                               torch::autograd::variable_list grads) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
  const auto state = c10::static_intrusive_pointer_cast<RingState>(ctx->saved_data["state"].toCapsule());
  const auto dtypes = ctx->saved_data["dtypes"].toIntVector();
  const Ring& ring = state->ring;
  const RingAttentionOptions& o = state->options;
  const int64_t L = q.size(-2), S = k.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  const KVLayout layout{k.sizes(), v.sizes(), k.numel()};
  const at::Tensor mask = o.is_causal ? own_mask(ring, L, o.load_balanced) : at::Tensor();
  const at::Tensor dout = grads[0].to(at::kFloat);
  const at::Tensor delta = (dout * out).sum(-1);
  at::Tensor dq = at::zeros_like(q);
  at::Tensor kv = at::cat({k.reshape(-1), v.reshape(-1)});
  at::Tensor dkv = at::zeros_like(kv);
  for (int64_t i = 0; i < ring.size(); ++i) {
    std::pair<at::Tensor, comm::WorkPtr> next;
    if (i + 1 < ring.size()) next = ring.start_shift(kv);
    if (auto b = block_of(ring, ring.source(i), L, S, o)) {
      auto rows = [&](const at::Tensor& t) { return t.narrow(-2, b->q0, b->qn); };
      auto keys = [&](const at::Tensor& t) { return t.narrow(-2, b->k0, b->kn); };
      backward_block(rows(q), keys(layout.k(kv)), keys(layout.v(kv)), b->masked ? mask : at::Tensor(), scale,
                     rows(dout), lse.narrow(-1, b->q0, b->qn), delta.narrow(-1, b->q0, b->qn), rows(dq),
                     keys(layout.k(dkv)), keys(layout.v(dkv)));
    }
    // These keys' gradient goes on with them: the next rank holds them at step i + 1, and after
    // the last step the next rank is their owner.
    auto dnext = ring.start_shift(dkv);
    if (next.second) next.second->wait();
    if (next.first.defined()) kv = next.first;
    if (dnext.second) dnext.second->wait();
    dkv = dnext.first;
  }
  return {dq.to(static_cast<at::ScalarType>(dtypes[0])),
          layout.k(dkv).to(static_cast<at::ScalarType>(dtypes[1])),
          layout.v(dkv).to(static_cast<at::ScalarType>(dtypes[2])), at::Tensor()};
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const Ring& ring,
                  const RingAttentionOptions& o) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "ring_attention: query, key and value must be defined");
  TORCH_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
              "ring_attention: expected query, key and value with the same number (>= 2) of dims, got ", q.sizes(),
              ", ", k.sizes(), ", ", v.sizes());
  const auto batch = q.sizes().slice(0, q.dim() - 2);
  TORCH_CHECK(k.sizes().slice(0, k.dim() - 2) == batch && v.sizes().slice(0, v.dim() - 2) == batch &&
                  k.size(-1) == q.size(-1) && v.size(-2) == k.size(-2),
              "ring_attention: query ", q.sizes(), ", key ", k.sizes(), " and value ", v.sizes(),
              " do not match (the same leading dims, key's last dim equal to query's, one value per key)");
  if (!o.is_causal) return;
  TORCH_CHECK(q.size(-2) == k.size(-2), "ring_attention: a causal mask needs queries and keys of one sequence; got ",
              q.size(-2), " queries and ", k.size(-2), " keys per rank");
  TORCH_CHECK(!o.load_balanced || ring.size() == 1 || q.size(-2) % 2 == 0, "ring_attention: the head-tail layout "
              "holds two chunks per rank, but the local sequence has odd length ", q.size(-2));
}

}  // namespace

at::Tensor ring_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const comm::GroupPtr& group, const RingAttentionOptions& options) {
  TORCH_CHECK(group, "ring_attention: no group");
  auto state = c10::make_intrusive<RingState>(group, options);
  check_inputs(query, key, value, state->ring, options);
  return RingAttentionFunction::apply(query, key, value, state);
}

}  // namespace experimental
}  // namespace dtensor
