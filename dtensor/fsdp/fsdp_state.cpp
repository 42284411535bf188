// dtensor/fsdp/fsdp_state.cpp: one fully_shard-ed group's state: its parameters, unshard and reshard
// (NOTE: [FSDP parameter layout], NOTE: [FSDP communication overlap]), the root and the trace.
#include "dtensor/fsdp/fsdp_state_internal.h"

#include "dtensor/comm/group.h"
#include "dtensor/debug/tracking_allocator_internal.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/utils/storage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <sstream>

namespace dtensor {
namespace fsdp {

namespace {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * std::max<int64_t>(shape[i + 1], 1);
  return strides;
}

// A tensor over `t`'s storage with its own version counter: writes through it do not bump the
// version of `t`, which autograd saved in forward (PyTorch: _unsafe_preserve_version_counter).
at::Tensor storage_alias(const at::Tensor& t) {
  at::NoGradGuard no_grad;
  return at::empty({0}, t.options().requires_grad(false)).set_(t.storage(), t.storage_offset(), t.sizes(), t.strides());
}


}  // namespace

std::string module_type(const torch::nn::Module& m) { return m.name(); }

std::string ReshardAfterForward::to_string() const {
  if (!is_int_) return value_ == -1 ? "true" : "false";
  return std::to_string(value_);
}

// ---- FSDPParam --------------------------------------------------------------------------

int64_t FSDPParam::rows_of(int64_t rank) const {
  return std::max<int64_t>(0, std::min(chunk, global_shape[shard_dim] - rank * chunk));
}

void FSDPParam::swap_into_modules(const at::Tensor& value) const {
  for (const auto& reg : regs) nn::swap_parameter(*reg.module, reg.name, value);
}

// ---- FSDPState --------------------------------------------------------------------------

FSDPState::FSDPState(torch::nn::Module& module, FullyShardOptions options, DeviceMesh mesh)
    : module_(&module), module_weak_(module.shared_from_this()), options_(std::move(options)), mesh_(std::move(mesh)) {
  const int64_t shard_mesh_dim = mesh_.ndim() - 1;
  shard_group_ = mesh_.get_group(shard_mesh_dim);
  shard_size_ = mesh_.size(shard_mesh_dim);
  shard_rank_ = mesh_.get_local_rank(shard_mesh_dim);
  if (mesh_.ndim() == 2) {
    replicate_group_ = mesh_.get_group(0);
    replicate_size_ = mesh_.size(0);
  }
  reshard_after_forward_ = options_.reshard_after_forward;
  device_ = mesh_.device_type() == "cpu" ? c10::Device(c10::kCPU) : c10::Device(mesh_.device_type());
}

bool FSDPState::holds_original(const c10::TensorImpl* impl) const {
  for (const auto& w : originals_) {
    if (!w.expired() && w._unsafe_get_target() == impl) return true;
  }
  return false;
}

std::vector<torch::nn::Module*> FSDPState::modules() const {
  std::vector<torch::nn::Module*> out{module_};
  for (const auto& m : more_modules_) out.push_back(m.first);
  return out;
}

bool FSDPState::is_group_module(const torch::nn::Module* module) const {
  if (module == module_) return module_alive() == module;
  for (const auto& m : more_modules_) {
    if (m.first == module) return !m.second.expired();
  }
  return false;
}

const torch::nn::Module* FSDPState::module_alive() const {
  auto m = module_weak_.lock();
  return m ? m.get() : nullptr;
}

std::vector<Placement> FSDPState::placements_for(int64_t shard_dim) const {
  if (mesh_.ndim() == 2) return {Replicate{}, Shard{shard_dim}};
  return {Shard{shard_dim}};
}

at::ScalarType FSDPState::compute_dtype() const {
  return options_.mp_policy.param_dtype.value_or(orig_dtype_);
}

at::ScalarType FSDPState::reduce_dtype() const {
  return options_.mp_policy.reduce_dtype.value_or(compute_dtype());
}

// NOTE: [FSDP after a dtype cast]
// torch::nn::Module::to(dtype) casts each registered parameter with set_data: between steps
// (sharded) that is the sharded DTensor, whose local tensor and spec take the new dtype, while
// the group's unsharded parameters, all-gather and gradient cast still have the old one.
// PyTorch's FSDPModule._apply calls FSDPParam.reset_sharded_param for this; libtorch's to() is
// not ours to override, so the group checks the sharded parameters' dtype before each
// all-gather and, when it changed, re-derives everything dtype-dependent from it: the original
// dtype (the dtype of the sharded gradients), the unsharded parameters (in the new dtype
// unless the mixed-precision policy fixes it), the tensor-parallel spec, and gradients
// accumulated without sync (into the new reduce dtype). Parameters cast to different dtypes
// are refused as fully_shard refuses them. A cast while the group is unsharded is not followed
// (the modules then hold the unsharded parameters, which to() would cast in place).
void FSDPState::follow_dtype_cast() {
  if (status_ != Status::kSharded || params_.empty()) return;
  const FSDPParam& first = params_.front();
  const at::ScalarType dt = local_tensor(first.sharded).scalar_type();
  bool changed = false;
  for (const auto& p : params_) {
    const at::ScalarType now = local_tensor(p.sharded).scalar_type();
    if (now != dt) {
      std::ostringstream msg;
      msg << "fully_shard(" << module_type(*module_) << "): parameters of one group must share a dtype (one flat "
          << "all-gather), but after a cast '" << first.fqn << "' is " << dt << " and '" << p.fqn << "' is " << now;
      TORCH_CHECK(false, msg.str());
    }
    changed = changed || now != p.orig_dtype;
  }
  if (!changed) return;
  orig_dtype_ = dt;
  for (auto& p : params_) {
    p.orig_dtype = dt;
    if (p.tp_spec) p.tp_spec->tensor_meta.dtype = dt;
    p.unsharded = at::empty(p.global_shape, p.unsharded.options().dtype(compute_dtype()));
    utils::free_storage(p.unsharded);
    p.unsharded_param = at::Tensor();
    if (!p.tp_spec) {
      p.unsharded_param = p.unsharded;
      if (p.requires_grad) p.unsharded_param.set_requires_grad(true);
    }
    if (p.accumulated_grad.defined()) p.accumulated_grad = p.accumulated_grad.to(reduce_dtype());
  }
}

// NOTE: [FSDP on the meta device]
// PyTorch builds a model too large for one rank on the meta device, shards it, then
// materialises only the shards: model.to_empty(device) and an init function. Here fully_shard
// shards meta parameters like any other (the sharded DTensors' local tensors are meta; the
// unsharded buffers are made on the mesh's device, with no storage until an all-gather), and
// nn::to_empty swaps in DTensors of the same specs over new local tensors. The group notices
// the swap (a module holds a tensor other than p.sharded) before it next reads its sharded
// parameters (an all-gather, sharded_parameters(), the state-dict functions) and adopts the
// new DTensor, as PyTorch's FSDPParam.reset_sharded_param does after Module._apply.
void FSDPState::follow_replaced_params() {
  if (status_ != Status::kSharded) return;
  for (auto& p : params_) {
    const Registration& reg = p.regs.front();
    const at::Tensor held = nn::get_parameter(*reg.module, reg.name);
    if (!held.defined() || held.unsafeGetTensorImpl() == p.sharded.unsafeGetTensorImpl()) continue;
    const DTensorSpec& was = get_spec(p.sharded);
    TORCH_CHECK(is_dtensor(held) && get_spec(held).mesh == was.mesh && get_spec(held).placements == was.placements &&
                    held.sizes() == p.sharded.sizes() && held.scalar_type() == p.sharded.scalar_type(),
                "fully_shard(", module_type(*module_), "): parameter '", p.fqn, "' was replaced by ",
                is_dtensor(held) ? "a DTensor of another layout" : "a plain tensor",
                "; replace a sharded parameter by a DTensor of the same mesh, placements, shape and dtype "
                "(dtensor::nn::to_empty makes those)");
    p.sharded = held;
    for (size_t k = 1; k < p.regs.size(); ++k) {  // tied registrations follow
      if (nn::get_parameter(*p.regs[k].module, p.regs[k].name).unsafeGetTensorImpl() != held.unsafeGetTensorImpl())
        nn::swap_parameter(*p.regs[k].module, p.regs[k].name, held);
    }
  }
}

void FSDPState::add_param(const std::string& fqn, std::vector<Registration> regs, const at::Tensor& tensor,
                          int64_t shard_dim, std::optional<TPSharding> tp) {
  FSDPParam p;
  p.fqn = fqn;
  p.regs = std::move(regs);
  p.shard_dim = shard_dim;
  if (tp) p.tp_spec = tp->tp_spec;
  p.global_shape = tensor.sizes().vec();
  p.orig_dtype = tensor.scalar_type();
  p.requires_grad = tp ? tp->requires_grad : tensor.requires_grad();
  const int64_t d = p.global_shape[shard_dim];
  p.chunk = (d + shard_size_ - 1) / shard_size_;
  p.padded_shard_shape = p.global_shape;
  p.padded_shard_shape[shard_dim] = p.chunk;
  p.padded_numel = 1;
  for (int64_t s : p.padded_shard_shape) p.padded_numel *= s;

  at::Tensor local;
  {
    at::NoGradGuard no_grad;
    const int64_t rows = p.rows_of(shard_rank_);
    local = tensor.detach().narrow(shard_dim, std::min(shard_rank_ * p.chunk, d), rows).clone(at::MemoryFormat::Contiguous);
    if (options_.offload_policy.offload) local = local.to(c10::Device(c10::kCPU));
  }
  if (tp) {
    // The 2-D DTensor: this rank's rows of its TP shard, on the parent mesh.
    TensorMeta meta = tp->tp_spec.tensor_meta;
    meta.storage_offset = 0;
    p.sharded = make_dtensor(local, DTensorSpec(tp->spmd_mesh, tp->spmd_placements, meta));
  } else {
    TensorMeta meta{p.global_shape, contiguous_strides(p.global_shape), p.orig_dtype, 0};
    p.sharded = make_dtensor(local, DTensorSpec(mesh_, placements_for(shard_dim), meta));
  }
  if (p.requires_grad) p.sharded.set_requires_grad(true);
  // The unsharded parameter: a leaf whose storage is allocated while unsharded; for a TP
  // parameter the TP DTensor leaf over it (its gradient: a DTensor, see post_backward).
  p.unsharded = at::empty(p.global_shape, tensor.options().dtype(compute_dtype()).device(device_).requires_grad(false));
  utils::free_storage(p.unsharded);
  if (!tp) {
    p.unsharded_param = p.unsharded;
    if (p.requires_grad) p.unsharded_param.set_requires_grad(true);
  }
  p.swap_into_modules(p.sharded);
  params_.push_back(std::move(p));
}

void FSDPState::ensure_unsharded_param(FSDPParam& p) const {
  if (p.unsharded_param.defined()) return;
  at::Tensor param;
  {
    at::NoGradGuard no_grad;
    param = ext_post_unflatten_transform(p.unsharded, p.tp_spec, ext());
  }
  const at::Tensor& data = is_dtensor(param) ? local_tensor(param) : param;
  TORCH_CHECK(data.defined() && data.is_alias_of(p.unsharded) && data.sizes() == p.unsharded.sizes(),
              "fully_shard: the FSDP extension's post_unflatten_transform for parameter '", p.fqn,
              "' must return a tensor (or DTensor) over the storage of the tensor it was given (shape ",
              c10::IntArrayRef(p.global_shape), "), which each all-gather fills");
  if (!param.is_leaf()) param = param.detach();
  if (p.requires_grad) param.set_requires_grad(true);
  p.unsharded_param = param;
}

int64_t FSDPState::flat_numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.padded_numel;
  return n;
}

// ---- Unshard and reshard (NOTE: [FSDP communication overlap]) -----------------------------

namespace {

// Fills `input` with the flat all-gather input: shard-group rank `rank`'s padded shards,
// concatenated (NOTE: [FSDP parameter layout]), zeros in the padding.
void copy_in(const std::vector<FSDPParam>& params, int64_t rank, const at::Tensor& input) {
  input.zero_();
  const c10::Device device = input.device();
  const at::ScalarType dtype = input.scalar_type();
  int64_t off = 0;
  for (const auto& p : params) {
    const int64_t rows = p.rows_of(rank);
    if (rows > 0) {
      input.narrow(0, off, p.padded_numel).view(p.padded_shard_shape).narrow(p.shard_dim, 0, rows)
          .copy_(local_tensor(p.sharded).to(device, dtype));
    }
    off += p.padded_numel;
  }
}

// Each unsharded parameter (storage allocated) from its rows of the `world` blocks of `full`.
void copy_out(std::vector<FSDPParam>& params, const at::Tensor& full, int64_t world, int64_t numel) {
  const debug::detail::MemoryUseScope use(debug::detail::MemoryUse::kUnshardedParameter);
  int64_t off = 0;
  for (auto& p : params) {
    utils::alloc_storage(p.unsharded, p.global_shape);
    at::Tensor out = storage_alias(p.unsharded);
    // On meta tensors (a fake world's) the copies write nothing and their views allocate
    // nothing: skipped, as they are world ops per parameter, thousands on a fake world.
    for (int64_t r = 0; r < (full.is_meta() ? 0 : world); ++r) {
      const int64_t rows = p.rows_of(r);
      if (rows == 0) continue;
      out.narrow(p.shard_dim, r * p.chunk, rows)
          .copy_(full.narrow(0, r * numel + off, p.padded_numel).view(p.padded_shard_shape).narrow(p.shard_dim, 0, rows));
    }
    off += p.padded_numel;
  }
}

}  // namespace

void FSDPState::unshard() {
  if (status_ == Status::kUnsharded || all_gather_ || params_.empty()) return;
  follow_replaced_params();
  for (const auto& p : params_) {
    // On a "meta" mesh (a fake world's) the whole step runs on meta tensors.
    TORCH_CHECK(device_.is_meta() || !local_tensor(p.sharded).is_meta(), "fully_shard(", module_type(*module_),
                "): parameter '", p.fqn,
                "' is on the meta device; materialise the model before its forward (dtensor::nn::to_empty, then "
                "initialise the parameters)");
  }
  follow_dtype_cast();
  at::NoGradGuard no_grad;
  const int64_t S = flat_numel();
  const at::ScalarType dtype = compute_dtype();
  AllGatherInFlight ag;
  {
    const debug::detail::MemoryUseScope use(debug::detail::MemoryUse::kAllGather);
    ag.output = at::empty({shard_size_ * S}, at::TensorOptions().dtype(dtype).device(device_));
  }
  if (status_ == Status::kPostForward) {
    ag.input = std::move(post_forward_piece_);
    post_forward_piece_ = at::Tensor();
    ag.work = post_forward_group_->all_gather_into_async(ag.output, ag.input);
  } else {
    // In place: the input is this rank's block of the output, as in PyTorch's
    // foreach_all_gather (_fsdp_collectives.py), so a group in flight holds one buffer, not
    // 1 + 1/shard_size of one.
    ag.input = ag.output.narrow(0, shard_rank_ * S, S);
    copy_in(params_, shard_rank_, ag.input);
    ag.work = shard_group_->all_gather_into_async(ag.output, ag.input);
  }
  record(FSDPTraceEvent::Kind::kAllGatherIssued, ag.work->issued_at());
  all_gather_ = std::move(ag);
}

void FSDPState::wait_for_unshard() {
  if (!all_gather_) return;
  AllGatherInFlight ag = std::move(*all_gather_);
  all_gather_.reset();
  forget_prefetch();
  ag.work->wait();
  {
    at::NoGradGuard no_grad;
    copy_out(params_, ag.output, shard_size_, flat_numel());
  }
  ag.input = at::Tensor();
  if (post_forward_size() > 1 && post_forward_size() < shard_size_) full_ = ag.output;  // to reshard into the smaller group
  status_ = Status::kUnsharded;
  for (auto& p : params_) {
    ensure_unsharded_param(p);
    p.swap_into_modules(p.unsharded_param);
  }
  record(FSDPTraceEvent::Kind::kAllGatherWaited);
}

void FSDPState::drop_unshard() {
  if (!all_gather_) return;
  AllGatherInFlight ag = std::move(*all_gather_);
  all_gather_.reset();
  forget_prefetch();
  ag.work->wait();
  if (status_ == Status::kPostForward) post_forward_piece_ = std::move(ag.input);  // the group is as it was
}

void FSDPState::forget_prefetch() {
  if (!prefetched_) return;
  prefetched_ = false;
  FSDPState& root = root_or_self();
  root.prefetched_groups_ = std::max<int64_t>(0, root.prefetched_groups_ - 1);
}

void FSDPState::prefetch_unshard() {
  if (params_.empty() || status_ == Status::kUnsharded || all_gather_) return;
  FSDPState& root = root_or_self();
  if (root.prefetched_groups_ >= kMaxPrefetchedGroups) return;  // NOTE: [FSDP communication overlap], 3.
  unshard();
  prefetched_ = true;
  ++root.prefetched_groups_;
}

// 0: the parameters stay unsharded after forward (reshard_after_forward false or 1, the root by
// default); otherwise the size of the group they are resharded into (shard_size_: fully). A
// shard group of one rank (HSDP (n, 1)) reshards too: "unsharded" is then a copy of its shard,
// freed after use, and the modules get the sharded DTensors back for the optimizer.
int64_t FSDPState::post_forward_size() const {
  if (!reshard_after_forward_.has_value()) return is_root_ ? 0 : shard_size_;
  const ReshardAfterForward& r = *reshard_after_forward_;
  if (!r.is_int()) return r.value() == -1 ? shard_size_ : 0;
  return r.value() == 1 ? 0 : r.value();
}

void FSDPState::reshard(bool after_forward) {
  drop_unshard();  // never free what an all-gather in flight writes
  if (status_ != Status::kUnsharded || params_.empty()) return;
  const int64_t n = after_forward ? post_forward_size() : shard_size_;
  if (n == 0) return;  // reshard_after_forward false
  for (const auto& p : params_) p.swap_into_modules(p.sharded);
  if (n < shard_size_) {
    TORCH_INTERNAL_ASSERT(full_.defined(), "fully_shard: no all-gather output to reshard from");
    ensure_post_forward_group(n);
    const int64_t piece = full_.numel() / n;
    post_forward_piece_ = full_.narrow(0, (shard_rank_ % n) * piece, piece).clone();
    status_ = Status::kPostForward;
  } else {
    status_ = Status::kSharded;
  }
  full_ = at::Tensor();
  for (auto& p : params_) utils::free_storage(p.unsharded);
}

void FSDPState::ensure_post_forward_group(int64_t n) {
  if (post_forward_group_ && post_forward_group_->size() == n) return;
  // Collective over the shard group: every rank creates every sub-group of n consecutive ranks.
  post_forward_group_ = nullptr;
  for (int64_t start = 0; start < shard_size_; start += n) {
    std::vector<int> ranks;
    for (int64_t r = start; r < start + n; ++r) ranks.push_back(static_cast<int>(r));
    auto g = shard_group_->new_subgroup(ranks);
    if (g) post_forward_group_ = g;
  }
}

// ---- Root, trace ----------------------------------------------------------------------------

void FSDPState::lazy_init() {
  is_root_ = true;
  root_ = shared_from_this();
  fqn_.clear();
  index_ = 0;
  int64_t next_index = 1;
  // Every fully_shard-ed module below this one gets this root, its fqn and its index (module order).
  std::function<void(const std::string&, torch::nn::Module&)> visit = [&](const std::string& prefix,
                                                                           torch::nn::Module& m) {
    for (const auto& item : m.named_children()) {
      const std::string fqn = prefix.empty() ? item.key() : prefix + "." + item.key();
      if (auto s = StateRegistry::instance().lookup(*item.value())) {
        if (s.get() != this && s->root_.expired()) {
          s->root_ = shared_from_this();
          s->is_root_ = false;
          s->fqn_ = fqn;
          s->index_ = next_index++;
        }
      }
      visit(fqn, *item.value());
    }
  };
  for (torch::nn::Module* m : modules()) visit("", *m);
}

FSDPState& FSDPState::root_or_self() {
  if (auto root = root_.lock()) return *root;  // owned by its module's hooks
  return *this;
}

void FSDPState::set_trace(bool enabled) {
  std::lock_guard<std::mutex> lock(trace_mu_);
  trace_enabled_ = enabled;
  if (enabled) trace_.clear();
}

std::vector<FSDPTraceEvent> FSDPState::trace() const {
  std::lock_guard<std::mutex> lock(trace_mu_);
  return trace_;
}

void FSDPState::record(FSDPTraceEvent::Kind kind, std::optional<std::chrono::steady_clock::time_point> at) {
  FSDPState& root = root_or_self();
  std::lock_guard<std::mutex> lock(root.trace_mu_);
  if (!root.trace_enabled_) return;
  root.trace_.push_back({kind, fqn_, index_, at.value_or(std::chrono::steady_clock::now())});
}

std::string to_string(FSDPTraceEvent::Kind kind) {
  switch (kind) {
    case FSDPTraceEvent::Kind::kAllGatherIssued: return "all_gather_issued";
    case FSDPTraceEvent::Kind::kAllGatherWaited: return "all_gather_waited";
    case FSDPTraceEvent::Kind::kForwardBegin: return "forward_begin";
    case FSDPTraceEvent::Kind::kForwardEnd: return "forward_end";
    case FSDPTraceEvent::Kind::kBackwardBegin: return "backward_begin";
    case FSDPTraceEvent::Kind::kBackwardEnd: return "backward_end";
    case FSDPTraceEvent::Kind::kReduceScatterIssued: return "reduce_scatter_issued";
    case FSDPTraceEvent::Kind::kReduceScatterFinished: return "reduce_scatter_finished";
  }
  return "unknown";
}

std::vector<std::shared_ptr<FSDPState>> FSDPState::states_below(bool include_self) {
  std::vector<std::shared_ptr<FSDPState>> out;
  if (include_self) out.push_back(shared_from_this());
  std::function<void(torch::nn::Module&)> visit = [&](torch::nn::Module& m) {
    for (const auto& child : m.children()) {
      if (auto s = StateRegistry::instance().lookup(*child)) out.push_back(s);
      visit(*child);
    }
  };
  for (torch::nn::Module* m : modules()) visit(*m);
  return out;
}

}  // namespace fsdp
}  // namespace dtensor
