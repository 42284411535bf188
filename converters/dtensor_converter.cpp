// converters/dtensor_converter.cpp: see dtensor_converter.h.
#include "converters/dtensor_converter.h"

#include "dtensor/comm/group.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <limits>
#include <sstream>
#include <utility>

namespace dtensor {
namespace testing {

namespace {

// Visits the defined tensors of `v` depth first, with the names documented at
// DTensorConverter::tensor_name. Same order as map_value.
void visit_tensors(const c10::IValue& v, const std::string& name,
                   const std::function<void(const at::Tensor&, const std::string&)>& fn) {
  if (v.isTensor()) {
    if (v.toTensor().defined()) fn(v.toTensor(), name);
  } else if (v.isList()) {
    c10::ArrayRef<c10::IValue> elems = v.toListRef();
    for (size_t i = 0; i < elems.size(); ++i) {
      visit_tensors(elems[i], name + "[" + std::to_string(i) + "]", fn);
    }
  } else if (v.isTuple()) {
    const auto& elems = v.toTupleRef().elements();
    for (size_t i = 0; i < elems.size(); ++i) {
      visit_tensors(elems[i], name + "[" + std::to_string(i) + "]", fn);
    }
  }
}

bool contains_tensor(const c10::IValue& v) {
  bool found = false;
  visit_tensors(v, "", [&](const at::Tensor&, const std::string&) { found = true; });
  return found;
}

c10::IValue map_value(const c10::IValue& v,
                      const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    return v.toTensor().defined() ? c10::IValue(fn(v.toTensor())) : v;
  }
  if (!contains_tensor(v)) return v;
  if (v.isList()) {
    // Same element type (Tensor, Tensor?, ...), so the result is still e.g. a TensorList.
    c10::List<c10::IValue> in = v.toList();
    c10::impl::GenericList out(in.elementType());
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) out.push_back(map_value(in.get(i), fn));
    return c10::IValue(std::move(out));
  }
  if (v.isTuple()) {
    std::vector<c10::IValue> out;
    for (const c10::IValue& e : v.toTupleRef().elements()) out.push_back(map_value(e, fn));
    return c10::IValue(c10::ivalue::Tuple::create(std::move(out)));
  }
  return v;
}

// Every tensor dim divides evenly by the product of the sizes of the mesh dims sharding it.
bool evenly_sharded(c10::IntArrayRef shape, const std::vector<int64_t>& mesh_shape,
                    const std::vector<Placement>& placements) {
  std::vector<int64_t> pieces(shape.size(), 1);
  for (size_t d = 0; d < placements.size(); ++d) {
    if (const auto* s = std::get_if<Shard>(&placements[d])) pieces[s->dim] *= mesh_shape[d];
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] % pieces[i] != 0) return false;
  }
  return true;
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace

namespace detail {

std::vector<at::Tensor> flatten_tensors(const std::vector<c10::IValue>& values) {
  std::vector<at::Tensor> out;
  for (const c10::IValue& v : values) {
    visit_tensors(v, "", [&](const at::Tensor& t, const std::string&) { out.push_back(t); });
  }
  return out;
}

std::vector<c10::IValue> map_tensors(const std::vector<c10::IValue>& values,
                                     const std::function<at::Tensor(const at::Tensor&)>& fn) {
  std::vector<c10::IValue> out;
  out.reserve(values.size());
  for (const c10::IValue& v : values) out.push_back(map_value(v, fn));
  return out;
}

}  // namespace detail

bool is_supported_tensor(const at::Tensor& t) {
  // As PyTorch: DTensor does not (yet) wrap these layouts and views.
  const c10::DeviceType device = t.device().type();
  return !(t.is_sparse() || t.is_sparse_csr() || t.is_mkldnn() || t.is_quantized() ||
           t.is_nested() || t.is_neg() || t.is_conj() || device == c10::DeviceType::Lazy ||
           device == c10::DeviceType::Meta || is_dtensor(t));
}

DTensorConverter::DTensorConverter(const DeviceMesh& mesh, std::vector<c10::IValue> args,
                                   Options options)
    : mesh_(mesh), args_(std::move(args)), options_(options) {
  for (size_t i = 0; i < args_.size(); ++i) {
    visit_tensors(args_[i], "arg" + std::to_string(i),
                  [&](const at::Tensor& t, const std::string& name) {
                    Slot slot;
                    slot.name = name;
                    slot.supported = is_supported_tensor(t);
                    slot.choices = gen_choices(t);
                    slots_.push_back(std::move(slot));
                  });
  }
  for (const Slot& slot : slots_) {
    const auto n = static_cast<int64_t>(slot.choices.size());
    TORCH_CHECK(num_combinations_ <= std::numeric_limits<int64_t>::max() / n,
                "DTensorConverter: too many placement combinations for ", slots_.size(),
                " tensors on ", mesh_.to_string(), "; pass fewer tensors or fewer options");
    num_combinations_ *= n;
  }
}

// NOTE: [Converter sharding choices] (dtensor_converter.h) says what this returns.
std::vector<std::vector<Placement>> DTensorConverter::gen_choices(const at::Tensor& t) const {
  const int64_t mesh_ndim = mesh_.ndim();
  const std::vector<Placement> all_replicate(mesh_ndim, Replicate{});
  if (t.scalar_type() == at::kBool || t.dim() == 0 || !is_supported_tensor(t)) {
    return {all_replicate};
  }

  // The placements allowed on a mesh dim (or the whole mesh) of `num_ranks` ranks.
  auto placements_over = [&](int64_t num_ranks) {
    std::vector<Placement> ps = {Replicate{}};
    for (int64_t i = 0; i < t.dim(); ++i) {
      const int64_t size = t.size(i);
      if (size > 1 && (options_.uneven || size % num_ranks == 0)) ps.push_back(Shard{i});
    }
    if (options_.partial) ps.push_back(Partial(comm::ReduceOp::SUM));
    return ps;
  };

  std::vector<std::vector<Placement>> out;
  if (!options_.mesh_2d || mesh_ndim == 1) {
    for (const Placement& p : placements_over(mesh_.size())) {
      out.emplace_back(mesh_ndim, p);
    }
    return out;
  }

  // Product over mesh dims, the last mesh dim varying fastest.
  out = {{}};
  for (int64_t d = 0; d < mesh_ndim; ++d) {
    std::vector<std::vector<Placement>> longer;
    for (const auto& prefix : out) {
      for (const Placement& p : placements_over(mesh_.size(d))) {
        longer.push_back(prefix);
        longer.back().push_back(p);
      }
    }
    out = std::move(longer);
  }
  if (!options_.uneven) {
    const std::vector<int64_t> mesh_shape = mesh_.shape();
    std::vector<std::vector<Placement>> even;
    for (auto& ps : out) {
      if (evenly_sharded(t.sizes(), mesh_shape, ps)) even.push_back(std::move(ps));
    }
    out = std::move(even);
  }
  return out;
}

at::Tensor DTensorConverter::to_dist_tensor(const at::Tensor& t,
                                            const std::vector<Placement>& placements) const {
  std::vector<Placement> base = placements;
  bool has_partial = false;
  for (Placement& p : base) {
    if (is_partial(p)) {
      p = Replicate{};
      has_partial = true;
    }
  }
  if (!has_partial) return distribute_tensor(t, mesh_, placements);

  // Partial(sum): the ranks at coordinate 0 of every Partial mesh dim keep the (sharded or
  // replicated) values, the others hold zeros, so the sum over those dims is `t` again.
  at::Tensor local = local_tensor(distribute_tensor(t.detach(), mesh_, base));
  const auto& coordinate = mesh_.get_coordinate();
  bool keeps_values = coordinate.has_value();
  for (size_t d = 0; keeps_values && d < placements.size(); ++d) {
    if (is_partial(placements[d]) && (*coordinate)[d] != 0) keeps_values = false;
  }
  at::Tensor mine = keeps_values ? local.clone() : at::zeros_like(local);
  at::Tensor result = from_local(mine, mesh_, placements, /*run_check=*/false, t.sizes().vec());
  if (t.requires_grad()) result.requires_grad_(true);
  return result;
}

int64_t DTensorConverter::num_visited() const {
  const int64_t cap = options_.max_combinations;
  return cap > 0 && cap < num_combinations_ ? cap : num_combinations_;
}

bool DTensorConverter::next(std::vector<c10::IValue>& converted) {
  const int64_t visited = num_visited();
  while (next_index_ < visited) {
    // k-th of `visited` evenly spaced indices (k * n / visited, exact in 128 bits).
    const int64_t k = next_index_++;
    const int64_t index = static_cast<int64_t>(static_cast<__int128>(k) * num_combinations_ / visited);
    current_index_ = index;
    const std::vector<std::vector<Placement>> placements = combination(index);
    std::string unsupported;  // names of the tensors left plain
    try {
      size_t k = 0;  // map_tensors visits the tensors in slots_ order
      converted = detail::map_tensors(args_, [&](const at::Tensor& t) {
        const size_t i = k++;
        if (!slots_[i].supported) {
          unsupported += (unsupported.empty() ? "" : ", ") + slots_[i].name;
          return t;
        }
        return to_dist_tensor(t, placements[i]);
      });
    } catch (const comm::CollectiveError&) {
      throw;
    } catch (const std::exception& e) {
      ++misses_;
      errors_.push_back(combination_string(index) + ": " + message_of(e));
      continue;
    }
    if (unsupported.empty()) {
      ++hits_;
    } else {
      ++misses_;
      errors_.push_back(combination_string(index) + ": " + unsupported +
                        " left plain (DTensor does not wrap sparse, quantized, mkldnn, "
                        "nested, lazy/meta, neg/conj tensors or DTensors)");
    }
    return true;
  }
  return false;
}

const std::string& DTensorConverter::tensor_name(int64_t i) const {
  TORCH_CHECK(i >= 0 && i < num_tensors(), "DTensorConverter::tensor_name: tensor ", i,
              " out of range; the arguments hold ", num_tensors(), " tensors");
  return slots_[i].name;
}

const std::vector<std::vector<Placement>>& DTensorConverter::choices(int64_t i) const {
  TORCH_CHECK(i >= 0 && i < num_tensors(), "DTensorConverter::choices: tensor ", i,
              " out of range; the arguments hold ", num_tensors(), " tensors");
  return slots_[i].choices;
}

std::vector<std::vector<Placement>> DTensorConverter::combination(int64_t index) const {
  TORCH_CHECK(index >= 0 && index < num_combinations_, "DTensorConverter::combination: index ",
              index, " out of range [0, ", num_combinations_, ")");
  // Mixed radix, the last tensor's digit least significant (itertools.product order).
  std::vector<std::vector<Placement>> out(slots_.size());
  for (size_t i = slots_.size(); i-- > 0;) {
    const auto n = static_cast<int64_t>(slots_[i].choices.size());
    out[i] = slots_[i].choices[index % n];
    index /= n;
  }
  return out;
}

std::string DTensorConverter::combination_string(int64_t index) const {
  const std::vector<std::vector<Placement>> placements = combination(index);
  std::ostringstream os;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (i > 0) os << ", ";
    os << slots_[i].name << "=";
    if (mesh_.ndim() == 1) {
      os << dtensor::to_string(placements[i][0]);
    } else {
      os << dtensor::to_string(placements[i]);
    }
  }
  return os.str();
}

std::string DTensorConverter::current_placements_string() const {
  return current_index_ < 0 ? std::string() : combination_string(current_index_);
}

}  // namespace testing
}  // namespace dtensor
