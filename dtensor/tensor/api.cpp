// dtensor/tensor/api.cpp: distribute_tensor, from_local, to_local, redistribute, full_tensor,
// printing, and their autograd (hand-written autograd Nodes: the saved state is a DTensorSpec,
// which is not an IValue, so torch::autograd::Function's saved_data does not fit).
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/object_collectives.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
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
template <class N>
void connect(const at::Tensor& input, at::Tensor& out, std::shared_ptr<N> node) {
  if (!at::GradMode::is_enabled() || !input.requires_grad()) return;
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
}

template <class N>
std::shared_ptr<N> new_node() {
  return std::shared_ptr<N>(new N(), torch::autograd::deleteNode);
}

std::vector<Placement> grad_placements(const std::vector<Placement>& ps) {
  std::vector<Placement> out = ps;
  for (auto& p : out)
    if (is_partial(p)) p = Replicate{};
  return out;
}

struct RedistributeBackward : Node {
  std::optional<DTensorSpec> input_spec;
  std::string name() const override { return "dtensor::RedistributeBackward"; }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {redistribute(grads[0], input_spec->mesh, grad_placements(input_spec->placements))};
  }
};

struct FromLocalBackward : Node {
  std::optional<DTensorSpec> spec;
  std::string name() const override { return "dtensor::FromLocalBackward"; }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::Tensor g = grads[0];
    if (!is_dtensor(g)) return {g};
    return {to_local(redistribute(g, spec->mesh, grad_placements(spec->placements)))};
  }
};

struct ToLocalBackward : Node {
  std::optional<DTensorSpec> spec;
  std::string name() const override { return "dtensor::ToLocalBackward"; }
  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {from_local(grads[0], spec->mesh, spec->placements, false, spec->tensor_meta.shape)};
  }
};

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

// With the call check on (NOTE: [Call check], dtensor/comm/c10d_guard.cpp), ranks that pass
// different placements (which the broadcast cannot see) all raise, naming each rank's call.
static void check_same_distribution(comm::Group& world, const at::Tensor& tensor,
                                    const std::vector<Placement>& placements) {
  if (world.size() <= 1 || !comm::check_collectives_enabled()) return;
  std::ostringstream os;
  os << tensor.scalar_type() << tensor.sizes() << "," << to_string(placements);
  const auto all = comm::all_gather_object(world, os.str());
  bool same = true;
  for (const auto& a : all) same = same && a == all[0];
  if (same) return;
  std::ostringstream msg;
  msg << "distribute_tensor: ranks passed different tensors or placements on " << world.describe() << ":";
  for (size_t r = 0; r < all.size(); ++r) msg << " [rank " << r << ": distribute_tensor(" << all[r] << ")]";
  TORCH_CHECK(false, msg.str());
}

at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh,
                             std::vector<Placement> placements) {
  TORCH_CHECK(tensor.defined(), "distribute_tensor: the tensor is undefined");
  TORCH_CHECK(!is_dtensor(tensor), "distribute_tensor: the tensor is already a DTensor; use redistribute");
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "distribute_tensor: ",
              placements.size(), " placements for the ", mesh.ndim(), "-D mesh ", mesh.to_string());
  placements = normalize_placements(placements, tensor.dim());
  at::Tensor local;
  {
    at::NoGradGuard no_grad;
    // The mesh's first rank is the source: every rank starts from its values.
    at::Tensor full = tensor.detach().clone(at::MemoryFormat::Contiguous);
    // A meta tensor has no values to send: every rank builds its shard's metadata alone, as
    // from_local does (Replicate -> anything is local).
    if (!full.is_meta()) {
      const auto& world = mesh.world();
      check_same_distribution(*world, tensor, placements);
      const int src = static_cast<int>(mesh.mesh().flatten()[0].item<int64_t>());
      world->broadcast(full, world->group_rank_of(src));
    }
    TensorMeta meta = contiguous_meta(tensor.sizes().vec(), tensor.scalar_type());
    DTensorSpec replicated(mesh, std::vector<Placement>(placements.size(), Replicate{}), meta);
    local = detail::redistribute_local(full, replicated, placements);
    DTensorSpec spec(mesh, placements, meta);
    at::Tensor out = make_dtensor(local, spec);
    if (tensor.requires_grad()) out.set_requires_grad(true);
    return out;
  }
}

at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                      bool run_check, std::optional<std::vector<int64_t>> shape) {
  TORCH_CHECK(local.defined() && !is_dtensor(local), "from_local: expected a plain local tensor");
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "from_local: ",
              placements.size(), " placements for the ", mesh.ndim(), "-D mesh ", mesh.to_string());
  placements = normalize_placements(placements, local.dim());
  if (run_check) {
    // Every rank sees every rank's (dtype, shape), so every rank raises the same error.
    std::vector<int64_t> mine = local.sizes().vec();
    mine.push_back(static_cast<int64_t>(local.scalar_type()));
    auto all = comm::all_gather_object(*mesh.world(), mine);
    for (size_t r = 0; r < all.size(); ++r) {
      TORCH_CHECK(all[r].size() == all[0].size() && all[r].back() == all[0].back(), "from_local(run_check): rank ",
                  r, " passed a local tensor of dtype ", c10::toString(static_cast<at::ScalarType>(all[r].back())),
                  " with ", all[r].size() - 1, " dims, but rank 0 passed ",
                  c10::toString(static_cast<at::ScalarType>(all[0].back())), " with ", all[0].size() - 1,
                  " dims; every rank must pass the same dtype and number of dims");
      for (size_t d = 0; d + 1 < all[0].size(); ++d) {
        bool sharded = false;
        for (auto& p : placements) sharded = sharded || is_shard(p, static_cast<int64_t>(d));
        TORCH_CHECK(sharded || all[r][d] == all[0][d], "from_local(run_check): dim ", d,
                    " is not sharded by ", to_string(placements), " but rank ", r, " has size ", all[r][d],
                    " where rank 0 has ", all[0][d], "; replicated dims must match on every rank");
      }
    }
  }
  std::vector<int64_t> global = shape ? *shape : local.sizes().vec();
  if (!shape) {
    // Even shards assumed (as PyTorch); pass `shape` for uneven ones.
    for (size_t i = 0; i < placements.size(); ++i)
      if (is_shard(placements[i])) global[std::get<Shard>(placements[i]).dim] *= mesh.size(static_cast<int64_t>(i));
  }
  DTensorSpec spec(mesh, placements, contiguous_meta(global, local.scalar_type()));
  auto expected = compute_local_shape(global, mesh, placements);
  TORCH_CHECK(expected == local.sizes().vec(), "from_local: a local tensor of shape ", local.sizes(),
              " is not this rank's shard of ", c10::IntArrayRef(global), " under ", to_string(placements),
              " (expected ", c10::IntArrayRef(expected), ")");
  // The spec's strides are contiguous, so the DTensor holds a contiguous local tensor (views of
  // the DTensor rewrite sizes for contiguous locals; a transposed local, e.g. a gradient coming
  // back through to_local, would otherwise fail to view). The autograd edge stays on `local`.
  at::Tensor out = make_dtensor(local.is_contiguous() ? local : local.contiguous(), spec);
  auto node = new_node<FromLocalBackward>();
  node->spec = spec;
  connect(local, out, node);
  return out;
}

at::Tensor to_local(const at::Tensor& dt) {
  auto* impl = maybe_get_dtensor_impl(dt);
  TORCH_CHECK(impl != nullptr, "to_local: expected a DTensor");
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    out = impl->local().alias();
  }
  auto node = new_node<ToLocalBackward>();
  node->spec = impl->spec();
  connect(dt, out, node);
  return out;
}

at::Tensor redistribute(const at::Tensor& dt, const DeviceMesh& mesh, std::vector<Placement> placements) {
  auto* impl = maybe_get_dtensor_impl(dt);
  TORCH_CHECK(impl != nullptr, "redistribute: expected a DTensor");
  TORCH_CHECK(mesh == impl->spec().mesh, "redistribute: moving to another mesh is not supported (from ",
              impl->spec().mesh.to_string(), " to ", mesh.to_string(), ")");
  placements = normalize_placements(placements, dt.dim());
  at::Tensor local;
  {
    at::NoGradGuard no_grad;
    local = detail::redistribute_local(impl->local(), impl->spec(), placements);
  }
  at::Tensor out = make_dtensor(local, DTensorSpec(mesh, placements, impl->spec().tensor_meta));
  auto node = new_node<RedistributeBackward>();
  node->input_spec = impl->spec();
  connect(dt, out, node);
  return out;
}

at::Tensor redistribute(const at::Tensor& dt, std::vector<Placement> placements) {
  return redistribute(dt, get_spec(dt).mesh, std::move(placements));
}

at::Tensor full_tensor(const at::Tensor& dt) {
  const DTensorSpec& spec = get_spec(dt);
  return to_local(redistribute(dt, spec.mesh, std::vector<Placement>(spec.placements.size(), Replicate{})));
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
