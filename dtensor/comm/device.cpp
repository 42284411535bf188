// dtensor/comm/device.cpp: see device.h and NOTE: [Rank devices].
#include "dtensor/comm/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <cstdlib>

namespace dtensor {
namespace comm {

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

int select_cuda_device(int rank, int local_rank, int gpu_count) {
  TORCH_CHECK(gpu_count >= 1, "select_cuda_device: rank ", rank,
              " asks for a CUDA device, but this machine has none");
  TORCH_CHECK(rank >= 0, "select_cuda_device: rank ", rank, " is negative");
  if (local_rank < 0) return rank % gpu_count;
  TORCH_CHECK(local_rank < gpu_count, "rank ", rank, " has local rank ", local_rank,
              " (LOCAL_RANK), but this machine has only ", gpu_count,
              " CUDA devices: start at most one rank per GPU on each host");
  return local_rank;
}

int local_rank_from_env(const std::map<std::string, std::string>* env) {
  std::string v;
  if (env) {
    auto it = env->find("LOCAL_RANK");
    if (it == env->end()) return -1;
    v = it->second;
  } else {
    const char* p = std::getenv("LOCAL_RANK");
    if (!p) return -1;
    v = p;
  }
  size_t pos = 0;
  int x = -1;
  try {
    x = std::stoi(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  TORCH_CHECK(pos == v.size() && !v.empty() && x >= 0, "LOCAL_RANK='", v,
              "' is not a non-negative integer");
  return x;
}

int use_rank_cuda_device(int rank, int local_rank) {
  const int n = cuda_device_count();
  if (n == 0) return -1;
  const int index = select_cuda_device(rank, local_rank, n);
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)
      ->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
  return index;
}

c10::Device rank_device(const std::string& device_type, const std::string& what) {
  const std::string who = what.empty() ? std::string("rank_device") : what;
  if (device_type == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (device_type == "meta") return c10::Device(c10::DeviceType::Meta);
  TORCH_CHECK(device_type == "cuda", who, ": device type '", device_type,
              "' is not supported; use \"cpu\", \"cuda\" or (on a fake world) \"meta\"");
  TORCH_CHECK(cuda_device_count() > 0, who,
              ": local tensors go on a CUDA device, but this machine has none (or libtorch was "
              "built without CUDA); use a \"cpu\" mesh");
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
}

}  // namespace comm
}  // namespace dtensor
