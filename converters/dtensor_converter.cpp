// converters/dtensor_converter.cpp: see dtensor_converter.h.
#include "converters/dtensor_converter.h"

#include "dtensor/comm/group.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
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
  make_plan();
}

// NOTE: [Converter covering design]
void DTensorConverter::make_plan() {
  const int64_t cap = options_.max_combinations;
  if (cap <= 0 || num_combinations_ <= cap) {
    plan_.resize(static_cast<size_t>(num_combinations_));
    for (int64_t i = 0; i < num_combinations_; ++i) plan_[static_cast<size_t>(i)] = i;
    design_ = "full product";
    return;
  }
  const size_t n = slots_.size();
  std::vector<int64_t> radix(n);
  for (size_t i = 0; i < n; ++i) radix[i] = static_cast<int64_t>(slots_[i].choices.size());
  auto index_of = [&](const std::vector<int64_t>& row) {
    int64_t index = 0;
    for (size_t i = 0; i < n; ++i) index = index * radix[i] + row[i];
    return index;
  };
  // covered[i][j][a * radix[j] + b]: slots i < j seen with choices a, b.
  std::vector<std::vector<std::vector<char>>> covered(n);
  int64_t uncovered = 0;
  for (size_t i = 0; i < n; ++i) {
    covered[i].resize(n);
    for (size_t j = i + 1; j < n; ++j) {
      covered[i][j].assign(static_cast<size_t>(radix[i] * radix[j]), 0);
      uncovered += radix[i] * radix[j];
    }
  }
  std::vector<int64_t> in_plan;  // sorted copy for membership
  auto add_row = [&](const std::vector<int64_t>& row) {
    const int64_t index = index_of(row);
    if (std::binary_search(in_plan.begin(), in_plan.end(), index)) return false;
    in_plan.insert(std::upper_bound(in_plan.begin(), in_plan.end(), index), index);
    plan_.push_back(index);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        char& c = covered[i][j][static_cast<size_t>(row[i] * radix[j] + row[j])];
        if (!c) {
          c = 1;
          --uncovered;
        }
      }
    return true;
  };
  add_row(std::vector<int64_t>(n, 0));  // all Replicate first
  // A single tensor: every choice (the "pairs" are its choices).
  if (!options_.cover_pairs) uncovered = 0;
  if (n == 1 && options_.cover_pairs)
    for (int64_t a = 1; a < radix[0]; ++a) add_row({a});
  // Greedy: start each row from the first uncovered pair, then give every other slot the
  // choice that covers the most new pairs with the slots already set (ties: lowest choice).
  while (uncovered > 0) {
    size_t pi = 0, pj = 0;
    int64_t pa = 0, pb = 0;
    bool found = false;
    for (size_t i = 0; i < n && !found; ++i)
      for (size_t j = i + 1; j < n && !found; ++j)
        for (int64_t k = 0; k < radix[i] * radix[j] && !found; ++k)
          if (!covered[i][j][static_cast<size_t>(k)]) {
            pi = i, pj = j, pa = k / radix[j], pb = k % radix[j];
            found = true;
          }
    std::vector<int64_t> row(n, -1);
    row[pi] = pa;
    row[pj] = pb;
    for (size_t s = 0; s < n; ++s) {
      if (row[s] >= 0) continue;
      int64_t best = 0, best_gain = -1;
      for (int64_t v = 0; v < radix[s]; ++v) {
        int64_t gain = 0;
        for (size_t o = 0; o < n; ++o) {
          if (o == s || row[o] < 0) continue;
          const size_t i = std::min(o, s), j = std::max(o, s);
          const int64_t a = i == s ? v : row[o], b = j == s ? v : row[o];
          if (!covered[i][j][static_cast<size_t>(a * radix[j] + b)]) ++gain;
        }
        if (gain > best_gain) best = v, best_gain = gain;
      }
      row[s] = best;
    }
    add_row(row);  // covers (pi, pa, pj, pb), so the loop ends
  }
  const size_t covering = plan_.size();
  // Seeded random extras up to the cap (splitmix64: the same on every platform).
  uint64_t state = options_.seed;
  auto next_random = [&state]() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  for (int64_t tries = 0; static_cast<int64_t>(plan_.size()) < cap && tries < 16 * cap; ++tries) {
    std::vector<int64_t> row(n);
    for (size_t i = 0; i < n; ++i) row[i] = static_cast<int64_t>(next_random() % static_cast<uint64_t>(radix[i]));
    add_row(row);
  }
  design_ = std::string(options_.cover_pairs ? "pairwise covering (" : "no covering (") + std::to_string(covering) + ") + " +
            std::to_string(plan_.size() - covering) + " seeded random of " + std::to_string(num_combinations_);
}

// NOTE: [Converter sharding choices] (dtensor_converter.h) says what this returns.
std::vector<std::vector<Placement>> DTensorConverter::gen_choices(const at::Tensor& t) const {
  const int64_t mesh_ndim = mesh_.ndim();
  const std::vector<Placement> all_replicate(mesh_ndim, Replicate{});
  if (t.dim() == 0 || !is_supported_tensor(t)) return {all_replicate};
  const bool partial = options_.partial && t.scalar_type() != at::kBool;

  // The placements allowed on a mesh dim (or the whole mesh) of `num_ranks` ranks.
  auto placements_over = [&](int64_t num_ranks) {
    std::vector<Placement> ps = {Replicate{}};
    for (int64_t i = 0; i < t.dim(); ++i) {
      const int64_t size = t.size(i);
      if (size > 1 && (options_.uneven || size % num_ranks == 0)) ps.push_back(Shard{i});
    }
    if (partial) ps.push_back(Partial(comm::ReduceOp::SUM));
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
  at::Tensor result = from_local(mine, mesh_, placements, FromLocalOptions::contiguous(t.sizes().vec()));
  if (t.requires_grad()) result.requires_grad_(true);
  return result;
}

bool DTensorConverter::next(std::vector<c10::IValue>& converted) {
  while (next_index_ < num_visited()) {
    const int64_t index = plan_[static_cast<size_t>(next_index_++)];
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
