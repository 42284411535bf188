// dtensor/tensor/random.cpp: the RNG tracker (NOTE: [RNG tracker]), random ops on DTensors
// (NOTE: [Random ops on DTensors]) and the random factories.
#include "dtensor/tensor/random.h"

#include "dtensor/comm/object_collectives.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/tensor/output_meta_internal.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <sstream>
#include <unordered_map>

namespace dtensor {

namespace {

// ---- the tracker: one generator per world group ------------------------------------------------

// The trackers of the process, one per world group (a thread-rank world's ranks share it).
class Trackers {
 public:
  static Trackers& instance() {
    static Trackers trackers;
    return trackers;
  }
  std::optional<at::Generator> find(const comm::GroupPtr& world) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_world_.find(world.get());
    if (it == by_world_.end()) return std::nullopt;
    if (it->second.world.lock() != world) {  // the group it belonged to is gone
      by_world_.erase(it);
      return std::nullopt;
    }
    return it->second.generator;
  }
  void set(const comm::GroupPtr& world, at::Generator generator) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = by_world_.begin(); it != by_world_.end();)  // forget groups that are gone
      it = it->second.world.expired() ? by_world_.erase(it) : std::next(it);
    by_world_[world.get()] = Tracker{world, std::move(generator)};
  }

 private:
  struct Tracker {
    std::weak_ptr<comm::Group> world;  // a new group at a freed group's address is not this one
    at::Generator generator;
  };
  Trackers() = default;
  std::mutex mu_;
  std::unordered_map<const comm::Group*, Tracker> by_world_;
};

std::optional<at::Generator> find_tracker(const comm::GroupPtr& world) { return Trackers::instance().find(world); }
void set_tracker(const comm::GroupPtr& world, at::Generator generator) {
  Trackers::instance().set(world, std::move(generator));
}

const comm::GroupPtr& world_of(const DeviceMesh& mesh, const char* what) {
  const comm::GroupPtr& world = mesh.world();
  TORCH_CHECK(world != nullptr, what, ": the mesh ", mesh.to_string(), " has no world group");
  TORCH_CHECK(mesh.device_type() == "cpu", what, ": the DTensor RNG tracker draws from libtorch's CPU generator, "
              "so it supports meshes of device type \"cpu\"; got ", mesh.to_string());
  return world;
}

// ---- shards of global tensors -----------------------------------------------------------------

// The view of `global` that is this rank's shard under `placements`.
at::Tensor shard_region(const at::Tensor& global, const DeviceMesh& mesh, const std::vector<Placement>& placements) {
  auto [shape, offset] = compute_local_shape_and_global_offset(global.sizes(), mesh, placements);
  at::Tensor r = global;
  for (int64_t d = 0; d < global.dim(); ++d)
    if (shape[d] != global.size(d)) r = r.narrow(d, offset[d], shape[d]);
  return r;
}

bool any_shard(const std::vector<Placement>& placements) {
  for (const auto& p : placements)
    if (is_shard(p)) return true;
  return false;
}

// Step 1 of NOTE: [Random ops on DTensors]: the local shard in place, zeros elsewhere, with the
// global strides (a kernel walks memory in stride order, as it does on the plain tensor).
at::Tensor stand_in(const at::Tensor& local, const DeviceMesh& mesh, const std::vector<Placement>& placements,
                    const TensorMeta& meta) {
  if (!any_shard(placements)) return local;  // Replicate / Partial: the local tensor has the global shape
  const auto options = local.options().dtype(meta.dtype);
  at::Tensor global;
  if (meta.stride.size() == meta.shape.size()) global = at::empty_strided(meta.shape, meta.stride, options);
  if (!global.defined() || !global.is_non_overlapping_and_dense()) global = at::empty(meta.shape, options);
  global.zero_();
  shard_region(global, mesh, placements).copy_(local);
  return global;
}

std::string op_name(const c10::FunctionSchema& s) {
  return s.overload_name().empty() ? s.name() : s.name() + "." + s.overload_name();
}

// ---- re-expressions of random ops without a Generator argument ---------------------------------

template <class T>
c10::optional<T> opt(const c10::IValue& v, T (c10::IValue::*get)() const) {
  if (v.isNone()) return c10::nullopt;
  return (v.*get)();
}

// rand_like / randn_like(self, dtype, layout, device, pin_memory, memory_format): libtorch's
// kernels are empty_like(...).uniform_(0, 1) and empty_like(...).normal_(0, 1).
// `k`: the position of `dtype` (the tensor options follow self, or randint_like's bounds).
at::Tensor empty_like_from(const std::vector<c10::IValue>& a, size_t k = 1) {
  return at::empty_like(a[0].toTensor(), opt(a[k], &c10::IValue::toScalarType), opt(a[k + 1], &c10::IValue::toLayout),
                        opt(a[k + 2], &c10::IValue::toDevice), opt(a[k + 3], &c10::IValue::toBool),
                        opt(a[k + 4], &c10::IValue::toMemoryFormat));
}

std::vector<c10::IValue> rand_like_reexpression(const std::vector<c10::IValue>& a, const at::Generator& g) {
  return {empty_like_from(a).uniform_(0, 1, g)};
}

std::vector<c10::IValue> randn_like_reexpression(const std::vector<c10::IValue>& a, const at::Generator& g) {
  return {empty_like_from(a).normal_(0, 1, g)};
}

// randint_like(self, high, ...), randint_like.low_dtype(self, low, high, ...) and (libtorch
// 2.x) randint_like.Tensor(self, Tensor high, ...): empty_like(...).random_(low, high).
std::vector<c10::IValue> randint_like_reexpression(const std::vector<c10::IValue>& a, const at::Generator& g) {
  const int64_t high = a[1].isTensor() ? a[1].toTensor().item<int64_t>() : a[1].toInt();
  return {empty_like_from(a, 2).random_(0, high, g)};
}

std::vector<c10::IValue> randint_like_low_reexpression(const std::vector<c10::IValue>& a, const at::Generator& g) {
  return {empty_like_from(a, 3).random_(a[1].toInt(), a[2].toInt(), g)};
}

// native_dropout(input, p, train): libtorch's CPU kernel draws a bool mask with
// bernoulli_(1 - p) and returns (input * mask / (1 - p), mask); not training, (copy, ones).
std::vector<c10::IValue> native_dropout_reexpression(const std::vector<c10::IValue>& a, const at::Generator& g) {
  const at::Tensor& input = a[0].toTensor();
  const double p = a[1].toDouble();
  const bool train = a[2].isNone() || a[2].toBool();
  if (input.numel() == 0) return {input, at::empty_like(input, input.options())};
  if (!train) return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  const double p1m = 1. - p;
  const double scale = p1m == 0 ? 0. : 1. / p1m;
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  mask.bernoulli_(p1m, g);
  return {input.mul(mask).mul_(scale), mask};
}

using Reexpression = std::vector<c10::IValue> (*)(const std::vector<c10::IValue>&, const at::Generator&);

const std::unordered_map<std::string, Reexpression>& reexpressions() {
  static const std::unordered_map<std::string, Reexpression> m{
      {"aten::rand_like", &rand_like_reexpression},
      {"aten::randn_like", &randn_like_reexpression},
      {"aten::native_dropout", &native_dropout_reexpression},
      {"aten::randint_like", &randint_like_reexpression},
      {"aten::randint_like.Tensor", &randint_like_reexpression},
      {"aten::randint_like.low_dtype", &randint_like_low_reexpression},
  };
  return m;
}

at::Tensor random_factory(const char* name, bool normal, c10::IntArrayRef size, const DeviceMesh& mesh,
                          std::vector<Placement> placements, const at::TensorOptions& options) {
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), name, ": ", placements.size(),
              " placements for the ", mesh.ndim(), "-D mesh ", mesh.to_string());
  placements = normalize_placements(placements, static_cast<int64_t>(size.size()));
  for (const auto& p : placements)
    TORCH_CHECK(!is_partial(p), name, ": placements ", to_string(placements), " on ", mesh.to_string(),
                " hold a Partial; a random tensor is not a sum of per-rank values: use Shard or Replicate");
  TORCH_CHECK(!options.has_device() || options.device().is_cpu(), name, ": the device ", options.device(),
              " is not the mesh's (cpu)");
  at::Generator gen = get_rng_generator(mesh);
  const at::TensorOptions plain = options.requires_grad(c10::nullopt);
  at::Tensor full = normal ? at::randn(size, gen, plain) : at::rand(size, gen, plain);
  at::Tensor local = shard_region(full, mesh, placements).clone(at::MemoryFormat::Contiguous);
  at::Tensor out = make_dtensor(
      local, DTensorSpec(mesh, placements, TensorMeta{full.sizes().vec(), full.strides().vec(), full.scalar_type()}));
  if (options.requires_grad()) out.set_requires_grad(true);
  return out;
}

}  // namespace

void manual_seed(uint64_t seed, const DeviceMesh& mesh) {
  const comm::GroupPtr& world = world_of(mesh, "manual_seed");
  const std::vector<uint64_t> seeds = comm::all_gather_object(*world, seed);
  for (size_t r = 0; r < seeds.size(); ++r) {
    if (seeds[r] == seeds[0]) continue;
    std::ostringstream os;
    for (size_t q = 0; q < seeds.size(); ++q) os << (q ? ", " : "") << "rank " << q << ": " << seeds[q];
    TORCH_CHECK(false, "manual_seed: the ranks of ", mesh.to_string(), " passed different seeds (", os.str(),
                "); every rank of the mesh's world must pass the same seed");
  }
  set_tracker(world, at::detail::createCPUGenerator(seed));
}

at::Generator get_rng_generator(const DeviceMesh& mesh) {
  const comm::GroupPtr& world = world_of(mesh, "DTensor RNG tracker");
  if (auto g = find_tracker(world)) return *g;
  // First use without manual_seed: world rank 0's default generator state, everywhere.
  at::Tensor state;
  {
    at::Generator def = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lk(def.mutex());
    state = def.get_state().clone().contiguous();
  }
  world->broadcast(state, 0);
  at::Generator gen = at::detail::createCPUGenerator();
  {
    std::lock_guard<std::mutex> lk(gen.mutex());
    gen.set_state(state);
  }
  set_tracker(world, gen);
  return gen;
}

bool rng_tracker_initialized(const DeviceMesh& mesh) {
  return mesh.world() != nullptr && find_tracker(mesh.world()).has_value();
}

at::Tensor rand(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                const at::TensorOptions& options) {
  return random_factory("dtensor::rand", /*normal=*/false, size, mesh, std::move(placements), options);
}

at::Tensor randn(c10::IntArrayRef size, const DeviceMesh& mesh, std::vector<Placement> placements,
                 const at::TensorOptions& options) {
  return random_factory("dtensor::randn", /*normal=*/true, size, mesh, std::move(placements), options);
}

namespace detail {

bool has_random_reexpression(const std::string& op) { return reexpressions().count(op) != 0; }

void run_random_reexpression(const std::string& op, torch::jit::Stack* stack, size_t begin,
                             const at::Generator& generator) {
  const auto it = reexpressions().find(op);
  TORCH_INTERNAL_ASSERT(it != reexpressions().end(), op, " has no random re-expression");
  const std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  std::vector<c10::IValue> returns = it->second(args, generator);
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(begin), stack->end());
  for (auto& r : returns) stack->push_back(std::move(r));
}

void run_random_op(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t begin, const DeviceMesh& mesh,
                   const std::vector<RandomOpInput>& inputs, const std::vector<std::vector<Placement>>& outputs,
                   int written_arg) {
  const auto& schema = op.schema();
  const std::string name = op_name(schema);
  // 1. Global stand-ins.
  at::Tensor written_local, written_global;
  for (const RandomOpInput& in : inputs) {
    c10::IValue& slot = (*stack)[begin + in.arg];
    if (in.list_pos < 0) {
      const at::Tensor local = slot.toTensor();
      at::Tensor global = stand_in(local, mesh, in.placements, *in.meta);
      if (static_cast<int>(in.arg) == written_arg) {
        written_local = local;
        written_global = global;
      }
      slot = std::move(global);
    } else {
      auto list = slot.toTensorVector();
      auto& t = list[static_cast<size_t>(in.list_pos)];
      t = stand_in(t, mesh, in.placements, *in.meta);
      slot = list;
    }
  }
  // 2. The op, drawing from its generator argument or the tracker.
  if (has_random_reexpression(name)) {
    run_random_reexpression(name, stack, begin, get_rng_generator(mesh));
  } else {
    int gen_arg = -1;
    for (size_t i = 0; i < schema.arguments().size(); ++i)
      if (detail::is_generator_type(schema.arguments()[i].type())) gen_arg = static_cast<int>(i);
    TORCH_INTERNAL_ASSERT(gen_arg >= 0, name, " has a random sharding rule but neither a Generator argument nor a "
                          "re-expression (dtensor/tensor/random.cpp)");
    c10::IValue& g = (*stack)[begin + static_cast<size_t>(gen_arg)];
    if (g.isNone()) g = get_rng_generator(mesh);
    op.callBoxed(stack);
  }
  // 3. This rank's shard of every output.
  const size_t n_ret = schema.returns().size();
  const size_t rbegin = stack->size() - n_ret;
  size_t out_idx = 0;
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& v = (*stack)[rbegin + r];
    if (!v.isTensor()) continue;
    const size_t k = out_idx++;
    TORCH_INTERNAL_ASSERT(k < outputs.size(), name, ": the rule gave ", outputs.size(), " outputs");
    const auto& ai = schema.returns()[r].alias_info();
    if (ai && ai->isWrite() && written_local.defined()) {
      if (!written_global.is_same(written_local))
        written_local.copy_(shard_region(written_global, mesh, outputs[k]));
      v = written_local;
      continue;
    }
    const at::Tensor t = v.toTensor();
    if (!t.defined()) continue;
    at::Tensor part = shard_region(t, mesh, outputs[k]);
    v = part.sizes() == t.sizes() ? t : part.clone();
  }
}

}  // namespace detail
}  // namespace dtensor
