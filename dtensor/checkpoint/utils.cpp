// dtensor/checkpoint/utils.cpp
#include "dtensor/checkpoint/utils.h"

namespace dtensor {
namespace checkpoint {

std::string normalize_device_info(const std::string& device_type, int64_t device_id) {
  if (device_type == "cpu") return "cpu";
  return device_type + ":" + std::to_string(device_id);
}

}  // namespace checkpoint
}  // namespace dtensor
