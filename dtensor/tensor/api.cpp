// dtensor/tensor/api.cpp: distribute_tensor, from_local, to_local, redistribute, full_tensor,
// printing, and their autograd (hand-written autograd Nodes: the saved state is a DTensorSpec,
// which is not an IValue, so torch::autograd::Function's saved_data does not fit).
#include "dtensor/comm/work.h"
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/object_collectives.h"
#include "dtensor/compat.h"
#include "dtensor/mesh/mesh_collectives.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/debug/comm_mode_internal.h"
#include "dtensor/tensor/redistribute.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <sstream>

namespace dtensor {

namespace {

thread_local bool t_implicit_replication = false;

TensorMeta contiguous_meta(const std::vector<int64_t>& shape, at::ScalarType dtype) {
  TensorMeta m;
  m.shape = shape;
  auto st = c10::contiguous_strides(shape);
  m.stride.assign(st.begin(), st.end());
  m.dtype = dtype;
  return m;
}

using torch::autograd::Node;
using torch::autograd::variable_list;

// Attaches `node` as the grad_fn of `out` when `input` needs a gradient.
template <class NodePtr>
void connect(const at::Tensor& input, at::Tensor& out, NodePtr node) {
  if (!at::GradMode::is_enabled() || !input.requires_grad()) return;
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
}

template <class N>
auto new_node() {
  return compat::make_node<N>();
}

// NOTE: [Gradients of Partial inputs]
// The gradient of a DTensor input goes back to the input's placements, except on mesh dims
// where the input is Partial: a Partial gradient (the same Partial) stays Partial, with no
// collective (each rank's partial gradient is its share); any other gradient (Shard,
// Replicate) becomes Replicate, since turning a gradient into a Partial is useless work that a
// later reduction would undo (PyTorch's _redistribute backward: `(current.is_shard() or
// current.is_replicate()) and target.is_partial()` -> Replicate).
std::vector<Placement> backward_placements(const std::vector<Placement>& grad, const std::vector<Placement>& input) {
  std::vector<Placement> out = input;
  for (size_t i = 0; i < out.size(); ++i)
    if (is_partial(out[i]) && !(i < grad.size() && grad[i] == out[i])) out[i] = Replicate{};
  return out;
}

// redistribute without the public API's refusal of Partial targets (ops and backward use it).
// `cause` names it to a CommDebugMode (NOTE: [CommDebugMode]).
const std::string kRedistribute = "redistribute";
at::Tensor redistribute_unchecked(const at::Tensor& dt, const DeviceMesh& mesh, std::vector<Placement> placements,
                                  const RedistributeOptions& options, const std::string& cause = kRedistribute);

struct RedistributeBackward : Node {
  static inline const std::string kName = "dtensor::RedistributeBackward";
  std::optional<DTensorSpec> input_spec;
  std::optional<at::ScalarType> backward_dtype;
  std::vector<nn::detail::ModuleFrame> modules;  // where the forward ran (a CommDebugMode's)
  std::string name() const override { return "dtensor::RedistributeBackward"; }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    const nn::detail::ModuleStackScope where(modules);
    at::Tensor g = grads[0];
    if (!is_dtensor(g)) g = make_dtensor(g, *input_spec);  // a plain zero/ones gradient: same layout
    const at::ScalarType original = input_spec->tensor_meta.dtype;
    RedistributeOptions o;
    o.forward_dtype = backward_dtype.value_or(original);
    at::Tensor out = redistribute_unchecked(
        g, input_spec->mesh, backward_placements(get_spec(g).placements, input_spec->placements), o, kName);
    if (out.scalar_type() != original) out = out.to(original);
    return {out};
  }
};

struct FromLocalBackward : Node {
  static inline const std::string kName = "dtensor::FromLocalBackward";
  std::optional<DTensorSpec> spec;
  std::vector<nn::detail::ModuleFrame> modules;  // where the forward ran (a CommDebugMode's)
  std::string name() const override { return kName; }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::Tensor g = grads[0];
    if (!is_dtensor(g)) return {g};
    const nn::detail::ModuleStackScope where(modules);
    return {to_local(redistribute_unchecked(g, spec->mesh, backward_placements(get_spec(g).placements, spec->placements),
                                            {}, kName))};
  }
};

struct ToLocalBackward : Node {
  std::optional<DTensorSpec> spec;
  std::optional<std::vector<Placement>> grad_placements;
  std::string name() const override { return "dtensor::ToLocalBackward"; }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {from_local(grads[0], spec->mesh, grad_placements ? *grad_placements : spec->placements,
                       FromLocalOptions::contiguous(spec->tensor_meta.shape))};
  }
};

thread_local std::vector<DeviceMesh> t_mesh_stack;

// The source rank of distribute_tensor: the rank at coordinate `k` on every mesh dim.
int source_rank(const DeviceMesh& mesh, int64_t k) {
  at::Tensor m = mesh.mesh();
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    TORCH_CHECK(k >= 0 && k < mesh.size(i), "distribute_tensor: src_data_rank ", k, " is not a coordinate of mesh dim ",
                i, " (size ", mesh.size(i), ") of ", mesh.to_string());
    m = m.select(0, k);
  }
  return static_cast<int>(m.item<int64_t>());
}

}  // namespace

bool is_dtensor(const at::Tensor& t) { return maybe_get_dtensor_impl(t) != nullptr; }

const DTensorSpec& get_spec(const at::Tensor& t) {
  auto* impl = maybe_get_dtensor_impl(t);
  TORCH_CHECK(impl != nullptr, "expected a DTensor, got a plain ", t.defined() ? t.toString() : "undefined",
              " tensor");
  return impl->spec();
}

const at::Tensor& local_tensor(const at::Tensor& t) {
  get_spec(t);
  return unsafe_get_dtensor_impl(t)->local();
}

// World rank of the i-th rank of `mesh` in row-major order.
static int64_t mesh_rank_at(const DeviceMesh& mesh, size_t i) {
  return mesh.mesh().data_ptr<int64_t>()[i];
}

// With the call check on (NOTE: [Call check], dtensor/comm/c10d_guard.cpp), ranks of the mesh
// that pass different placements (which the broadcast cannot see) all raise, naming each
// rank's call.
static void check_same_distribution(const DeviceMesh& mesh, const at::Tensor& tensor,
                                    const std::vector<Placement>& placements) {
  if (mesh.size() <= 1 || !comm::check_collectives_enabled()) return;
  std::ostringstream os;
  os << tensor.scalar_type() << tensor.sizes() << "," << to_string(placements);
  const auto all = mesh_all_gather_object(mesh, os.str());
  bool same = true;
  for (const auto& a : all) same = same && a == all[0];
  if (same) return;
  std::ostringstream msg;
  msg << "distribute_tensor: ranks passed different tensors or placements on " << mesh.to_string() << ":";
  for (size_t r = 0; r < all.size(); ++r)
    msg << " [rank " << mesh_rank_at(mesh, r) << ": distribute_tensor(" << all[r] << ")]";
  TORCH_CHECK(false, msg.str());
}

// NOTE: [Ranks outside the mesh]
// A DeviceMesh may hold a subset of the world. As in PyTorch, a rank outside it takes part in
// nothing: distribute_tensor and from_local give it a DTensor whose local tensor is empty
// (shape [0], the dtype of the tensor), with no communication; redistribute returns that
// local as is; ops produce empty locals there without running (dispatch.cpp).
static at::Tensor empty_local_outside_mesh(const at::Tensor& like, const DeviceMesh& mesh) {
  return at::empty({0}, like.options().device(like.is_meta() ? like.device() : mesh.device()));
}

at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh, std::vector<Placement> placements,
                             std::optional<int64_t> src_data_rank) {
  TORCH_CHECK(tensor.defined(), "distribute_tensor: the tensor is undefined");
  TORCH_CHECK(!is_dtensor(tensor), "distribute_tensor: the tensor is already a DTensor; use redistribute");
  if (placements.empty()) placements.assign(static_cast<size_t>(mesh.ndim()), Replicate{});
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "distribute_tensor: ",
              placements.size(), " placements for the ", mesh.ndim(), "-D mesh ", mesh.to_string());
  placements = normalize_placements(placements, tensor.dim());
  if (!mesh.get_coordinate().has_value()) {  // NOTE: [Ranks outside the mesh]
    at::Tensor out = make_dtensor(empty_local_outside_mesh(tensor, mesh),
                                  DTensorSpec(mesh, placements, contiguous_meta(tensor.sizes().vec(), tensor.scalar_type())));
    if (tensor.requires_grad()) out.set_requires_grad(true);
    return out;
  }
  at::Tensor local;
  {
    at::NoGradGuard no_grad;
    // On the mesh's device: a CPU tensor distributed over a "cuda" mesh lands on each rank's GPU.
    at::Tensor full = tensor.is_meta() ? tensor.detach() : tensor.detach().to(mesh.device());
    // A meta tensor has no values to send: every rank builds its shard's metadata alone, as
    // from_local does (Replicate -> anything is local).
    if (src_data_rank.has_value() && !full.is_meta()) {
      // The source rank's values reach every rank (PyTorch: group rank src_data_rank of each
      // mesh dim): broadcasting along dim 0, then dim 1, ... from position k leaves every rank
      // with the values of the rank at (k, k, ...).
      full = full.clone(at::MemoryFormat::Contiguous);
      check_same_distribution(mesh, tensor, placements);
      source_rank(mesh, *src_data_rank);  // checks k against every mesh dim
      for (int64_t i = 0; i < mesh.ndim(); ++i) mesh_broadcast(full, mesh, i, static_cast<int>(*src_data_rank));
    }
    TensorMeta meta = contiguous_meta(tensor.sizes().vec(), tensor.scalar_type());
    DTensorSpec replicated(mesh, std::vector<Placement>(placements.size(), Replicate{}), meta);
    // NOTE: [distribute_tensor to Partial]
    // As PyTorch (Replicate, then Partial._partition_value): a Partial(sum) mesh dim divides
    // the replicated value by the dim's size; Partial(avg/min/max) keeps it on every rank.
    // Integer tensors cannot be divided exactly: Partial(sum) keeps the value on coordinate 0
    // of the dim and zeros elsewhere (PyTorch's division would change their dtype).
    std::vector<Placement> no_partial = placements;
    for (auto& p : no_partial)
      if (is_partial(p)) p = Replicate{};
    local = detail::redistribute_local(full, replicated, no_partial);
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      const auto* partial = std::get_if<Partial>(&placements[static_cast<size_t>(i)]);
      if (!partial || partial->reduce_op != comm::ReduceOp::SUM || mesh.size(i) == 1) continue;
      if (at::isFloatingType(local.scalar_type()) || at::isComplexType(local.scalar_type()))
        local = local / mesh.size(i);
      else if (mesh.get_local_rank(i) != 0)
        local = at::zeros_like(local);
    }
    if (local.is_alias_of(tensor)) local = local.clone();  // never alias the caller's tensor
    DTensorSpec spec(mesh, placements, meta);
    at::Tensor out = make_dtensor(local, spec);
    if (tensor.requires_grad()) out.set_requires_grad(true);
    return out;
  }
}

at::Tensor distribute_tensor(const at::Tensor& tensor, std::vector<Placement> placements) {
  return distribute_tensor(tensor, current_mesh(), std::move(placements));
}

at::Tensor _shard_tensor(const at::Tensor& full, std::vector<Placement> placements, const DeviceMesh& mesh) {
  return distribute_tensor(full, mesh, std::move(placements), std::nullopt);
}

FromLocalOptions FromLocalOptions::contiguous(std::vector<int64_t> shape, bool run_check) {
  FromLocalOptions o;
  o.run_check = run_check;
  const auto st = c10::contiguous_strides(shape);
  o.stride = std::vector<int64_t>(st.begin(), st.end());
  o.shape = std::move(shape);
  return o;
}

at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                      bool run_check) {
  FromLocalOptions o;
  o.run_check = run_check;
  return from_local(local, mesh, std::move(placements), o);
}

at::Tensor from_local(const at::Tensor& local, std::vector<Placement> placements, const FromLocalOptions& options) {
  return from_local(local, current_mesh(), std::move(placements), options);
}

namespace {

// from_local's run_check: every rank of the mesh sees every such rank's (dtype, requires_grad,
// shape), so every one raises the same error. Without a given shape the local shapes must be
// equal (PyTorch's check_tensor_meta(check_shape_stride=True)): uneven shards need `shape`.
// Ranks outside the mesh take no part (NOTE: [Ranks outside the mesh]).
void check_local_tensors(const at::Tensor& local, const DeviceMesh& mesh, const std::vector<Placement>& placements,
                         bool shape_given) {
  std::vector<int64_t> mine = local.sizes().vec();
  mine.push_back(local.requires_grad() ? 1 : 0);
  mine.push_back(static_cast<int64_t>(local.scalar_type()));
  const auto all = mesh_all_gather_object(mesh, mine);
  const int64_t first = mesh_rank_at(mesh, 0);
  auto dtype_of = [](const std::vector<int64_t>& v) {
    return c10::toString(static_cast<at::ScalarType>(v.back()));
  };
  for (size_t r = 0; r < all.size(); ++r) {
    TORCH_CHECK(all[r].size() == all[0].size() && all[r].back() == all[0].back(), "from_local(run_check): rank ",
                mesh_rank_at(mesh, r), " passed a local tensor of dtype ", dtype_of(all[r]), " with ", all[r].size() - 2,
                " dims, but rank ", first, " passed ", dtype_of(all[0]), " with ", all[0].size() - 2,
                " dims; every rank must pass the same dtype and number of dims");
    TORCH_CHECK(all[r][all[r].size() - 2] == all[0][all[0].size() - 2], "from_local(run_check): rank ", mesh_rank_at(mesh, r),
                " passed a local tensor with requires_grad=", all[r][all[r].size() - 2] ? "true" : "false",
                " but rank ", first, " with requires_grad=", all[0][all[0].size() - 2] ? "true" : "false",
                "; every rank must pass the same requires_grad");
    for (size_t d = 0; d + 2 < all[0].size(); ++d) {
      bool sharded = false;
      for (auto& p : placements) sharded = sharded || is_shard(p, static_cast<int64_t>(d));
      TORCH_CHECK(sharded || all[r][d] == all[0][d], "from_local(run_check): dim ", d,
                  " is not sharded by ", to_string(placements), " but rank ", mesh_rank_at(mesh, r), " has size ",
                  all[r][d], " where rank ", first, " has ", all[0][d], "; replicated dims must match on every rank");
      TORCH_CHECK(shape_given || all[r][d] == all[0][d], "from_local(run_check): the local tensors are uneven (dim ",
                  d, ": rank ", mesh_rank_at(mesh, r), " has size ", all[r][d], ", rank ", first, " has ", all[0][d],
                  "); pass the global shape and stride for uneven shards");
    }
  }
}

// The global shape and stride of a DTensor made from `local`: the given ones, or (PyTorch's
// compute_global_tensor_info) even shards assumed, strides rescaled.
std::pair<std::vector<int64_t>, std::vector<int64_t>> global_shape_and_stride(const at::Tensor& local,
                                                                                const DeviceMesh& mesh,
                                                                                const std::vector<Placement>& placements,
                                                                                const FromLocalOptions& options) {
  if (options.shape) {
    TORCH_CHECK(options.stride->size() == options.shape->size(), "from_local: stride ", c10::IntArrayRef(*options.stride),
                " has ", options.stride->size(), " dims but shape ", c10::IntArrayRef(*options.shape), " has ",
                options.shape->size());
    return {*options.shape, *options.stride};
  }
  std::vector<int64_t> global = local.sizes().vec(), stride = local.strides().vec();
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!is_shard(placements[i])) continue;
    const int64_t d = std::get<Shard>(placements[i]).dim;
    const int64_t k = mesh.size(static_cast<int64_t>(i));
    for (size_t j = 0; j < stride.size(); ++j)
      if (static_cast<int64_t>(j) != d && stride[j] >= stride[static_cast<size_t>(d)]) stride[j] *= k;
    global[static_cast<size_t>(d)] *= k;
  }
  return {global, stride};
}

}  // namespace

at::Tensor from_local(const at::Tensor& local_in, const DeviceMesh& mesh, std::vector<Placement> placements,
                      const FromLocalOptions& options) {
  TORCH_CHECK(local_in.defined() && !is_dtensor(local_in), "from_local: expected a plain local tensor");
  if (placements.empty()) placements.assign(static_cast<size_t>(mesh.ndim()), Replicate{});
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "from_local: ",
              placements.size(), " placements for the ", mesh.ndim(), "-D mesh ", mesh.to_string());
  TORCH_CHECK(options.shape.has_value() == options.stride.has_value(), "from_local: found shape ",
              options.shape ? c10::str(c10::IntArrayRef(*options.shape)) : "None", " and stride ",
              options.stride ? c10::str(c10::IntArrayRef(*options.stride)) : "None",
              "; pass both shape and stride, or neither");
  placements = normalize_placements(placements, local_in.dim());
  at::Tensor local = local_in;
  // Local tensors live on the mesh's device type (as PyTorch, a local tensor on another device
  // type is moved there, differentiably; meta stays meta); a CUDA local must be on this rank's GPU.
  const at::Device device = local.is_meta() ? local.device() : mesh.device();
  if (local.device().type() != device.type()) return from_local(local.to(device), mesh, std::move(placements), options);
  TORCH_CHECK(local.device() == device, "from_local: the local tensor is on ", local.device(), " but rank ",
              mesh.get_rank(), " of ", mesh.to_string(), " keeps its local tensors on ", device,
              "; move it there (local.to(mesh.device()))");
  const bool in_mesh = mesh.get_coordinate().has_value();
  if (options.run_check && in_mesh) {
    check_local_tensors(local, mesh, placements, options.shape.has_value());
    // Replicate mesh dims take their first rank's values (PyTorch's mesh_broadcast).
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      if (!is_replicate(placements[static_cast<size_t>(i)])) continue;
      if (local.is_same(local_in)) local = local_in.detach().clone(at::MemoryFormat::Contiguous);
      mesh_broadcast(local, mesh, i);
    }
  }
  auto [global, stride] = global_shape_and_stride(local, mesh, placements, options);
  TensorMeta meta = contiguous_meta(global, local.scalar_type());
  meta.stride = stride;
  DTensorSpec spec(mesh, placements, meta);
  if (!in_mesh) {  // NOTE: [Ranks outside the mesh]
    at::Tensor out = make_dtensor(empty_local_outside_mesh(local, mesh), spec);
    if (local_in.requires_grad()) out.set_requires_grad(true);
    return out;
  }
  auto expected = compute_local_shape(global, mesh, placements);
  TORCH_CHECK(expected == local.sizes().vec(), "from_local: a local tensor of shape ", local.sizes(),
              " is not this rank's shard of ", c10::IntArrayRef(global), " under ", to_string(placements),
              " (expected ", c10::IntArrayRef(expected), ")");
  // NOTE: [Global strides of from_local]
  // The DTensor reports PyTorch's global strides (given, or rescaled from the local ones: a
  // permuted local tensor gives permuted global strides), but its local tensor is kept
  // contiguous: the view rules rewrite sizes for contiguous locals (a transposed local would
  // otherwise fail to view). The autograd edge stays on `local`.
  at::Tensor out = make_dtensor(local.is_contiguous() ? local : local.contiguous(), spec);
  auto node = new_node<FromLocalBackward>();
  node->modules = debug::detail::module_stack_to_save();
  node->spec = spec;
  connect(local_in, out, node);
  return out;
}

at::Tensor to_local(const at::Tensor& dt, std::optional<std::vector<Placement>> grad_placements) {
  auto* impl = maybe_get_dtensor_impl(dt);
  TORCH_CHECK(impl != nullptr, "to_local: expected a DTensor");
  if (grad_placements) {
    TORCH_CHECK(static_cast<int64_t>(grad_placements->size()) == impl->spec().mesh.ndim(), "to_local: ",
                grad_placements->size(), " grad_placements for the ", impl->spec().mesh.ndim(), "-D mesh ",
                impl->spec().mesh.to_string());
    grad_placements = normalize_placements(*grad_placements, dt.dim());
  }
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = impl->local().alias();
  }
  auto node = new_node<ToLocalBackward>();
  node->spec = impl->spec();
  node->grad_placements = std::move(grad_placements);
  connect(dt, out, node);
  return out;
}

namespace {

at::Tensor redistribute_unchecked(const at::Tensor& dt, const DeviceMesh& mesh, std::vector<Placement> placements,
                                  const RedistributeOptions& options, const std::string& cause) {
  auto* impl = maybe_get_dtensor_impl(dt);
  TORCH_CHECK(impl != nullptr, "redistribute: expected a DTensor");
  TORCH_CHECK(mesh == impl->spec().mesh, "redistribute: moving to another mesh is not supported (from ",
              impl->spec().mesh.to_string(), " to ", mesh.to_string(), ")");
  placements = normalize_placements(placements, dt.dim());
  at::Tensor local, out;
  DTensorSpec from = impl->spec();
  const debug::detail::CollectiveCause why(cause, -1, from.placements, placements, mesh);
  {
    at::NoGradGuard no_grad;
    local = impl->local();
    if (options.forward_dtype && *options.forward_dtype != local.scalar_type()) {
      local = local.to(*options.forward_dtype);
      from.tensor_meta.dtype = *options.forward_dtype;
    }
    DTensorSpec to(mesh, placements, from.tensor_meta);
    if (options.async_op && from.placements != placements && mesh.get_coordinate().has_value()) {
      // NOTE: [Async DTensors]: the last collective reads its input while the caller goes on
      // and may write into the DTensor it came from, so it gets its own copy (PyTorch's CUDA
      // stream order gives the same guarantee).
      at::Tensor input = local.is_same(impl->local()) ? local.clone() : local;
      auto pending = detail::redistribute_local_async(input, from, placements);
      auto result = std::make_shared<at::Tensor>();
      comm::WorkPtr work;
      if (pending.work) {
        work = comm::Work::chain(pending.work, [then = std::move(pending.then), result]() {
          at::NoGradGuard no_grad_at_wait;
          *result = then().detach();
        });
      } else {
        *result = pending.value.detach();
        work = comm::Work::completed("redistribute", mesh.to_string());
      }
      out = make_async_dtensor(std::move(work), std::move(result), input.device(), std::move(to));
    } else {
      out = make_dtensor(detail::redistribute_local(local, from, placements), std::move(to));
    }
  }
  auto node = new_node<RedistributeBackward>();
  node->modules = debug::detail::module_stack_to_save();
  node->input_spec = impl->spec();
  node->backward_dtype = options.backward_dtype;
  connect(dt, out, node);
  return out;
}

}  // namespace

at::Tensor redistribute(const at::Tensor& dt, const DeviceMesh& mesh, std::vector<Placement> placements,
                        const RedistributeOptions& options) {
  const DTensorSpec& spec = get_spec(dt);
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == spec.mesh.ndim(), "redistribute: ", placements.size(),
              " placements given for a ", spec.mesh.ndim(), "-D mesh ", spec.mesh.to_string());
  for (size_t i = 0; i < placements.size(); ++i)
    TORCH_CHECK(!is_partial(placements[i]) || placements[i] == spec.placements[i], "Can not redistribute from ",
                to_string(spec.placements[i]), " to ", to_string(placements[i]), " (mesh dim ", i, " of ",
                spec.mesh.to_string(), "): redistributing to Partial is for internal use only. Partial is what "
                "ops produce (a sum, a matmul of sharded operands); to get Partial values, compute them");
  return redistribute_unchecked(dt, mesh, std::move(placements), options);
}

at::Tensor redistribute(const at::Tensor& dt, std::vector<Placement> placements, const RedistributeOptions& options) {
  return redistribute(dt, get_spec(dt).mesh, std::move(placements), options);
}

namespace detail {
at::Tensor redistribute_to_any(const at::Tensor& dt, std::vector<Placement> placements) {
  return redistribute_unchecked(dt, get_spec(dt).mesh, std::move(placements), {});
}
}  // namespace detail

at::Tensor full_tensor(const at::Tensor& dt, std::optional<std::vector<Placement>> grad_placements) {
  const DTensorSpec& spec = get_spec(dt);
  return to_local(redistribute(dt, spec.mesh, std::vector<Placement>(spec.placements.size(), Replicate{})),
                  std::move(grad_placements));
}

at::Tensor wait_tensor(const at::Tensor& dt) {
  if (auto* impl = maybe_get_dtensor_impl(dt)) impl->local();
  return dt;
}

bool is_async_pending(const at::Tensor& dt) {
  auto* impl = maybe_get_dtensor_impl(dt);
  return impl != nullptr && impl->is_pending();
}

DTensor::DTensor(const at::Tensor& local_tensor, const DTensorSpec& spec, bool requires_grad) {
  TORCH_CHECK(local_tensor.defined() && !is_dtensor(local_tensor), "DTensor: expected a plain local tensor");
  TORCH_CHECK(local_tensor.scalar_type() == spec.tensor_meta.dtype, "DTensor: the local tensor is ",
              local_tensor.scalar_type(), " but the spec says ", spec.tensor_meta.dtype);
  const auto expected = compute_local_shape(spec.tensor_meta.shape, spec.mesh, spec.placements);
  TORCH_CHECK(!spec.mesh.get_coordinate().has_value() || expected == local_tensor.sizes().vec(),
              "DTensor: a local tensor of shape ", local_tensor.sizes(), " is not this rank's shard of ",
              spec.to_string(), " (expected ", c10::IntArrayRef(expected), ")");
  tensor_ = make_dtensor(local_tensor.is_contiguous() ? local_tensor : local_tensor.contiguous(), spec);
  if (requires_grad) tensor_.set_requires_grad(true);
}

DeviceMeshGuard::DeviceMeshGuard(const DeviceMesh& mesh) { t_mesh_stack.push_back(mesh); }
DeviceMeshGuard::~DeviceMeshGuard() { t_mesh_stack.pop_back(); }
bool has_current_mesh() { return !t_mesh_stack.empty(); }
const DeviceMesh& current_mesh() {
  TORCH_CHECK(!t_mesh_stack.empty(), "no current DeviceMesh on this thread: pass the mesh, or create a "
              "dtensor::DeviceMeshGuard(mesh) first (PyTorch: `with mesh:`)");
  return t_mesh_stack.back();
}

std::string to_string(const at::Tensor& dt) {
  std::ostringstream os;
  print(os, dt);
  return os.str();
}

void print(std::ostream& os, const at::Tensor& dt) {
  auto* impl = maybe_get_dtensor_impl(dt);
  if (!impl) {
    os << dt;
    return;
  }
  const auto& s = impl->spec();
  os << "DTensor(local_tensor=" << impl->local() << ", device_mesh=" << s.mesh.to_string()
     << ", placements=" << to_string(s.placements) << ", shape=" << c10::IntArrayRef(s.tensor_meta.shape)
     << ", dtype=" << s.tensor_meta.dtype << (dt.requires_grad() ? ", requires_grad=True" : "") << ")";
}

ImplicitReplicationGuard::ImplicitReplicationGuard() : prev_(t_implicit_replication) {
  t_implicit_replication = true;
}
ImplicitReplicationGuard::~ImplicitReplicationGuard() { t_implicit_replication = prev_; }
bool ImplicitReplicationGuard::enabled() { return t_implicit_replication; }

}  // namespace dtensor
