// dtensor/sharded/metadata.cpp
#include "dtensor/sharded/metadata.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <sstream>

namespace dtensor {
namespace sharded {

namespace {

bool is_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// A string c10::Device accepts ("cpu", "cuda:1", ...).
std::optional<c10::Device> parse_device(const std::string& s) {
  try {
    return c10::Device(s);
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

std::string list(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << c10::IntArrayRef(v);
  return os.str();
}

}  // namespace

// ---- RemoteDevice ------------------------------------------------------------------------------

RemoteDevice::RemoteDevice(const std::string& remote_device) {
  const std::string parse_error = "Could not parse remote_device: " + remote_device +
                                  ". The valid format is '<workername>/<device>' or 'rank:<rank>/<device>' or "
                                  "'<device>'";
  const auto slash = remote_device.find('/');
  std::string worker, device;
  if (slash == std::string::npos) {
    // "<device>", else a worker name on the CPU.
    if (auto d = parse_device(remote_device)) {
      device_ = *d;
      return;
    }
    worker = remote_device;
    device = "cpu";
  } else {
    TORCH_CHECK(remote_device.find('/', slash + 1) == std::string::npos, parse_error);
    worker = remote_device.substr(0, slash);
    device = remote_device.substr(slash + 1);
  }
  TORCH_CHECK(!worker.empty(), parse_error);
  auto d = parse_device(device);
  TORCH_CHECK(d.has_value(), parse_error, " ('", device, "' is not a device)");
  device_ = *d;
  const auto colon = worker.find(':');
  if (colon == std::string::npos) {
    worker_name_ = worker;
    return;
  }
  const std::string head = worker.substr(0, colon), tail = worker.substr(colon + 1);
  TORCH_CHECK(head == "rank" && is_digits(tail), parse_error);
  rank_ = std::stoi(tail);
}

std::string RemoteDevice::to_string() const {
  if (worker_name_) return *worker_name_ + "/" + device_.str();
  if (rank_) return "rank:" + std::to_string(*rank_) + "/" + device_.str();
  return device_.str();
}

std::ostream& operator<<(std::ostream& os, const RemoteDevice& d) { return os << d.to_string(); }

// ---- ShardMetadata ---------------------------------------------------------------------------

ShardMetadata::ShardMetadata(std::vector<int64_t> shard_offsets, std::vector<int64_t> shard_sizes,
                             std::optional<RemoteDevice> placement)
    : shard_offsets_(std::move(shard_offsets)), shard_sizes_(std::move(shard_sizes)), placement_(std::move(placement)) {
  TORCH_CHECK(shard_offsets_.size() == shard_sizes_.size(),
              "shard_offsets and shard_sizes should have the same number of elements, found ", shard_offsets_.size(),
              " and ", shard_sizes_.size(), " respectively");
  for (size_t i = 0; i < shard_offsets_.size(); ++i) {
    TORCH_CHECK(shard_offsets_[i] >= 0, "shard_offsets should be >=0, got ", list(shard_offsets_));
    TORCH_CHECK(shard_sizes_[i] >= 0, "shard_sizes should be >= 0, got ", list(shard_sizes_));
  }
}

int64_t ShardMetadata::numel() const {
  int64_t n = 1;
  for (int64_t s : shard_sizes_) n *= s;
  return n;
}

std::string ShardMetadata::to_string() const {
  return "ShardMetadata(shard_offsets=" + list(shard_offsets_) + ", shard_sizes=" + list(shard_sizes_) +
         ", placement=" + (placement_ ? placement_->to_string() : std::string("None")) + ")";
}

std::ostream& operator<<(std::ostream& os, const ShardMetadata& m) { return os << m.to_string(); }

// ---- TensorProperties --------------------------------------------------------------------------

TensorProperties TensorProperties::create_from_tensor(const at::Tensor& tensor) {
  TensorProperties p;
  p.dtype = tensor.scalar_type();
  p.layout = tensor.layout();
  p.requires_grad = tensor.requires_grad();
  p.memory_format = c10::MemoryFormat::Contiguous;
  p.pin_memory = tensor.is_pinned();
  return p;
}

bool TensorProperties::operator==(const TensorProperties& o) const {
  return dtype == o.dtype && layout == o.layout && requires_grad == o.requires_grad &&
         memory_format == o.memory_format && pin_memory == o.pin_memory;
}

// ---- validation --------------------------------------------------------------------------------

namespace {
// PyTorch: _check_shard_metadata_pair_overlap.
bool overlap(const ShardMetadata& a, const ShardMetadata& b) {
  for (size_t i = 0; i < a.shard_offsets().size(); ++i) {
    if (a.shard_offsets()[i] >= b.shard_offsets()[i] + b.shard_sizes()[i]) return false;
    if (b.shard_offsets()[i] >= a.shard_offsets()[i] + a.shard_sizes()[i]) return false;
  }
  return true;
}
}  // namespace

void validate_non_overlapping_shards_metadata(const std::vector<ShardMetadata>& shards) {
  if (shards.size() <= 1) return;
  const size_t ndim = shards[0].shard_offsets().size();
  for (const auto& s : shards)
    TORCH_CHECK(s.shard_offsets().size() == ndim, "Shards ", shards[0], " and ", s, " have different numbers of dims");
  // Every shard empty and at the origin: nothing overlaps (PyTorch's special case).
  const bool all_empty_at_origin = std::all_of(shards.begin(), shards.end(), [](const ShardMetadata& s) {
    return s.numel() == 0 &&
           std::all_of(s.shard_offsets().begin(), s.shard_offsets().end(), [](int64_t o) { return o == 0; });
  });
  if (all_empty_at_origin) return;
  for (size_t i = 0; i < shards.size(); ++i)
    for (size_t j = i + 1; j < shards.size(); ++j)
      TORCH_CHECK(!overlap(shards[i], shards[j]), "Shards ", shards[i], " and ", shards[j], " overlap");
}

void check_tensor(const std::vector<ShardMetadata>& shards, const std::vector<int64_t>& tensor_dims) {
  TORCH_CHECK(!shards.empty(), "check_tensor: no shards for a tensor of size ", list(tensor_dims));
  const size_t tensor_rank = tensor_dims.size();
  const size_t shards_rank = shards[0].shard_offsets().size();
  TORCH_CHECK(tensor_rank == shards_rank, "Rank of tensor is ", tensor_rank, ", but shards rank is ", shards_rank);
  int64_t total_shard_volume = 0;
  for (const auto& s : shards) {
    TORCH_CHECK(s.shard_offsets().size() == tensor_rank, "Rank of tensor is ", tensor_rank, ", but shard ", s,
                " has rank ", s.shard_offsets().size());
    for (size_t i = 0; i < tensor_rank; ++i)
      TORCH_CHECK(s.shard_offsets()[i] + s.shard_sizes()[i] <= tensor_dims[i], "Shard offset ", s.shard_offsets()[i],
                  " and length ", s.shard_sizes()[i], " exceeds tensor dim: ", tensor_dims[i], " for shard ", s);
    total_shard_volume += s.numel();
  }
  int64_t tensor_volume = 1;
  for (int64_t d : tensor_dims) tensor_volume *= d;
  TORCH_CHECK(total_shard_volume == tensor_volume, "Total volume of shards: ", total_shard_volume,
              " does not match tensor volume: ", tensor_volume,
              ", in other words all the individual shards do not cover the entire tensor");
}

int64_t get_split_size(int64_t dim_size, int64_t chunks) {
  TORCH_CHECK(chunks > 0, "get_split_size: chunks must be positive, got ", chunks);
  return (dim_size + chunks - 1) / chunks;
}

int64_t get_chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t idx) {
  return std::max<int64_t>(std::min(dim_size, split_size * (idx + 1)) - split_size * idx, 0);
}

int64_t get_chunk_offset(int64_t dim_size, int64_t split_size, int64_t idx) {
  return std::min(dim_size, split_size * idx);
}

// ---- json ----------------------------------------------------------------------------------------

void to_json(nlohmann::json& j, const RemoteDevice& d) { j = d.to_string(); }
void to_json(nlohmann::json& j, const ShardMetadata& m) {
  j = {{"offsets", m.shard_offsets()}, {"sizes", m.shard_sizes()}};
  if (m.placement()) j["placement"] = *m.placement();
}
void to_json(nlohmann::json& j, const TensorProperties& p) {
  j = {{"dtype", static_cast<int>(p.dtype)},
       {"layout", static_cast<int>(p.layout)},
       {"requires_grad", p.requires_grad},
       {"memory_format", static_cast<int>(p.memory_format)},
       {"pin_memory", p.pin_memory}};
}
void from_json(const nlohmann::json& j, TensorProperties& p) {
  p.dtype = static_cast<at::ScalarType>(j.at("dtype").get<int>());
  p.layout = static_cast<c10::Layout>(j.at("layout").get<int>());
  p.requires_grad = j.at("requires_grad").get<bool>();
  p.memory_format = static_cast<c10::MemoryFormat>(j.at("memory_format").get<int>());
  p.pin_memory = j.at("pin_memory").get<bool>();
}
void to_json(nlohmann::json& j, const ShardedTensorMetadata& m) {
  j = {{"shards", m.shards_metadata}, {"size", m.size}, {"properties", m.tensor_properties}};
}
void from_json(const nlohmann::json& j, ShardedTensorMetadata& m) {
  m.shards_metadata = j.at("shards").get<std::vector<ShardMetadata>>();
  m.size = j.at("size").get<std::vector<int64_t>>();
  m.tensor_properties = j.at("properties").get<TensorProperties>();
}

}  // namespace sharded
}  // namespace dtensor

namespace nlohmann {
dtensor::sharded::RemoteDevice adl_serializer<dtensor::sharded::RemoteDevice>::from_json(const json& j) {
  return dtensor::sharded::RemoteDevice(j.get<std::string>());
}
dtensor::sharded::ShardMetadata adl_serializer<dtensor::sharded::ShardMetadata>::from_json(const json& j) {
  std::optional<dtensor::sharded::RemoteDevice> placement;
  if (j.contains("placement")) placement = j["placement"].get<dtensor::sharded::RemoteDevice>();
  return dtensor::sharded::ShardMetadata(j.at("offsets").get<std::vector<int64_t>>(),
                                         j.at("sizes").get<std::vector<int64_t>>(), std::move(placement));
}
}  // namespace nlohmann
