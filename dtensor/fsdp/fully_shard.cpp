// dtensor/fsdp/fully_shard.cpp: FSDP2 (NOTE: [FSDP parameter layout], NOTE: [FSDP hooks],
// NOTE: [FSDP communication overlap]).
#include "dtensor/fsdp/fully_shard.h"

#include "dtensor/comm/group.h"
#include "dtensor/fsdp/fsdp_state_internal.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/utils/storage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace dtensor {
namespace fsdp {

namespace {

std::mutex g_mu;
std::unordered_map<const torch::nn::Module*, std::weak_ptr<FSDPState>> g_states;

std::shared_ptr<FSDPState> lookup_state(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_states.find(&module);
  if (it == g_states.end()) return nullptr;
  auto state = it->second.lock();
  if (!state || state->module_alive() != &module) return nullptr;
  return state;
}

void register_state(const torch::nn::Module& module, const std::shared_ptr<FSDPState>& state) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto it = g_states.begin(); it != g_states.end();) {
    it = it->second.expired() ? g_states.erase(it) : std::next(it);
  }
  g_states[&module] = state;
}

// Every live state (any module, any rank thread).
std::vector<std::shared_ptr<FSDPState>> live_states() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::shared_ptr<FSDPState>> out;
  for (auto& kv : g_states) {
    if (auto s = kv.second.lock()) out.push_back(s);
  }
  return out;
}

std::string module_type(const torch::nn::Module& m) { return m.name(); }

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

// NOTE: [FSDP over tensor-parallel parameters]
// A parameter that is already a DTensor on a 1-D tensor-parallel mesh (parallelize_module on
// mesh["tp"]) is sharded by fully_shard on mesh["dp"] like PyTorch's FSDP2
// (_fsdp_param.py, _init_sharding_spec_tp) with the transforms of FSDP1's DTensorExtensions (tensor/parallel/fsdp.py):
//   1. pre_flatten_transform (the FSDP extension's, NOTE: [FSDP extensions]): the parameter's
//      local (TP) tensor and its spec (the param extension). FSDP chunks, pads, all-gathers and
//      reduce-scatters that local tensor over the dp group exactly as it does a plain parameter
//      (NOTE: [FSDP parameter layout]); the TP collectives of forward and backward are untouched.
//   2. The sharded parameter is a DTensor on the PARENT mesh of the dp and tp meshes (both must
//      be sliced from it, dp dims first) with placements (<FSDP placement>, <TP placement>)
//      (HSDP: (Replicate(), <FSDP placement>, <TP placement>)): the FSDP placement is Shard(d),
//      or _StridedShard(d, split_factor) when tp also shards dim d (split_factor: the tp mesh
//      size), since the dim is then split by tp FIRST and by dp second, the reverse of what
//      (Shard(d), Shard(d)) means. Its full_tensor() is the original parameter.
//   3. post_unflatten_transform (the extension's): the unsharded parameter is the TP DTensor over
//      the unsharded local tensor, made at the first all-gather without autograd history (PyTorch
//      FSDP2's _from_local_no_grad) and kept: a leaf sharing the local's storage, which each
//      later all-gather fills (FSDP2 reuses its _unsharded_param the same way; FSDP1 calls the
//      transform at every unshard because it rebuilds its views each time). It is swapped into
//      the modules while unsharded. Its gradient is a DTensor: redistributed to the TP
//      placements (a Partial gradient is reduced over tp, as PyTorch's _get_grad_inner_tensor),
//      its local tensor takes the plain reduce-scatter path.
//
// NOTE: [FSDP extensions]
// fully_shard resolves the extension once (FullyShardOptions::extensions, else
// set_fsdp_extensions's, else DTensorExtensions when the FSDP mesh was sliced from a larger
// mesh, PyTorch's _init_extension; else none) and keeps it in the state. Its call points:
// pre_flatten_transform for every parameter at fully_shard; post_unflatten_transform once per
// DTensor parameter, at its first all-gather; all_gather_dtensor for each 2-D parameter in
// full_state_dict / unsharded_state_dict / sharded_tensor_state_dict; chunk_dtensor when
// load_state_dict lifts a TP DTensor to the parent mesh; chunk_tensor in
// sharded_tensor_state_dict and pre_load_state_dict_transform in load_sharded_tensor_state_dict
// (FSDP1's SHARDED_STATE_DICT form). A custom extension must return, from pre_flatten_transform,
// a plain local tensor and the DTensorSpec it is the local tensor of (or none for a plain
// tensor), and from post_unflatten_transform a tensor over the storage it was given.

// The gradient of a TP parameter's unsharded DTensor as the plain local tensor FSDP reduces:
// laid out like the parameter first (a Partial gradient is reduced over tp here, PyTorch's
// _get_grad_inner_tensor).
at::Tensor tp_grad_local(const at::Tensor& grad, const DTensorSpec& spec) {
  if (!is_dtensor(grad)) return grad;
  at::NoGradGuard no_grad;
  const DTensorSpec& gs = get_spec(grad);
  if (gs.placements == spec.placements) return local_tensor(grad);
  return local_tensor(redistribute(grad, gs.mesh, spec.placements));
}

// Calls fn on every tensor in an IValue (tensors, lists, tuples), replacing it by fn's result.
void map_tensors(c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    v = fn(v.toTensor());
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) list.set(i, fn(list.get(i)));
    v = list;
  } else if (v.isTuple()) {
    std::vector<c10::IValue> elems = v.toTupleRef().elements().vec();
    for (auto& e : elems) map_tensors(e, fn);
    v = c10::ivalue::Tuple::create(std::move(elems));
  } else if (v.isList()) {
    auto list = v.toList();
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e = list.get(i);
      map_tensors(e, fn);
      list.set(i, e);
    }
    v = list;
  }
}

// States by id, for the autograd function below (whose context holds IValues only).
std::mutex g_ids_mu;
std::unordered_map<int64_t, std::weak_ptr<FSDPState>> g_by_id;
int64_t g_next_id = 0;

// Identity on one forward input of a group; its backward (when the gradient of that input is
// complete, after the group's backward) runs the group's post-backward (PyTorch:
// RegisterPostBackwardFunction).
struct RegisterPostBackward : public torch::autograd::Function<RegisterPostBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t id) {
    ctx->saved_data["id"] = id;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::shared_ptr<FSDPState> state;
    {
      std::lock_guard<std::mutex> lock(g_ids_mu);
      auto it = g_by_id.find(ctx->saved_data["id"].toInt());
      if (it != g_by_id.end()) state = it->second.lock();
    }
    if (state) state->post_backward_from_hook();
    return {grads[0], at::Tensor()};
  }
};

}  // namespace

int64_t register_state_id(const std::shared_ptr<FSDPState>& state) {
  std::lock_guard<std::mutex> lock(g_ids_mu);
  for (auto it = g_by_id.begin(); it != g_by_id.end();) it = it->second.expired() ? g_by_id.erase(it) : std::next(it);
  const int64_t id = g_next_id++;
  g_by_id[id] = state;
  return id;
}

void FSDPState::post_backward_from_hook() {
  if (post_backward_done_ || !pre_backward_done_) return;
  post_backward_done_ = true;
  post_backward();
}

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
  int64_t off = 0;
  for (auto& p : params) {
    utils::alloc_storage(p.unsharded, p.global_shape);
    at::Tensor out = storage_alias(p.unsharded);
    for (int64_t r = 0; r < world; ++r) {
      const int64_t rows = p.rows_of(r);
      if (rows == 0) continue;
      out.narrow(p.shard_dim, r * p.chunk, rows)
          .copy_(full.narrow(0, r * numel + off, p.padded_numel).view(p.padded_shard_shape).narrow(p.shard_dim, 0, rows));
    }
    off += p.padded_numel;
  }
}

// The reduce-scatter input: `world` blocks, block r the padded rows of rank r of every gradient
// (in parameter order, parameters without a gradient left out). Each gradient is freed once copied.
at::Tensor reduce_scatter_input(const std::vector<FSDPParam>& params, std::vector<at::Tensor>& grads, int64_t world,
                                int64_t numel, const at::TensorOptions& options) {
  at::Tensor input = at::zeros({world * numel}, options);
  int64_t off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const FSDPParam& p = params[i];
    if (!grads[i].defined()) continue;
    at::Tensor g = grads[i].to(options.dtype().toScalarType());
    for (int64_t r = 0; r < world; ++r) {
      const int64_t rows = p.rows_of(r);
      if (rows == 0) continue;
      input.narrow(0, r * numel + off, p.padded_numel).view(p.padded_shard_shape).narrow(p.shard_dim, 0, rows)
          .copy_(g.narrow(p.shard_dim, r * p.chunk, rows));
    }
    off += p.padded_numel;
    g.reset();
    grads[i].reset();
  }
  return input;
}

// NOTE: [FSDP gradient divide]
// PyTorch's _get_gradient_divide_factors (_fsdp_collectives.py), with NCCL's meaning of its
// reduce ops, on every backend. For float32 and bfloat16 reductions PyTorch reduces with
// ReduceOp.AVG (no divide factor) or ReduceOp.PREMUL_SUM(1 / factor), which NCCL computes for
// floating types by multiplying each rank's input by the scale (in the reduction dtype) before
// summing; Gloo has neither op, so the scale is applied here to the input and the collectives
// sum, which is the same arithmetic. Without a factor: the reduce-scatter input times
// 1/shard size and (HSDP) the all-reduce input times 1/replicate size; with one: the
// reduce-scatter input times 1/factor and the all-reduce sums (a shard group of one rank
// divides its input by the factor, as PyTorch's single-rank copy does). Other dtypes (float16,
// float64) risk overflow: the factor (default: the data-parallel size) is split into a
// power-of-two pre-divisor near its square root, applied to the input, and the rest, applied to
// the reduced output. Pre-scaling rounds differently from dividing the sum (by ~1e-7 relative in
// float32 for a factor that is not a power of two), which exact-parity tests see.
struct GradientDivide {
  double premul = 1, pre_divide = 1, all_reduce_premul = 1, post_divide = 1;
};

GradientDivide gradient_divide(at::ScalarType reduce_dtype, int64_t shard, int64_t replicate,
                               std::optional<double> factor) {
  GradientDivide d;
  const bool overflow_risk = reduce_dtype != at::kFloat && reduce_dtype != at::kBFloat16;
  if (!overflow_risk) {
    if (!factor) {
      d.premul = 1.0 / static_cast<double>(shard);
      d.all_reduce_premul = 1.0 / static_cast<double>(replicate);
    } else if (shard == 1) {
      d.pre_divide = *factor;
    } else {
      d.premul = 1.0 / *factor;
    }
    return d;
  }
  const double f = factor.value_or(static_cast<double>(shard * replicate));
  double pre = 1;
  while (std::fmod(f, pre) == 0 && f / pre > pre) pre *= 2;
  d.pre_divide = pre;
  d.post_divide = f / pre;
  return d;
}

}  // namespace

void FSDPState::unshard() {
  if (status_ == Status::kUnsharded || all_gather_ || params_.empty()) return;
  follow_dtype_cast();
  at::NoGradGuard no_grad;
  const int64_t S = flat_numel();
  const at::ScalarType dtype = compute_dtype();
  AllGatherInFlight ag;
  ag.output = at::empty({shard_size_ * S}, at::TensorOptions().dtype(dtype).device(device_));
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

// ---- Hooks (NOTE: [FSDP hooks]) -----------------------------------------------------------

void FSDPState::pre_forward(nn::ForwardInputs& inputs) {
  if (root_.expired()) lazy_init();
  // The root's final callback is queued by every backward and cleared when it runs; still set
  // outside a backward, the last backward raised before its end (NOTE: [FSDP after a failed
  // backward]).
  if (is_root_ && callback_queued_ && torch::autograd::get_current_graph_task_exec_info() == nullptr)
    recover_from_failed_backward();
  if (auto root = root_.lock()) {
    if (at::GradMode::is_enabled()) root->record_forward(shared_from_this());
  }
  if (options_.mp_policy.param_dtype && options_.mp_policy.cast_forward_inputs) {
    const at::ScalarType dt = *options_.mp_policy.param_dtype;
    for (auto& in : inputs) {
      map_tensors(in, [dt](const at::Tensor& t) { return t.is_floating_point() ? t.to(dt) : t; });
    }
  }
  unshard();  // no-op when prefetched (in flight) or unsharded
  wait_for_unshard();
  // Issued only: they run during this module's forward (NOTE: [FSDP communication overlap]).
  for (auto& w : forward_prefetch_) {
    if (auto s = w.lock()) s->prefetch_unshard();
  }
  if (at::GradMode::is_enabled() && !params_.empty()) {
    for (auto& in : inputs) {
      map_tensors(in, [this](const at::Tensor& t) {
        return t.requires_grad() && !is_dtensor(t) ? RegisterPostBackward::apply(t, id_) : t;
      });
    }
  }
  record(FSDPTraceEvent::Kind::kForwardBegin);
}

void FSDPState::post_forward(c10::IValue& output) {
  record(FSDPTraceEvent::Kind::kForwardEnd);
  reshard(/*after_forward=*/true);
  if (at::GradMode::is_enabled() && !params_.empty()) {
    // With multiplicity: one pre-backward per forward (PyTorch's _record_post_forward).
    FSDPState& root = root_or_self();
    post_forward_indices_.push_back(root.post_forward_order_.size());
    root.post_forward_order_.push_back(shared_from_this());
  }
  if (options_.mp_policy.output_dtype) {
    const at::ScalarType dt = *options_.mp_policy.output_dtype;
    map_tensors(output, [dt](const at::Tensor& t) { return t.is_floating_point() ? t.to(dt) : t; });
  }
  if (!at::GradMode::is_enabled()) return;
  std::weak_ptr<FSDPState> weak = shared_from_this();
  map_tensors(output, [weak](const at::Tensor& t) {
    if (t.requires_grad()) {
      t.register_hook([weak](const at::Tensor&) {
        if (auto s = weak.lock()) s->pre_backward();
      });
    }
    return t;
  });
}

void FSDPState::pre_backward() {
  if (pre_backward_done_) return;
  pre_backward_done_ = true;
  if (auto root = root_.lock()) root->queue_final_callback();
  unshard();  // no-op when prefetched (in flight) or unsharded
  wait_for_unshard();
  if (!backward_prefetch_.empty()) {
    for (auto& w : backward_prefetch_) {
      if (auto s = w.lock()) s->prefetch_unshard();
    }
  } else if (!post_forward_indices_.empty()) {
    // Default: the group before this one in post-forward order (NOTE: [FSDP communication
    // overlap], 2.; PyTorch's _backward_prefetch).
    const size_t index = post_forward_indices_.back();
    post_forward_indices_.pop_back();
    const auto& order = root_or_self().post_forward_order_;
    if (index > 0 && index - 1 < order.size()) {
      if (auto s = order[index - 1].lock()) s->prefetch_unshard();
    }
  }
  record(FSDPTraceEvent::Kind::kBackwardBegin);
}

void FSDPState::record_forward(const std::shared_ptr<FSDPState>& state) {
  for (auto& w : forwarded_) {
    if (w.lock() == state) return;
  }
  forwarded_.push_back(state);
}

void FSDPState::queue_final_callback() {
  if (callback_queued_) return;
  callback_queued_ = true;
  std::weak_ptr<FSDPState> weak = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto s = weak.lock()) s->final_callback();
  });
}

// Post-backward of the groups whose backward hook did not run it, then nothing FSDP issued is
// left in flight: a mistargeted prefetch is waited for, the last reduce-scatter finished.
void FSDPState::final_callback() {
  callback_queued_ = false;
  auto forwarded = std::move(forwarded_);
  forwarded_.clear();
  for (auto it = forwarded.rbegin(); it != forwarded.rend(); ++it) {
    if (auto s = it->lock()) {
      if (!s->post_backward_done_) s->post_backward();
      s->drop_unshard();  // a mistargeted prefetch (PyTorch's finalize_backward)
      s->pre_backward_done_ = false;
      s->post_backward_done_ = false;
      s->post_forward_indices_.clear();
    }
  }
  post_forward_order_.clear();
  finish_pending_reduce_scatter();
}

// NOTE: [FSDP after a failed backward]
// When backward raises (a hook, an op, a collective), the autograd engine drops the callbacks
// queued on it, so final_callback never runs: the groups backward did not reach keep their
// parameters unsharded (or an all-gather in flight), their per-backward flags stay set, and one
// reduce-scatter may still be parked here. Left so, the next backward would skip those groups'
// pre-backward and write the parked reduce-scatter's gradients into .grad, silently adding a
// failed step's gradients to the next one. The next root forward therefore puts every group back
// as final_callback would and drops the parked gradients (its collective is still waited for:
// every rank issued it). Gradients that groups finished before the failure stay in .grad, as in
// PyTorch; the usual zero_grad() clears them.
void FSDPState::recover_from_failed_backward() {
  TORCH_WARN("fully_shard: the previous backward did not finish (it raised); the gradients it had not ",
             "yet reduced are dropped and its gathered parameters resharded before this forward");
  callback_queued_ = false;
  if (pending_reduce_scatter_) {
    PendingReduceScatter rs = std::move(*pending_reduce_scatter_);
    pending_reduce_scatter_.reset();
    rs.work->wait();
  }
  auto forwarded = std::move(forwarded_);
  forwarded_.clear();
  for (auto it = forwarded.rbegin(); it != forwarded.rend(); ++it) {
    auto s = it->lock();
    if (!s) continue;
    if (!s->post_backward_done_) {
      for (auto& p : s->params_)
        if (p.unsharded_param.defined()) p.unsharded_param.mutable_grad() = at::Tensor();
      if (s->reshard_after_backward_ && s->is_last_backward_) s->reshard(/*after_forward=*/false);
    }
    s->drop_unshard();
    s->pre_backward_done_ = false;
    s->post_backward_done_ = false;
    s->post_forward_indices_.clear();
  }
  post_forward_order_.clear();
  prefetched_groups_ = 0;
}

bool FSDPState::all_post_backwards_done() const {
  for (const auto& w : forwarded_) {
    auto s = w.lock();
    if (s && !s->post_backward_done_) return false;
  }
  return true;
}

void FSDPState::post_backward() {
  record(FSDPTraceEvent::Kind::kBackwardEnd);
  // Unsharded gradients, moved out of the unsharded parameters (plus earlier accumulation).
  std::vector<at::Tensor> grads(params_.size());
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    at::Tensor g = p.unsharded_param.defined() ? p.unsharded_param.grad() : at::Tensor();
    if (g.defined()) {
      p.unsharded_param.mutable_grad() = at::Tensor();
      if (p.tp_spec) g = tp_grad_local(g, *p.tp_spec);
    }
    if (p.accumulated_grad.defined()) {
      g = g.defined() ? p.accumulated_grad.add_(g) : p.accumulated_grad;
      p.accumulated_grad = at::Tensor();
    }
    grads[i] = g;
    any = any || g.defined();
  }
  // Reshard first: the unsharded parameters are freed before the reduce-scatter buffers exist.
  if (reshard_after_backward_ && is_last_backward_) reshard(/*after_forward=*/false);
  if (!requires_gradient_sync_) {
    // Kept in the reduce dtype, as PyTorch's FSDPParam.to_accumulated_grad_if_needed: under a
    // bf16 compute / fp32 reduce policy the sum over micro-batches is fp32 (a gradient
    // accumulated before is already in it, and add_ keeps its dtype).
    const at::ScalarType dt = reduce_dtype();
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].accumulated_grad =
          grads[i].defined() && grads[i].scalar_type() != dt ? grads[i].to(dt) : grads[i];
    }
  } else if (any) {
    reduce_scatter_grads(std::move(grads));
  }
}

void FSDPState::reduce_scatter_grads(std::vector<at::Tensor> grads) {
  at::NoGradGuard no_grad;
  const GradientDivide divide = gradient_divide(reduce_dtype(), shard_size_, replicate_size_, divide_factor_);
  PendingReduceScatter rs;
  rs.all_reduce_premul = divide.all_reduce_premul;
  rs.post_divide = divide.post_divide;
  rs.state = shared_from_this();
  rs.has_grad.resize(params_.size());
  int64_t S = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    rs.has_grad[i] = grads[i].defined();
    if (rs.has_grad[i]) S += params_[i].padded_numel;
  }
  // At most one in flight (NOTE: [FSDP communication overlap], 4.): the previous group's is
  // finished, and its buffers freed, before this group's input exists.
  FSDPState& root = root_or_self();
  root.finish_pending_reduce_scatter();
  const auto options = at::TensorOptions().dtype(reduce_dtype()).device(device_);
  rs.output = at::empty({S}, options);
  {
    // Not kept: the group holds the input while the collective needs it (NOTE: [Async
    // collectives]) and frees it when it completes.
    const at::Tensor input = reduce_scatter_input(params_, grads, shard_size_, S, options);
    if (divide.premul != 1) input.mul_(divide.premul);
    if (divide.pre_divide != 1) input.div_(divide.pre_divide);
    rs.work = shard_group_->reduce_scatter_into_async(rs.output, input, comm::ReduceOp::SUM);
  }
  record(FSDPTraceEvent::Kind::kReduceScatterIssued, rs.work->issued_at());
  root.pending_reduce_scatter_ = std::move(rs);
  if (root.all_post_backwards_done()) root.finish_pending_reduce_scatter();
}

void FSDPState::finish_pending_reduce_scatter() {
  if (!pending_reduce_scatter_) return;
  PendingReduceScatter rs = std::move(*pending_reduce_scatter_);
  pending_reduce_scatter_.reset();
  if (auto s = rs.state.lock()) {
    s->finish_reduce_scatter(rs);
  } else {
    rs.work->wait();  // the module died: nothing to write
  }
}

void FSDPState::finish_reduce_scatter(PendingReduceScatter& rs) {
  at::NoGradGuard no_grad;
  rs.work->wait();
  at::Tensor& output = rs.output;
  if (replicate_group_) {
    if (rs.all_reduce_premul != 1) output.mul_(rs.all_reduce_premul);
    replicate_group_->all_reduce(output, comm::ReduceOp::SUM);
  }
  if (rs.post_divide != 1) output.div_(rs.post_divide);
  int64_t off = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    if (!rs.has_grad[i]) continue;
    at::Tensor local = output.narrow(0, off, p.padded_numel)
                           .view(p.padded_shard_shape)
                           .narrow(p.shard_dim, 0, p.rows_of(shard_rank_))
                           .to(p.orig_dtype)
                           .clone(at::MemoryFormat::Contiguous);
    if (options_.offload_policy.offload) local = local.to(c10::Device(c10::kCPU));
    off += p.padded_numel;
    at::Tensor existing = p.sharded.grad();
    if (existing.defined() && is_dtensor(existing)) {
      const_cast<at::Tensor&>(local_tensor(existing)).add_(local);
    } else {
      p.sharded.mutable_grad() = make_dtensor(local, get_spec(p.sharded));
    }
  }
  record(FSDPTraceEvent::Kind::kReduceScatterFinished);
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
      if (auto s = lookup_state(*item.value())) {
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
  visit("", *module_);
}

FSDPState& FSDPState::root_or_self() {
  if (auto root = root_.lock()) return *root;  // owned by its module's hooks
  return *this;
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
      if (auto s = lookup_state(*child)) out.push_back(s);
      visit(*child);
    }
  };
  visit(*module_);
  return out;
}

// ---- fully_shard --------------------------------------------------------------------------

namespace {

[[noreturn]] void fail(const torch::nn::Module& module, const std::string& what) {
  TORCH_CHECK(false, "fully_shard(", module_type(module), "): ", what);
}

std::string dims_to_string(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << c10::IntArrayRef(dims);
  return os.str();
}

// The layout of a tensor-parallel parameter (NOTE: [FSDP over tensor-parallel parameters]),
// or an error naming the parameter, the meshes and what would work.
TPSharding tp_sharding(const torch::nn::Module& module, const std::string& fqn, const DeviceMesh& dp_mesh,
                       const DTensorSpec& spec, int64_t shard_dim) {
  const std::string what = "parameter '" + fqn + "' is a DTensor " + to_string(spec.placements) + " on " +
                           spec.mesh.to_string() + " and the FSDP mesh is " + dp_mesh.to_string() + ": ";
  const std::string how = " (slice both from one mesh: mesh = init_device_mesh(\"cpu\", {dp, tp}, {\"dp\", \"tp\"}); "
                          "parallelize on mesh[\"tp\"], fully_shard on mesh[\"dp\"])";
  auto dp_parent = dp_mesh.get_parent_mesh();
  auto tp_parent = spec.mesh.get_parent_mesh();
  if (!dp_parent || !tp_parent) {
    fail(module, what + "FSDP over tensor parallelism needs the FSDP mesh and the parameter's mesh to be sub-meshes "
                        "of one parent mesh, but " + std::string(!dp_parent ? "the FSDP mesh" : "the parameter's mesh") +
                        " has no parent mesh" + how);
  }
  if (!(*dp_parent == *tp_parent)) {
    fail(module, what + "the two meshes have different parent meshes, " + dp_parent->to_string() + " and " +
                     tp_parent->to_string() + how);
  }
  if (spec.mesh.ndim() != 1) {
    fail(module, what + "FSDP supports 1-D tensor parallelism only, but the parameter's mesh has " +
                     std::to_string(spec.mesh.ndim()) + " dims");
  }
  std::vector<int64_t> dims = dp_mesh.get_parent_mesh_dims();
  for (int64_t d : spec.mesh.get_parent_mesh_dims()) dims.push_back(d);
  std::vector<int64_t> expected(static_cast<size_t>(dp_parent->ndim()));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i);
  if (dims != expected) {
    fail(module, what + "the FSDP mesh must be the leading dims of the parent mesh " + dp_parent->to_string() +
                     " and the tensor-parallel mesh its last dim, but they are the parent's dims " +
                     dims_to_string(dp_mesh.get_parent_mesh_dims()) + " and " +
                     dims_to_string(spec.mesh.get_parent_mesh_dims()) + how);
  }
  const Placement& tp_placement = spec.placements[0];
  if (is_partial(tp_placement)) {
    fail(module, what + "a Partial parameter cannot be sharded; redistribute it to Shard or Replicate first");
  }
  if (!is_shard(tp_placement) && !is_replicate(tp_placement)) {
    fail(module, what + "FSDP shards parameters whose tensor-parallel placement is Shard or Replicate, not " +
                     to_string(tp_placement));
  }
  // Tensor parallelism splits shard_dim first: dp then splits each tp piece (PyTorch's
  // split_factor = num_shards_map[shard_dim]).
  const int64_t split_factor = is_shard(tp_placement, shard_dim) ? spec.mesh.size(0) : 1;
  const Placement fsdp_placement = StridedShard(shard_dim, split_factor);  // a plain Shard when 1
  TPSharding out{spec, *dp_parent, {}};
  if (dp_mesh.ndim() == 2) out.spmd_placements.push_back(Replicate{});
  out.spmd_placements.push_back(fsdp_placement);
  out.spmd_placements.push_back(tp_placement);
  return out;
}

}  // namespace

FSDPModule fully_shard(torch::nn::Module& module, FullyShardOptions options) {
  // ---- Checks, before anything changes ----
  if (lookup_state(module)) fail(module, "fully_shard was already applied to this module");
  std::shared_ptr<torch::nn::Module> owner;
  try {
    owner = module.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    fail(module, "the module must be owned by a std::shared_ptr (a ModuleHolder or std::make_shared)");
  }
  DeviceMesh mesh = options.mesh ? *options.mesh : init_device_mesh("cpu", {comm::default_group()->size()});
  if (mesh.ndim() != 1 && mesh.ndim() != 2) {
    fail(module, "the mesh must have 1 dim (FSDP) or 2 dims (replicate, shard) for HSDP, got " +
                     std::to_string(mesh.ndim()) + " dims: " + mesh.to_string());
  }
  if (mesh.ndim() == 2 && mesh.mesh_dim_names().empty()) {
    // PyTorch's fully_shard: "Please init the 2D mesh for HSDP with mesh_dim_names specified".
    fail(module, "HSDP needs a 2-D mesh with dim names, e.g. init_device_mesh(\"cpu\", {replicate, shard}, "
                 "{\"replicate\", \"shard\"}), got " + mesh.to_string());
  }
  if (!mesh.get_coordinate().has_value()) fail(module, "the mesh " + mesh.to_string() + " does not contain this rank");
  // The FSDP extension (NOTE: [FSDP extensions]).
  if (!options.extensions) options.extensions = get_fsdp_extensions();
  if (!options.extensions && mesh.get_parent_mesh().has_value()) options.extensions = std::make_shared<DTensorExtensions>();
  const FSDPExtensions* ext = options.extensions.get();
  const int64_t shard_size = mesh.size(mesh.ndim() - 1);
  if (options.reshard_after_forward && options.reshard_after_forward->is_int()) {
    const int64_t n = options.reshard_after_forward->value();
    if (n <= 0 || shard_size % n != 0) {
      fail(module, "reshard_after_forward=" + std::to_string(n) + " must be a positive divisor of the shard group size " +
                       std::to_string(shard_size));
    }
  }

  // Managed modules: this one and its descendants, stopping at fully_shard-ed ones.
  std::vector<std::pair<std::string, torch::nn::Module*>> managed;
  std::vector<std::shared_ptr<FSDPState>> child_states;
  std::function<void(const std::string&, torch::nn::Module&)> walk = [&](const std::string& prefix, torch::nn::Module& m) {
    managed.emplace_back(prefix, &m);
    for (const auto& item : m.named_children()) {
      if (auto s = lookup_state(*item.value())) {
        child_states.push_back(s);
        continue;
      }
      walk(prefix.empty() ? item.key() : prefix + "." + item.key(), *item.value());
    }
  };
  walk("", module);
  // Parameters another group (below, or a sibling) sharded.
  const auto others = live_states();
  auto owned_elsewhere = [&](const c10::TensorImpl* impl) {
    for (const auto& s : others) {
      if (s->holds_original(impl)) return true;
    }
    return false;
  };
  std::unordered_set<const c10::TensorImpl*> ignored;
  for (const auto& t : options.ignored_params) ignored.insert(t.unsafeGetTensorImpl());

  struct Pending {
    std::string fqn;
    std::vector<Registration> regs;
    at::Tensor tensor;  // the registered parameter
    at::Tensor flat;    // what FSDP shards: pre_flatten_transform's tensor
    int64_t shard_dim;
    std::optional<TPSharding> tp;
  };
  std::vector<Pending> pending;
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (auto& entry : managed) {
    for (const auto& item : entry.second->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = item.value();
      if (!t.defined() || ignored.count(t.unsafeGetTensorImpl())) continue;
      const std::string fqn = entry.first.empty() ? item.key() : entry.first + "." + item.key();
      auto found = index.find(t.unsafeGetTensorImpl());
      if (found != index.end()) {
        pending[found->second].regs.push_back({entry.second, item.key()});
        continue;
      }
      if (owned_elsewhere(t.unsafeGetTensorImpl())) {
        fail(module, "parameter '" + fqn + "' is shared with another fully_shard-ed module (one group per parameter)");
      }
      if (t.dim() == 0) fail(module, "parameter '" + fqn + "' is a scalar; FSDP shards dim 0 and needs at least 1 dim");
      if (!t.is_contiguous() || (is_dtensor(t) && !local_tensor(t).is_contiguous())) {
        fail(module, "parameter '" + fqn + "' is not contiguous");
      }
      if (!nn::has_parameter_member(*entry.second, item.key())) {
        fail(module, "parameter '" + fqn + "' of " + module_type(*entry.second) +
                         " cannot be swapped: register its member with dtensor::nn::register_parameter_member");
      }
      int64_t shard_dim = 0;
      if (options.shard_placement_fn) {
        if (auto s = options.shard_placement_fn(t)) {
          const int64_t d = s->dim < 0 ? s->dim + t.dim() : s->dim;
          if (d < 0 || d >= t.dim()) {
            fail(module, "shard_placement_fn gave Shard(" + std::to_string(s->dim) + ") for parameter '" + fqn +
                             "' with " + std::to_string(t.dim()) + " dims");
          }
          shard_dim = d;
        }
      }
      std::optional<TPSharding> tp;
      if (is_dtensor(t) && ext == nullptr) {
        tp_sharding(module, fqn, mesh, get_spec(t), shard_dim);  // throws: the FSDP mesh has no parent
        fail(module, "parameter '" + fqn + "' is a DTensor and no FSDP extension handles it (set one with "
                         "FullyShardOptions::extensions or set_fsdp_extensions)");
      }
      auto flat = ext_pre_flatten_transform(t, ext);
      if (flat.second.has_value()) {
        if (is_dtensor(flat.first)) {
          fail(module, "the FSDP extension's pre_flatten_transform of parameter '" + fqn +
                           "' gave a DTensor; it must give the plain local tensor of the spec it gives");
        }
        tp = tp_sharding(module, fqn, mesh, *flat.second, shard_dim);
        tp->requires_grad = t.requires_grad();
      } else if (is_dtensor(t) || is_dtensor(flat.first)) {
        fail(module, "parameter '" + fqn + "' is a DTensor but the FSDP extension's pre_flatten_transform gave no "
                         "DTensorSpec for it");
      }
      index[t.unsafeGetTensorImpl()] = pending.size();
      pending.push_back({fqn, {{entry.second, item.key()}}, t, flat.first, shard_dim, std::move(tp)});
    }
  }
  if (!pending.empty()) {
    const at::ScalarType dt = pending.front().tensor.scalar_type();
    for (const auto& p : pending) {
      if (p.tensor.scalar_type() != dt) {
        std::ostringstream msg;
        msg << "parameters of one group must share a dtype (one flat all-gather";
        if (options.mp_policy.param_dtype) msg << " under the mixed-precision policy";
        msg << "): '" << pending.front().fqn << "' is " << dt << " but '" << p.fqn << "' is " << p.tensor.scalar_type();
        fail(module, msg.str());
      }
    }
  }

  // ---- Sharding (no communication) ----
  auto state = std::make_shared<FSDPState>(module, std::move(options), mesh);
  state->set_orig_dtype(pending.empty() ? at::kFloat : pending.front().tensor.scalar_type());
  for (auto& p : pending) {
    state->remember_original(p.tensor);
    state->add_param(p.fqn, std::move(p.regs), p.flat, p.shard_dim, std::move(p.tp));
  }
  std::weak_ptr<FSDPState> weak = state;
  // The hooks hold the state (alive as long as the module).
  nn::register_forward_pre_hook(module, [state](torch::nn::Module&, nn::ForwardInputs& inputs) {
    state->pre_forward(inputs);
  });
  nn::register_forward_hook(module, [weak](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue& output) {
    if (auto s = weak.lock()) s->post_forward(output);
  });
  register_state(module, state);
  state->id_ = register_state_id(state);
  return FSDPModuleAccess::make(state);
}

std::optional<FSDPModule> get_fsdp_module(const torch::nn::Module& module) {
  if (auto s = lookup_state(module)) return FSDPModuleAccess::make(s);
  return std::nullopt;
}

// ---- FSDPModule ---------------------------------------------------------------------------

void FSDPModule::unshard() {
  state_->unshard();
  state_->wait_for_unshard();
}
void FSDPModule::reshard() { state_->reshard(/*after_forward=*/false); }

void FSDPModule::set_requires_gradient_sync(bool value, bool recurse) {
  for (auto& s : state_->states_below(true)) {
    if (!recurse && s != state_) continue;
    s->requires_gradient_sync_ = value;
  }
}
void FSDPModule::set_reshard_after_forward(ReshardAfterForward value, bool recurse) {
  const int64_t shard_size = state_->shard_size_;
  if (value.is_int() && (value.value() <= 0 || shard_size % value.value() != 0)) {
    TORCH_CHECK(false, "set_reshard_after_forward: ", value.value(), " must be a positive divisor of the shard group size ",
                shard_size);
  }
  for (auto& s : state_->states_below(true)) {
    if (!recurse && s != state_) continue;
    s->reshard_after_forward_ = value;
  }
}
void FSDPModule::set_reshard_after_backward(bool value, bool recurse) {
  for (auto& s : state_->states_below(true)) {
    if (!recurse && s != state_) continue;
    s->reshard_after_backward_ = value;
  }
}
void FSDPModule::set_is_last_backward(bool value) {
  for (auto& s : state_->states_below(true)) s->is_last_backward_ = value;
}
void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  state_->forward_prefetch_.clear();
  for (const auto& m : modules) state_->forward_prefetch_.push_back(m.state_);
}
void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  state_->backward_prefetch_.clear();
  for (const auto& m : modules) state_->backward_prefetch_.push_back(m.state_);
}
void FSDPModule::set_gradient_divide_factor(double factor) {
  TORCH_CHECK(factor > 0, "set_gradient_divide_factor: the factor must be positive, got ", factor);
  state_->divide_factor_ = factor;
}
torch::nn::Module& FSDPModule::module() const { return *state_->module_; }
const DeviceMesh& FSDPModule::mesh() const { return state_->mesh_; }
std::vector<at::Tensor> FSDPModule::sharded_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : state_->params_) out.push_back(p.sharded);
  return out;
}
bool FSDPModule::is_root() const { return state_->is_root_; }
bool FSDPModule::is_unsharded() const { return state_->status_ == FSDPState::Status::kUnsharded; }
const FSDPExtensions* FSDPModule::extensions() const { return state_->ext(); }
void FSDPModule::set_trace(bool enabled) {
  std::lock_guard<std::mutex> lock(state_->trace_mu_);
  state_->trace_enabled_ = enabled;
  if (enabled) state_->trace_.clear();
}
std::vector<FSDPTraceEvent> FSDPModule::trace() const {
  std::lock_guard<std::mutex> lock(state_->trace_mu_);
  return state_->trace_;
}

}  // namespace fsdp
}  // namespace dtensor
