// dtensor/mesh/device_mesh.cpp: DeviceMesh construction (argument checks, per-dim groups),
// lookups, slicing and printing.
#include "dtensor/mesh/device_mesh.h"

#include "dtensor/comm/device.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>
#include <utility>

namespace dtensor {

struct DeviceMesh::State {
  std::string device_type;
  at::Tensor mesh;  // int64, contiguous, CPU
  std::vector<std::string> names;
  comm::GroupPtr world;
  // Group of this rank's slice along each dim; null where this rank is not in the mesh.
  std::vector<comm::GroupPtr> dim_groups;
  std::optional<std::vector<int64_t>> coordinate;
  std::shared_ptr<const State> parent;  // set for sliced meshes
  std::vector<int64_t> parent_dims;
  std::string repr;  // to_string(), also the canonical key for hashing and equality
  std::size_t hash = 0;
};

namespace {

// Nested Python-list notation of an int64 contiguous tensor: [[0, 1], [2, 3]].
void append_ranks(std::ostringstream& os, const int64_t* data, at::IntArrayRef sizes,
                  int64_t& pos) {
  if (sizes.empty()) {
    os << data[pos++];
    return;
  }
  os << "[";
  for (int64_t i = 0; i < sizes[0]; ++i) {
    if (i) os << ", ";
    append_ranks(os, data, sizes.slice(1), pos);
  }
  os << "]";
}

// Python tuple notation: ('dp', 'tp'), ('tp',).
std::string tuple_of_names(const std::vector<std::string>& names) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << "'" << names[i] << "'";
  if (names.size() == 1) os << ",";
  os << ")";
  return os.str();
}

std::string tuple_of_ints(at::IntArrayRef v) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  if (v.size() == 1) os << ",";
  os << ")";
  return os.str();
}

// DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))
std::string mesh_repr(const std::string& device_type, const at::Tensor& ranks,
                      const std::vector<std::string>& names) {
  std::ostringstream os;
  os << "DeviceMesh('" << device_type << "', ";
  int64_t pos = 0;
  append_ranks(os, ranks.data_ptr<int64_t>(), ranks.sizes(), pos);
  if (!names.empty()) os << ", mesh_dim_names=" << tuple_of_names(names);
  os << ")";
  return os.str();
}

// Fills repr and hash from the other fields.
void finish_identity(DeviceMesh::State& s) {
  s.repr = mesh_repr(s.device_type, s.mesh, s.names);
  s.hash = std::hash<std::string>{}(s.repr);
}

// Fails on every rank when the ranks' fingerprints differ (see the constructor's step 2).
void check_same_mesh_on_every_rank(comm::Group& world, const std::string& repr,
                                   std::size_t hash) {
  // 62 bits, so that negating never overflows.
  const int64_t fp = static_cast<int64_t>(hash & ((uint64_t{1} << 62) - 1));
  at::Tensor t = at::tensor({fp, -fp}, at::kLong);
  world.all_reduce(t, comm::ReduceOp::MAX);  // {max fp, -min fp}
  const bool same = t[0].item<int64_t>() == fp && t[1].item<int64_t>() == -fp;
  TORCH_CHECK(same, repr, " on ", world.describe(),
              ": the ranks passed different meshes to the DeviceMesh constructor; every rank "
              "must pass the same device_type, rank tensor and mesh_dim_names");
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<const State> state) : state_(std::move(state)) {}

DeviceMesh::DeviceMesh(std::string device_type, const at::Tensor& mesh,
                       std::vector<std::string> mesh_dim_names, comm::GroupPtr world) {
  // Step 1: local checks. They see the same arguments on every rank, so every rank throws
  // alike before any collective (DESIGN.md D7).
  TORCH_CHECK(device_type == "cpu" || device_type == "cuda", "DeviceMesh: device_type '",
              device_type, "' is not supported; use \"cpu\" or \"cuda\"");
  TORCH_CHECK(mesh.defined(), "DeviceMesh('", device_type,
              "', <undefined>): the rank tensor is undefined; pass e.g. at::arange(4)");
  TORCH_CHECK(at::isIntegralType(mesh.scalar_type(), /*includeBool=*/false), "DeviceMesh('",
              device_type, "', <", mesh.scalar_type(), " tensor of shape ", mesh.sizes(),
              ">): the rank tensor must hold integer ranks; pass an int64 tensor such as "
              "at::arange(4).view({2, 2})");
  TORCH_CHECK(mesh.dim() >= 1, "DeviceMesh('", device_type,
              "', <0-d tensor>): the rank tensor needs at least one dim; for a single rank "
              "pass a 1-D tensor such as at::tensor({0})");
  if (!world) world = comm::default_group();

  auto state = std::make_shared<State>();
  State& s = *state;
  s.device_type = std::move(device_type);
  s.mesh = mesh.to(at::kCPU, at::kLong).contiguous().clone();
  s.names = std::move(mesh_dim_names);
  s.world = world;
  finish_identity(s);

  const int64_t n = s.mesh.numel();
  const int world_size = world->size();
  TORCH_CHECK(n == world_size, s.repr, ": the mesh size (", n, ") does not match the world size (",
              world_size, ", ", world->describe(), "); a mesh must hold every rank of the "
              "world exactly once: use ", world_size, " ranks, e.g. init_device_mesh(\"",
              s.device_type, "\", {", world_size, "})");
  const int64_t* ranks = s.mesh.data_ptr<int64_t>();
  std::vector<bool> seen(static_cast<size_t>(world_size), false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ranks[i];
    TORCH_CHECK(r >= 0 && r < world_size, s.repr, ": rank ", r,
                " is out of range for a world of size ", world_size, " (valid ranks: 0..",
                world_size - 1, ")");
    TORCH_CHECK(!seen[r], s.repr, ": rank ", r,
                " appears more than once; every world rank must appear exactly once");
    seen[r] = true;
  }
  if (!s.names.empty()) {
    TORCH_CHECK(static_cast<int64_t>(s.names.size()) == s.mesh.dim(), s.repr, ": got ",
                s.names.size(), " mesh_dim_names ", tuple_of_names(s.names), " for a ",
                s.mesh.dim(), "-D mesh; pass one name per mesh dim, or none");
    std::set<std::string> unique;
    for (const auto& name : s.names)
      TORCH_CHECK(unique.insert(name).second, s.repr, ": mesh_dim_names has '", name,
                  "' more than once; names must be unique");
  }

  // Step 2: agree that every rank passed the same mesh.
  check_same_mesh_on_every_rank(*world, s.repr, s.hash);

  // This rank's coordinate: unravel its position in the row-major rank array.
  const int me = world->rank();
  const int64_t pos = std::find(ranks, ranks + n, me) - ranks;
  if (pos < n) {
    std::vector<int64_t> coord(static_cast<size_t>(s.mesh.dim()));
    int64_t rest = pos;
    for (int64_t d = s.mesh.dim() - 1; d >= 0; --d) {
      coord[d] = rest % s.mesh.size(d);
      rest /= s.mesh.size(d);
    }
    s.coordinate = std::move(coord);
  }

  // Step 3: one group per 1-D slice of every dim, created in the same order on every rank.
  s.dim_groups.resize(static_cast<size_t>(s.mesh.dim()));
  for (int64_t d = 0; d < s.mesh.dim(); ++d) {
    at::Tensor slices = s.mesh.swapdims(d, -1).reshape({-1, s.mesh.size(d)}).contiguous();
    const int64_t* p = slices.data_ptr<int64_t>();
    for (int64_t row = 0; row < slices.size(0); ++row) {
      std::vector<int> slice(p + row * slices.size(1), p + (row + 1) * slices.size(1));
      comm::GroupPtr g = world->new_subgroup(slice);
      if (g) {
        TORCH_INTERNAL_ASSERT(!s.dim_groups[d], s.repr, ": rank ", me,
                              " is in two slices of dim ", d);
        s.dim_groups[d] = std::move(g);
      }
    }
    TORCH_INTERNAL_ASSERT(static_cast<bool>(s.dim_groups[d]) == s.coordinate.has_value(),
                          s.repr, ": no group of dim ", d, " for rank ", me);
  }
  state_ = std::move(state);
}

const std::string& DeviceMesh::device_type() const { return state_->device_type; }
c10::Device DeviceMesh::device() const { return comm::rank_device(state_->device_type, state_->repr); }
const at::Tensor& DeviceMesh::mesh() const { return state_->mesh; }
int64_t DeviceMesh::ndim() const { return state_->mesh.dim(); }
int64_t DeviceMesh::size() const { return state_->mesh.numel(); }
int64_t DeviceMesh::size(int64_t dim) const { return state_->mesh.size(checked_dim(dim, "size")); }
std::vector<int64_t> DeviceMesh::shape() const { return state_->mesh.sizes().vec(); }
const std::vector<std::string>& DeviceMesh::mesh_dim_names() const { return state_->names; }
const std::optional<std::vector<int64_t>>& DeviceMesh::get_coordinate() const {
  return state_->coordinate;
}
int DeviceMesh::get_rank() const { return state_->world->rank(); }
const comm::GroupPtr& DeviceMesh::world() const { return state_->world; }
std::string DeviceMesh::to_string() const { return state_->repr; }
std::size_t DeviceMesh::hash() const { return state_->hash; }

int64_t DeviceMesh::checked_dim(int64_t dim, const char* op) const {
  const int64_t n = ndim();
  TORCH_CHECK(dim >= -n && dim < n, op, "(", dim, ") on ", state_->repr, ": dim ", dim,
              " is out of range for a ", n, "-D mesh (valid: 0..", n - 1, ", or -", n, "..-1)");
  return dim < 0 ? dim + n : dim;
}

int64_t DeviceMesh::get_mesh_dim(const std::string& mesh_dim_name) const {
  const auto& names = state_->names;
  TORCH_CHECK(!names.empty(), state_->repr, " has no dim names, so it has no dim '",
              mesh_dim_name, "'; build it with mesh_dim_names to look dims up by name, or "
              "use dim indices");
  auto it = std::find(names.begin(), names.end(), mesh_dim_name);
  TORCH_CHECK(it != names.end(), state_->repr, " has no dim named '", mesh_dim_name,
              "'; its dims are ", tuple_of_names(names));
  return it - names.begin();
}

int64_t DeviceMesh::get_local_rank(int64_t dim) const {
  const int64_t d = checked_dim(dim, "get_local_rank");
  TORCH_CHECK(state_->coordinate.has_value(), "get_local_rank: rank ", get_rank(),
              " is not in ", state_->repr);
  return (*state_->coordinate)[d];
}

int64_t DeviceMesh::get_local_rank(const std::string& mesh_dim_name) const {
  return get_local_rank(get_mesh_dim(mesh_dim_name));
}

comm::GroupPtr DeviceMesh::get_group(int64_t dim) const {
  const int64_t d = checked_dim(dim, "get_group");
  TORCH_CHECK(state_->dim_groups[d], "get_group: rank ", get_rank(), " is not in ",
              state_->repr, ", so it has no group along dim ", d);
  return state_->dim_groups[d];
}

comm::GroupPtr DeviceMesh::get_group(const std::string& mesh_dim_name) const {
  return get_group(get_mesh_dim(mesh_dim_name));
}

std::vector<comm::GroupPtr> DeviceMesh::get_all_groups() const { return state_->dim_groups; }

DeviceMesh DeviceMesh::operator[](const std::string& mesh_dim_name) const {
  return slice({mesh_dim_name});
}
DeviceMesh DeviceMesh::operator[](std::initializer_list<std::string> mesh_dim_names) const {
  return slice(std::vector<std::string>(mesh_dim_names));
}
DeviceMesh DeviceMesh::operator[](const std::vector<std::string>& mesh_dim_names) const {
  return slice(mesh_dim_names);
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  const State& p = *state_;
  TORCH_CHECK(!names.empty(), "slicing ", p.repr, ": no dim names given; name at least one of ",
              p.names.empty() ? std::string("its dims (it has no names)") : tuple_of_names(p.names));
  std::vector<int64_t> dims;
  for (const auto& name : names) {
    const int64_t d = get_mesh_dim(name);
    TORCH_CHECK(std::find(dims.begin(), dims.end(), d) == dims.end(), "slicing ", p.repr,
                " by ", tuple_of_names(names), ": '", name, "' is named more than once");
    TORCH_CHECK(dims.empty() || d > dims.back(), "slicing ", p.repr, " by ",
                tuple_of_names(names), ": names must follow the mesh's dim order ",
                tuple_of_names(p.names), "; pass them in that order");
    dims.push_back(d);
  }
  if (static_cast<int64_t>(dims.size()) == ndim()) return *this;
  TORCH_CHECK(p.coordinate.has_value(), "slicing ", p.repr, ": rank ", get_rank(),
              " is not in the mesh, so it has no slice");

  auto sub = std::make_shared<State>();
  sub->device_type = p.device_type;
  sub->world = p.world;
  sub->parent = state_;
  sub->parent_dims = dims;
  // Fix every dim that is not kept at this rank's coordinate (last first, so indices of
  // earlier dims stay valid).
  at::Tensor t = p.mesh;
  for (int64_t d = ndim() - 1; d >= 0; --d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) t = t.select(d, (*p.coordinate)[d]);
  sub->mesh = t.contiguous().clone();
  std::vector<int64_t> coord;
  for (int64_t d : dims) {
    sub->names.push_back(p.names[d]);
    sub->dim_groups.push_back(p.dim_groups[d]);
    coord.push_back((*p.coordinate)[d]);
  }
  sub->coordinate = std::move(coord);
  finish_identity(*sub);
  return DeviceMesh(std::move(sub));
}

std::optional<DeviceMesh> DeviceMesh::get_parent_mesh() const {
  if (!state_->parent) return std::nullopt;
  return DeviceMesh(state_->parent);
}

const std::vector<int64_t>& DeviceMesh::get_parent_mesh_dims() const {
  return state_->parent_dims;
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  if (state_ == other.state_) return true;
  // repr holds exactly the compared fields: device type, ranks (with shape), names.
  return state_->hash == other.state_->hash && state_->repr == other.state_->repr;
}

std::ostream& operator<<(std::ostream& os, const DeviceMesh& mesh) {
  return os << mesh.to_string();
}

DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int64_t> mesh_shape,
                            std::vector<std::string> mesh_dim_names, comm::GroupPtr world) {
  if (!world) world = comm::default_group();
  const std::string call =
      "init_device_mesh('" + device_type + "', mesh_shape=" + tuple_of_ints(mesh_shape) + ")";
  TORCH_CHECK(!mesh_shape.empty(), call, ": mesh_shape is empty; pass at least one dim, e.g. {",
              world->size(), "}");
  for (int64_t s : mesh_shape)
    TORCH_CHECK(s > 0, call, ": every dim of mesh_shape needs at least one rank");
  const int64_t n = std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1},
                                    std::multiplies<int64_t>());
  TORCH_CHECK(n == world->size(), call, ": the mesh size (", n,
              ") does not match the world size (", world->size(), ", ", world->describe(),
              "); the product of mesh_shape must equal the world size");
  return DeviceMesh(device_type, at::arange(n, at::kLong).reshape(mesh_shape),
                    std::move(mesh_dim_names), std::move(world));
}

}  // namespace dtensor
