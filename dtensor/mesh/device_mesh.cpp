// dtensor/mesh/device_mesh.cpp: DeviceMesh construction (argument checks, per-dim groups),
// lookups, slicing and printing.
#include "dtensor/mesh/device_mesh.h"

#include "dtensor/comm/device.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <utility>

namespace dtensor {

namespace {
// Flattened dims registered on a root mesh (DeviceMesh::_flatten). Entries hold the flattened
// mesh's state without a parent (the root owns the registry: a parent pointer would be a cycle).
struct FlatRegistry {
  struct Entry {
    std::vector<int64_t> root_dims;
    std::shared_ptr<const DeviceMesh::State> mesh;  // nullptr on a rank outside the root mesh
  };
  std::mutex mu;
  std::map<std::string, Entry> entries;
};
}  // namespace

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
  // Root meshes only (built by the constructor): the dims flattened from this mesh.
  std::shared_ptr<FlatRegistry> flat;
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

// True on every rank when every rank passed the same fingerprint (one all_reduce).
bool same_on_every_rank(comm::Group& world, std::size_t hash) {
  // 62 bits, so that negating never overflows.
  const int64_t fp = static_cast<int64_t>(hash & ((uint64_t{1} << 62) - 1));
  at::Tensor t = at::tensor({fp, -fp}, at::kLong);
  world.all_reduce(t, comm::ReduceOp::MAX);  // {max fp, -min fp}
  return t[0].item<int64_t>() == fp && t[1].item<int64_t>() == -fp;
}

// Fails on every rank when the ranks' fingerprints differ (see the constructor's step 2).
void check_same_mesh_on_every_rank(comm::Group& world, const std::string& repr,
                                   std::size_t hash) {
  TORCH_CHECK(same_on_every_rank(world, hash), repr, " on ", world.describe(),
              ": the ranks passed different meshes to the DeviceMesh constructor; every rank "
              "must pass the same device_type, rank tensor and mesh_dim_names");
}

// Position of `rank` in a row-major rank tensor, as a coordinate; nullopt if absent.
std::optional<std::vector<int64_t>> coordinate_of(const at::Tensor& mesh, int64_t rank) {
  const int64_t* p = mesh.data_ptr<int64_t>();
  const int64_t n = mesh.numel();
  const int64_t pos = std::find(p, p + n, rank) - p;
  if (pos == n) return std::nullopt;
  std::vector<int64_t> coord(static_cast<size_t>(mesh.dim()));
  int64_t rest = pos;
  for (int64_t d = mesh.dim() - 1; d >= 0; --d) {
    coord[d] = rest % mesh.size(d);
    rest /= mesh.size(d);
  }
  return coord;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<const State> state) : state_(std::move(state)) {}

DeviceMesh::DeviceMesh(std::string device_type, const at::Tensor& mesh,
                       std::vector<std::string> mesh_dim_names, comm::GroupPtr world) {
  // Step 1: local checks. They see the same arguments on every rank, so every rank throws
  // alike before any collective (DESIGN.md D7).
  TORCH_CHECK(device_type == "cpu" || device_type == "cuda" || device_type == "meta", "DeviceMesh: device_type '",
              device_type, "' is not supported; use \"cpu\", \"cuda\" or (on a fake world) \"meta\"");
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
  // Meta tensors carry no data for a real group to send: a "meta" mesh plans on a fake world.
  TORCH_CHECK(device_type != "meta" || world->backend() == "fake", "DeviceMesh('meta'): a meta mesh's tensors have no data, "
              "so its world must be a comm::FakeGroup (NOTE: [Fake world]); this world is ", world->describe(),
              ": use \"cpu\" or \"cuda\" on it");

  auto state = std::make_shared<State>();
  State& s = *state;
  s.device_type = std::move(device_type);
  s.mesh = mesh.to(at::kCPU, at::kLong).contiguous().clone();
  s.names = std::move(mesh_dim_names);
  s.world = world;
  finish_identity(s);

  const int64_t n = s.mesh.numel();
  const int world_size = world->size();
  TORCH_CHECK(n <= world_size, s.repr, ": the mesh has ", n, " ranks, more than the world (",
              world_size, ", ", world->describe(), "); a mesh holds each rank of the world at "
              "most once: use at most ", world_size, " ranks, e.g. init_device_mesh(\"",
              s.device_type, "\", {", world_size, "})");
  const int64_t* ranks = s.mesh.data_ptr<int64_t>();
  std::vector<bool> seen(static_cast<size_t>(world_size), false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ranks[i];
    TORCH_CHECK(r >= 0 && r < world_size, s.repr, ": rank ", r,
                " is out of range for a world of size ", world_size, " (valid ranks: 0..",
                world_size - 1, ")");
    TORCH_CHECK(!seen[r], s.repr, ": rank ", r,
                " appears more than once; every world rank may appear at most once");
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
  s.coordinate = coordinate_of(s.mesh, me);
  s.flat = std::make_shared<FlatRegistry>();

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

int64_t DeviceMesh::get_local_rank() const {
  TORCH_CHECK(ndim() == 1, "get_local_rank() on ", state_->repr, ": the mesh has ", ndim(),
              " dims; pass the mesh dim (index or name) when the mesh is not 1-D");
  return get_local_rank(0);
}

int64_t DeviceMesh::get_local_rank(int64_t dim) const {
  const int64_t d = checked_dim(dim, "get_local_rank");
  TORCH_CHECK(state_->coordinate.has_value(), "get_local_rank: rank ", get_rank(),
              " is not in ", state_->repr);
  return (*state_->coordinate)[d];
}

int64_t DeviceMesh::get_local_rank(const std::string& mesh_dim_name) const {
  const auto& names = state_->names;
  if (std::find(names.begin(), names.end(), mesh_dim_name) == names.end())
    if (auto flat = find_flattened(mesh_dim_name)) return DeviceMesh(flat).get_local_rank(0);
  return get_local_rank(get_mesh_dim(mesh_dim_name));
}

comm::GroupPtr DeviceMesh::get_group() const {
  TORCH_CHECK(ndim() == 1, "get_group() on ", state_->repr, ": the mesh has ", ndim(),
              " dims; pass the mesh dim (index or name), or use get_all_groups()");
  return get_group(0);
}

comm::GroupPtr DeviceMesh::get_group(int64_t dim) const {
  const int64_t d = checked_dim(dim, "get_group");
  TORCH_CHECK(state_->dim_groups[d], "get_group: rank ", get_rank(), " is not in ",
              state_->repr, ", so it has no group along dim ", d);
  return state_->dim_groups[d];
}

comm::GroupPtr DeviceMesh::get_group(const std::string& mesh_dim_name) const {
  const auto& names = state_->names;
  if (std::find(names.begin(), names.end(), mesh_dim_name) == names.end())
    if (auto flat = find_flattened(mesh_dim_name)) return DeviceMesh(flat).get_group(0);
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

std::shared_ptr<const DeviceMesh::State> DeviceMesh::find_flattened(const std::string& name) const {
  const State* root = state_.get();
  while (root->parent) root = root->parent.get();
  if (!root->flat) return nullptr;
  std::lock_guard<std::mutex> lk(root->flat->mu);
  auto it = root->flat->entries.find(name);
  if (it == root->flat->entries.end() || !it->second.mesh) return nullptr;
  return it->second.mesh;
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& names) const {
  const State& p = *state_;
  TORCH_CHECK(!names.empty(), "slicing ", p.repr, ": no dim names given; name at least one of ",
              p.names.empty() ? std::string("its dims (it has no names)") : tuple_of_names(p.names));
  // Each name stands for one dim of this mesh, or (on a root mesh) for the dims of a
  // flattened dim registered on it.
  std::vector<std::vector<int64_t>> groups_of_dims;
  std::vector<comm::GroupPtr> flat_groups;  // per name: the flattened group, or null
  std::vector<bool> used(static_cast<size_t>(ndim()), false);
  int64_t last = -1;
  for (const auto& name : names) {
    std::vector<int64_t> dims;
    comm::GroupPtr flat_group;
    const bool own = std::find(p.names.begin(), p.names.end(), name) != p.names.end();
    std::shared_ptr<FlatRegistry> reg = p.parent ? nullptr : p.flat;
    bool found_flat = false;
    if (!own && reg) {
      std::lock_guard<std::mutex> lk(reg->mu);
      auto it = reg->entries.find(name);
      if (it != reg->entries.end()) {
        found_flat = true;
        dims = it->second.root_dims;
        if (it->second.mesh) flat_group = it->second.mesh->dim_groups[0];
      }
    }
    if (!found_flat) dims = {get_mesh_dim(name)};  // throws naming the known dims
    for (int64_t d : dims) {
      TORCH_CHECK(!used[d], "slicing ", p.repr, " by ", tuple_of_names(names), ": '", name,
                  "' is named more than once", dims.size() > 1 ? " (or overlaps another flattened dim)" : "");
      used[d] = true;
    }
    TORCH_CHECK(dims.back() > last, "slicing ", p.repr, " by ", tuple_of_names(names),
                ": names must follow the mesh's dim order ", tuple_of_names(p.names),
                " (a flattened dim sits at its last dim); pass them in that order");
    last = dims.back();
    groups_of_dims.push_back(std::move(dims));
    flat_groups.push_back(std::move(flat_group));
  }
  if (static_cast<int64_t>(names.size()) == ndim() && names == p.names) return *this;
  TORCH_CHECK(p.coordinate.has_value(), "slicing ", p.repr, ": rank ", get_rank(),
              " is not in the mesh, so it has no slice");

  auto sub = std::make_shared<State>();
  sub->device_type = p.device_type;
  sub->world = p.world;
  sub->parent = state_;
  // Fix every dim that is not kept at this rank's coordinate (last first, so indices of
  // earlier dims stay valid); the kept dims stay in mesh order.
  at::Tensor t = p.mesh;
  for (int64_t d = ndim() - 1; d >= 0; --d)
    if (!used[d]) t = t.select(d, (*p.coordinate)[d]);
  std::vector<int64_t> kept;  // mesh dims still in t, in order
  for (int64_t d = 0; d < ndim(); ++d)
    if (used[d]) kept.push_back(d);
  std::vector<int64_t> perm, sizes, coord;
  for (size_t k = 0; k < names.size(); ++k) {
    const auto& dims = groups_of_dims[k];
    int64_t size = 1, c = 0;
    for (int64_t d : dims) {
      perm.push_back(std::find(kept.begin(), kept.end(), d) - kept.begin());
      c = c * p.mesh.size(d) + (*p.coordinate)[d];
      size *= p.mesh.size(d);
    }
    sizes.push_back(size);
    coord.push_back(c);
    sub->names.push_back(names[k]);
    sub->parent_dims.push_back(dims.size() == 1 ? dims[0] : -1);
    sub->dim_groups.push_back(dims.size() == 1 ? p.dim_groups[dims[0]] : flat_groups[k]);
  }
  sub->mesh = t.permute(perm).reshape(sizes).contiguous().clone();
  sub->coordinate = std::move(coord);
  finish_identity(*sub);
  return DeviceMesh(std::move(sub));
}

DeviceMesh DeviceMesh::get_root_mesh() const {
  std::shared_ptr<const State> s = state_;
  while (s->parent) s = s->parent;
  return DeviceMesh(std::move(s));
}

DeviceMesh DeviceMesh::_unflatten(int64_t dim, const std::vector<int64_t>& mesh_sizes,
                                  const std::vector<std::string>& mesh_dim_names) const {
  const State& me = *state_;
  const int64_t d = checked_dim(dim, "_unflatten");
  std::ostringstream sizes;
  sizes << c10::IntArrayRef(mesh_sizes);
  const std::string call = "_unflatten(" + std::to_string(dim) + ", " + sizes.str() + ") on " + me.repr;
  TORCH_CHECK(!me.parent, call, ": unflatten a root mesh (one built by init_device_mesh or the constructor); this "
              "one was sliced or flattened from ", me.parent ? me.parent->repr : std::string());
  TORCH_CHECK(!me.names.empty(), call, ": the mesh has no dim names; build it with names");
  TORCH_CHECK(!mesh_sizes.empty() && mesh_dim_names.size() == mesh_sizes.size(), call, ": give one name per size (",
              mesh_dim_names.size(), " names for ", mesh_sizes.size(), " sizes)");
  int64_t product = 1;
  for (int64_t n : mesh_sizes) {
    TORCH_CHECK(n >= 1, call, ": sizes must be positive");
    product *= n;
  }
  TORCH_CHECK(product == size(d), call, ": the sizes multiply to ", product, " but dim ", d, " ('", me.names[size_t(d)],
              "') has ", size(d), " ranks");
  std::vector<std::string> names(me.names.begin(), me.names.begin() + d);
  names.insert(names.end(), mesh_dim_names.begin(), mesh_dim_names.end());
  names.insert(names.end(), me.names.begin() + d + 1, me.names.end());
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      TORCH_CHECK(names[i] != names[j], call, ": the dim name '", names[i], "' would appear twice");
  std::vector<int64_t> shape(me.mesh.sizes().begin(), me.mesh.sizes().begin() + d);
  shape.insert(shape.end(), mesh_sizes.begin(), mesh_sizes.end());
  shape.insert(shape.end(), me.mesh.sizes().begin() + d + 1, me.mesh.sizes().end());
  return DeviceMesh(me.device_type, me.mesh.reshape(shape), std::move(names), me.world);
}

DeviceMesh DeviceMesh::_flatten(const std::string& mesh_dim_name) const {
  const State& me = *state_;
  TORCH_CHECK(!me.names.empty(), "_flatten on ", me.repr,
              ": Cannot flatten a DeviceMesh without mesh_dim_names; build it with names");
  std::string name = mesh_dim_name;
  if (name.empty())
    for (size_t i = 0; i < me.names.size(); ++i) name += (i ? "_" : "") + me.names[i];
  // A 1-D mesh flattened into its own name is itself.
  if (ndim() == 1 && me.names[0] == name) return *this;
  std::shared_ptr<const State> root = state_;
  while (root->parent) root = root->parent;
  const std::string call = "_flatten('" + name + "') on " + me.repr;
  TORCH_CHECK(root->flat && !root->names.empty(), call, ": this mesh was not sliced from a named root mesh");
  std::vector<int64_t> dims;
  for (const auto& n : me.names) {
    auto it = std::find(root->names.begin(), root->names.end(), n);
    TORCH_CHECK(it != root->names.end(), call, ": '", n, "' is not a dim of the root mesh ", root->repr,
                "; only dims of the root mesh can be flattened");
    dims.push_back(it - root->names.begin());
  }
  TORCH_CHECK(std::find(root->names.begin(), root->names.end(), name) == root->names.end(), call, ": '", name,
              "' already exists as a dim of the root mesh ", root->repr,
              "; specify another mesh_dim_name for the flattened mesh");
  FlatRegistry& reg = *root->flat;
  auto with_parent = [&](const std::shared_ptr<const State>& flat) {
    TORCH_CHECK(flat, call, ": rank ", root->world->rank(), " is not in the root mesh ", root->repr,
                ", so it has no flattened mesh");
    auto copy = std::make_shared<State>(*flat);
    copy->parent = root;
    return DeviceMesh(std::move(copy));
  };
  {
    std::lock_guard<std::mutex> lk(reg.mu);
    auto it = reg.entries.find(name);
    if (it != reg.entries.end()) {
      TORCH_CHECK(it->second.root_dims == dims, call, ": a flattened mesh named '", name,
                  "' was created before from other dims of ", root->repr,
                  "; specify another mesh_dim_name");
      return with_parent(it->second.mesh);
    }
  }
  // Collective from here: agree on (root, dims, name) first, so that a mismatch throws on
  // every rank instead of hanging in the group creation below.
  std::ostringstream key;
  key << root->repr << "|" << name;
  for (int64_t d : dims) key << "," << d;
  TORCH_CHECK(same_on_every_rank(*root->world, std::hash<std::string>{}(key.str())), call, " on ",
              root->world->describe(), ": the ranks flattened different dims or names; every rank of the "
              "world must call _flatten with the same dims of the same root mesh and the same name");
  std::vector<int64_t> rest;
  for (int64_t d = 0; d < root->mesh.dim(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) rest.push_back(d);
  std::vector<int64_t> perm = rest;
  perm.insert(perm.end(), dims.begin(), dims.end());
  int64_t flat_size = 1;
  for (int64_t d : dims) flat_size *= root->mesh.size(d);
  at::Tensor rows = root->mesh.permute(perm).reshape({-1, flat_size}).contiguous();
  std::shared_ptr<State> flat;
  const int my_rank = root->world->rank();
  for (int64_t r = 0; r < rows.size(0); ++r) {
    at::Tensor row = rows[r].clone();
    const int64_t* p = row.data_ptr<int64_t>();
    comm::GroupPtr g = root->world->new_subgroup(std::vector<int>(p, p + flat_size));
    if (!g) continue;
    flat = std::make_shared<State>();
    flat->device_type = root->device_type;
    flat->mesh = row;
    flat->names = {name};
    flat->world = root->world;
    flat->dim_groups = {std::move(g)};
    flat->coordinate = coordinate_of(row, my_rank);
    finish_identity(*flat);
  }
  {
    std::lock_guard<std::mutex> lk(reg.mu);
    reg.entries[name] = FlatRegistry::Entry{dims, flat};
  }
  return with_parent(flat);
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
  TORCH_CHECK(n <= world->size(), call, ": the mesh size (", n,
              ") is larger than the world size (", world->size(), ", ", world->describe(),
              "); the product of mesh_shape must be at most the world size");
  return DeviceMesh(device_type, at::arange(n, at::kLong).reshape(mesh_shape),
                    std::move(mesh_dim_names), std::move(world));
}

}  // namespace dtensor
