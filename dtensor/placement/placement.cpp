// dtensor/placement/placement.cpp: placements, DTensorSpec, and local shape / offset math.
#include "dtensor/placement/placement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/hash.h>

#include <algorithm>
#include <sstream>

namespace dtensor {

namespace {

// Python list notation: [8, 4].
std::string list_of_ints(c10::IntArrayRef v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::size_t combine(std::size_t seed, std::size_t h) { return c10::hash_combine(seed, h); }

}  // namespace

// ---- Placements ------------------------------------------------------------------------

Partial::Partial(comm::ReduceOp op) : reduce_op(op) {
  TORCH_CHECK(op != comm::ReduceOp::PRODUCT,
              "Partial(product) is not supported: a product partial cannot be redistributed; "
              "use Partial(sum), Partial(avg), Partial(min) or Partial(max)");
}

Shard StridedShard(int64_t dim, int64_t split_factor) {
  TORCH_CHECK(split_factor >= 1, "_StridedShard(dim=", dim, ", split_factor=", split_factor,
              "): split_factor must be at least 1 (1 is a plain Shard(dim=", dim, "))");
  return Shard{dim, split_factor};
}

bool is_shard(const Placement& p) { return std::holds_alternative<Shard>(p); }
bool is_shard(const Placement& p, int64_t dim) {
  const Shard* s = std::get_if<Shard>(&p);
  return s != nullptr && s->dim == dim;
}
bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }
bool is_strided_shard(const Placement& p) {
  const Shard* s = std::get_if<Shard>(&p);
  return s != nullptr && s->split_factor > 1;
}

std::string to_string(const Shard& p) {
  if (p.split_factor != 1)
    return "_StridedShard(dim=" + std::to_string(p.dim) + ", sf=" + std::to_string(p.split_factor) + ")";
  return "Shard(dim=" + std::to_string(p.dim) + ")";
}
std::string to_string(const Replicate&) { return "Replicate()"; }
std::string to_string(const Partial& p) { return "Partial(" + comm::to_string(p.reduce_op) + ")"; }
std::string to_string(const Placement& p) {
  return std::visit([](const auto& alt) { return to_string(alt); }, p);
}
std::string to_string(const std::vector<Placement>& placements) {
  std::string s = "(";
  for (size_t i = 0; i < placements.size(); ++i) s += (i ? ", " : "") + to_string(placements[i]);
  if (placements.size() == 1) s += ",";
  return s + ")";
}

std::ostream& operator<<(std::ostream& os, const Shard& p) { return os << to_string(p); }
std::ostream& operator<<(std::ostream& os, const Replicate& p) { return os << to_string(p); }
std::ostream& operator<<(std::ostream& os, const Partial& p) { return os << to_string(p); }
std::ostream& operator<<(std::ostream& os, const Placement& p) { return os << to_string(p); }

std::size_t hash_value(const Placement& p) {
  std::size_t h = std::hash<std::size_t>{}(p.index());
  if (const Shard* s = std::get_if<Shard>(&p)) {
    h = combine(h, std::hash<int64_t>{}(s->dim));
    if (s->split_factor != 1) h = combine(h, std::hash<int64_t>{}(s->split_factor));
  }
  if (const Partial* s = std::get_if<Partial>(&p))
    h = combine(h, std::hash<int>{}(static_cast<int>(s->reduce_op)));
  return h;
}

int64_t normalize_shard_dim(int64_t dim, int64_t ndim) {
  TORCH_CHECK(dim >= -ndim && dim < ndim, "Shard(dim=", dim,
              ") is out of range for a tensor with ndim=", ndim,
              ndim > 0 ? " (valid dims: " + std::to_string(-ndim) + ".." + std::to_string(ndim - 1) + ")"
                       : std::string(" (a 0-d tensor cannot be sharded; use Replicate())"));
  return dim < 0 ? dim + ndim : dim;
}

std::vector<Placement> normalize_placements(const std::vector<Placement>& placements,
                                            int64_t tensor_ndim) {
  std::vector<Placement> out = placements;
  for (Placement& p : out)
    if (Shard* s = std::get_if<Shard>(&p)) s->dim = normalize_shard_dim(s->dim, tensor_ndim);
  return out;
}

std::vector<std::vector<int64_t>> shard_order(c10::IntArrayRef mesh_shape,
                                              const std::vector<Placement>& placements,
                                              int64_t tensor_ndim) {
  TORCH_CHECK(placements.size() == mesh_shape.size(), "shard_order: ", placements.size(),
              " placements ", to_string(placements), " for a ", mesh_shape.size(),
              "-D mesh; pass one per mesh dim");
  // NOTE: [Strided shards]: PyTorch's _explicit_order_placements. A strided mesh dim waits
  // until the next plain Shard of its tensor dim; that Shard splits first, then the waiting
  // strided mesh dims, the last one first, each split_factor being the product of the sizes
  // of the mesh dims that split before it in this group.
  const auto n = static_cast<size_t>(tensor_ndim);
  std::vector<std::vector<int64_t>> order(n), deferred(n);
  std::vector<bool> ended(n, false);
  auto where = [&](size_t i) {
    return to_string(placements[i]) + " at mesh dim " + std::to_string(i) + " of placements " +
           to_string(placements) + " on a mesh of shape " + list_of_ints(mesh_shape);
  };
  for (size_t i = 0; i < placements.size(); ++i) {
    const Shard* s = std::get_if<Shard>(&placements[i]);
    if (!s) continue;
    const auto d = static_cast<size_t>(normalize_shard_dim(s->dim, tensor_ndim));
    if (s->split_factor > 1) {
      deferred[d].push_back(static_cast<int64_t>(i));
      continue;
    }
    TORCH_CHECK(!ended[d], "Strided sharding does not allow Shard() to appear after the strided part has ended: ",
                where(i), " (use Replicate() there, or shard another dim)");
    order[d].push_back(static_cast<int64_t>(i));
    if (deferred[d].empty()) continue;
    ended[d] = true;
    int64_t aggregate = mesh_shape[i];
    while (!deferred[d].empty()) {
      const int64_t j = deferred[d].back();
      deferred[d].pop_back();
      const int64_t sf = std::get<Shard>(placements[static_cast<size_t>(j)]).split_factor;
      TORCH_CHECK(sf == aggregate, "Can only convert _StridedShard to ordered Shard if split_factor(", sf,
                  ") == aggregate mesh size (", aggregate, "): ", where(static_cast<size_t>(j)),
                  "; the split_factor must be the product of the sizes of the later mesh dims that split dim ", d,
                  " before it");
      aggregate *= mesh_shape[static_cast<size_t>(j)];
      order[d].push_back(j);
    }
  }
  for (size_t d = 0; d < n; ++d)
    TORCH_CHECK(deferred[d].empty(), where(static_cast<size_t>(deferred[d].front())),
                ": a _StridedShard needs a later Shard(dim=", d,
                ") mesh dim to split dim ", d, " before it; not supported (PyTorch leaves it out of "
                "compute_local_shape_and_global_offset); use Shard(dim=", d, ")");
  return order;
}

// ---- Specs -----------------------------------------------------------------------------

bool operator==(const TensorMeta& a, const TensorMeta& b) {
  return a.shape == b.shape && a.stride == b.stride && a.dtype == b.dtype && a.storage_offset == b.storage_offset;
}

DTensorSpec::DTensorSpec(DeviceMesh mesh_, std::vector<Placement> placements_,
                         TensorMeta tensor_meta_)
    : mesh(std::move(mesh_)), placements(std::move(placements_)),
      tensor_meta(std::move(tensor_meta_)) {
  TORCH_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "DTensorSpec: ",
              placements.size(), " placements ", dtensor::to_string(placements), " for ", mesh,
              " with ", mesh.ndim(), " dims; pass one placement per mesh dim");
  try {
    placements = normalize_placements(placements, ndim());
    if (std::any_of(placements.begin(), placements.end(), [](const Placement& p) { return is_strided_shard(p); }))
      shard_order(mesh.shape(), placements, ndim());
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "DTensorSpec(mesh=", mesh, ", placements=", dtensor::to_string(placements),
                ", shape=", list_of_ints(tensor_meta.shape), "): ", e.what_without_backtrace());
  }
}

int64_t DTensorSpec::ndim() const { return static_cast<int64_t>(tensor_meta.shape.size()); }

int64_t DTensorSpec::num_shards() const {
  int64_t n = 1;
  for (size_t i = 0; i < placements.size(); ++i)
    if (is_shard(placements[i])) n *= mesh.size(static_cast<int64_t>(i));
  return n;
}

std::vector<std::vector<int64_t>> DTensorSpec::dim_map() const {
  return shard_order(mesh.shape(), placements, ndim());
}

bool DTensorSpec::is_replicated() const {
  return std::all_of(placements.begin(), placements.end(),
                     [](const Placement& p) { return is_replicate(p); });
}

bool DTensorSpec::has_partial() const {
  return std::any_of(placements.begin(), placements.end(),
                     [](const Placement& p) { return is_partial(p); });
}

std::string DTensorSpec::to_string() const {
  return "DTensorSpec(mesh=" + mesh.to_string() + ", placements=" +
         dtensor::to_string(placements) + ", shape=" + list_of_ints(tensor_meta.shape) + ")";
}

bool DTensorSpec::operator==(const DTensorSpec& other) const {
  return mesh == other.mesh && placements == other.placements &&
         tensor_meta == other.tensor_meta;
}

std::ostream& operator<<(std::ostream& os, const DTensorSpec& spec) {
  return os << spec.to_string();
}

std::size_t hash_value(const DTensorSpec& spec) {
  std::size_t h = hash_value(spec.mesh);
  for (const Placement& p : spec.placements) h = combine(h, hash_value(p));
  // Separate the lists so that moving a value from shape to stride changes the hash.
  h = combine(h, spec.tensor_meta.shape.size());
  for (int64_t v : spec.tensor_meta.shape) h = combine(h, std::hash<int64_t>{}(v));
  h = combine(h, spec.tensor_meta.stride.size());
  for (int64_t v : spec.tensor_meta.stride) h = combine(h, std::hash<int64_t>{}(v));
  h = combine(h, std::hash<int64_t>{}(spec.tensor_meta.storage_offset));
  return combine(h, std::hash<int>{}(static_cast<int>(spec.tensor_meta.dtype)));
}

// ---- Shard math ------------------------------------------------------------------------

std::pair<int64_t, int64_t> shard_size_and_offset(int64_t dim_size, int64_t num_chunks,
                                                  int64_t index) {
  TORCH_CHECK(dim_size >= 0, "shard_size_and_offset: dim_size=", dim_size, " is negative");
  TORCH_CHECK(num_chunks > 0, "shard_size_and_offset: num_chunks=", num_chunks,
              " must be at least 1");
  TORCH_CHECK(index >= 0 && index < num_chunks, "shard_size_and_offset: index=", index,
              " is out of range for ", num_chunks, " chunks (valid: 0..", num_chunks - 1, ")");
  // NOTE: [Uneven shards]
  const int64_t chunk = (dim_size + num_chunks - 1) / num_chunks;
  const int64_t begin = std::min(index * chunk, dim_size);
  const int64_t end = std::min(begin + chunk, dim_size);
  return {end - begin, begin};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> compute_local_shape_and_global_offset(
    c10::IntArrayRef global_shape, c10::IntArrayRef mesh_shape,
    const std::vector<Placement>& placements,
    const std::optional<std::vector<int64_t>>& coordinate) {
  const int64_t ndim = static_cast<int64_t>(global_shape.size());
  // Built only for an error message (TORCH_CHECK evaluates its message on failure only): this
  // runs for every DTensor a checkpoint saves or loads.
  auto where = [&] {
    return "compute_local_shape_and_global_offset(shape=" + list_of_ints(global_shape) + ", mesh shape " +
           list_of_ints(mesh_shape) + ", placements=" + to_string(placements) + ")";
  };
  TORCH_CHECK(placements.size() == mesh_shape.size(), where(), ": ", placements.size(),
              " placements for a ", mesh_shape.size(), "-D mesh; pass one per mesh dim");
  std::vector<int64_t> shape = global_shape.vec();
  std::vector<int64_t> offset(static_cast<size_t>(ndim), 0);
  if (!coordinate) return {std::vector<int64_t>(static_cast<size_t>(ndim), 0), offset};
  TORCH_CHECK(coordinate->size() == mesh_shape.size(), where(), ": coordinate ",
              list_of_ints(*coordinate), " has ", coordinate->size(), " entries; pass one per mesh dim");
  for (size_t i = 0; i < placements.size(); ++i)
    TORCH_CHECK((*coordinate)[i] >= 0 && (*coordinate)[i] < mesh_shape[i], where(),
                ": coordinate ", list_of_ints(*coordinate), " is outside the mesh");
  std::vector<std::vector<int64_t>> order;
  try {
    order = shard_order(mesh_shape, placements, ndim);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, where(), ": ", e.what_without_backtrace());
  }
  // NOTE: [Uneven shards]: mesh dims apply in order (NOTE: [Strided shards]), each
  // splitting what the previous left.
  for (size_t d = 0; d < order.size(); ++d) {
    for (int64_t i : order[d]) {
      auto [size, off] = shard_size_and_offset(shape[d], mesh_shape[i], (*coordinate)[i]);
      shape[d] = size;
      offset[d] += off;
    }
  }
  return {shape, offset};
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> compute_local_shape_and_global_offset(
    c10::IntArrayRef global_shape, const DeviceMesh& mesh,
    const std::vector<Placement>& placements) {
  return compute_local_shape_and_global_offset(global_shape, mesh.shape(), placements,
                                               mesh.get_coordinate());
}

std::vector<int64_t> compute_local_shape(c10::IntArrayRef global_shape,
                                         c10::IntArrayRef mesh_shape,
                                         const std::vector<Placement>& placements,
                                         const std::optional<std::vector<int64_t>>& coordinate) {
  return compute_local_shape_and_global_offset(global_shape, mesh_shape, placements, coordinate)
      .first;
}

std::vector<int64_t> compute_local_shape(c10::IntArrayRef global_shape, const DeviceMesh& mesh,
                                         const std::vector<Placement>& placements) {
  return compute_local_shape_and_global_offset(global_shape, mesh, placements).first;
}

}  // namespace dtensor
