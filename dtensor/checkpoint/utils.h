// dtensor/checkpoint/utils.h
//
// Lookups of state-dict objects and tensor shards by MetadataIndex, and small helpers of
// torch.distributed.checkpoint.utils. Nothing here is collective.
#pragma once

#include <cstdint>
#include <string>

namespace dtensor {
namespace checkpoint {

// "cpu" for the CPU, else "<device_type>:<device_id>". (PyTorch: _normalize_device_info.)
std::string normalize_device_info(const std::string& device_type, int64_t device_id);

}  // namespace checkpoint
}  // namespace dtensor
