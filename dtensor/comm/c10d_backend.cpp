// dtensor/comm/c10d_backend.cpp: backend specs ("gloo", "cpu:gloo,cuda:nccl"): parsing, and
// which process group a tensor's collective runs on (NOTE: [Backend routing] in c10d_group.h).
#include "dtensor/comm/c10d_group.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace dtensor {
namespace comm {

namespace detail {

std::vector<BackendEntry> parse_backend(const std::string& spec) {
  std::vector<BackendEntry> out;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    TORCH_CHECK(!item.empty(), "backend '", spec, "' has an empty entry; expected gloo, nccl, mpi or "
                "a list such as cpu:gloo,cuda:nccl");
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      out.push_back({"", item});
    } else {
      out.push_back({item.substr(0, colon), item.substr(colon + 1)});
    }
  }
  TORCH_CHECK(!out.empty(), "empty backend name; expected gloo, nccl, mpi or e.g. cpu:gloo,cuda:nccl");
  const bool listed = out.size() > 1 || !out[0].device.empty();
  for (size_t i = 0; listed && i < out.size(); ++i) {
    const BackendEntry& e = out[i];
    TORCH_CHECK(!e.device.empty(), "backend list '", spec,
                "' mixes plain and device:backend entries; write e.g. cpu:gloo,cuda:nccl");
    TORCH_CHECK(e.device == "cpu" || e.device == "cuda", "backend list '", spec, "': unknown device '",
                e.device, "'; expected cpu or cuda, e.g. cpu:gloo,cuda:nccl");
    TORCH_CHECK(!e.backend.empty(), "backend list '", spec, "': no backend for device ", e.device);
    TORCH_CHECK(e.backend != "nccl" || e.device == "cuda", "backend list '", spec,
                "': nccl moves CUDA tensors only; write cuda:nccl and e.g. cpu:gloo");
    for (size_t j = 0; j < i; ++j)
      TORCH_CHECK(out[j].device != e.device, "backend list '", spec, "' names device ", e.device, " twice");
  }
  return out;
}

BackendRoute route_tensor(const std::string& spec, const std::vector<BackendEntry>& entries,
                          const std::string& device_type) {
  TORCH_INTERNAL_ASSERT(!entries.empty());
  if (entries.size() == 1 && entries[0].device.empty()) {
    BackendRoute r;
    r.stage_through_cuda = entries[0].backend == "nccl" && device_type != "cuda";
    r.stage_through_host = entries[0].backend != "nccl" && device_type == "cuda";
    return r;
  }
  for (size_t i = 0; i < entries.size(); ++i)
    if (entries[i].device == device_type) {
      BackendRoute r;
      r.entry = i;
      r.stage_through_host = entries[i].backend != "nccl" && device_type == "cuda";
      return r;
    }
  TORCH_CHECK(device_type == "cpu" || device_type == "cuda", "backend '", spec, "' has no process group for ",
              device_type, " tensors; collectives take cpu or cuda tensors");
  const char* suggestion = device_type == "cuda" ? "nccl" : "gloo";
  TORCH_CHECK(false, "backend '", spec, "' has no process group for ", device_type,
              " tensors; add one to the list, e.g. '", spec, ",", device_type, ":", suggestion, "'");
}

NativeCollectives native_collectives(const std::string& backend) {
  NativeCollectives n;
  if (backend == "nccl") n.all_gather_base = n.reduce_scatter_base = n.avg = true;
  return n;
}

namespace {
// True when some entry of `spec` satisfies `pred`; false for a spec that does not parse.
template <class Pred>
bool any_entry(const std::string& spec, Pred pred) {
  std::vector<BackendEntry> entries;
  try {
    entries = parse_backend(spec);
  } catch (const c10::Error&) {
    return false;
  }
  return std::any_of(entries.begin(), entries.end(), pred);
}
}  // namespace

bool backend_uses_cuda(const std::string& spec) {
  return any_entry(spec, [](const BackendEntry& e) { return e.backend == "nccl" || e.device == "cuda"; });
}

bool backend_uses_nccl(const std::string& spec) {
  return any_entry(spec, [](const BackendEntry& e) { return e.backend == "nccl"; });
}

}  // namespace detail

}  // namespace comm
}  // namespace dtensor
