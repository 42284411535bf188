// dtensor/comm/device.h
//
// Which device a rank's tensors live on.
//
//   dtensor::comm::use_rank_cuda_device(rank);          // once per rank process (or thread)
//   at::Device d = dtensor::comm::rank_device("cuda");  // cuda:<that device>
//
// NOTE: [Rank devices]
// One GPU per rank, as PyTorch: rank r uses CUDA device LOCAL_RANK when a launcher gave one
// (torchrun's LOCAL_RANK, mpirun's OMPI_COMM_WORLD_LOCAL_RANK, srun's SLURM_LOCALID), else
// r modulo the GPU count (PyTorch's DeviceMesh and MultiProcessTestCase do the same). The
// choice is made current (CUDA's current device is per thread) by init_process_group and, in
// the test harness, by every rank whose backend handles CUDA tensors; DeviceMesh("cuda")
// then puts its local tensors on that device (rank_device). CPU tensors need none of this.
// Everything here except use_rank_cuda_device and rank_device is plain logic, unit-tested
// on machines without a GPU.
#pragma once

#include <c10/core/Device.h>

#include <map>
#include <string>

namespace dtensor {
namespace comm {

// Number of CUDA devices this process sees (0 with a CPU-only libtorch).
int cuda_device_count();

// The CUDA device index of a rank (NOTE: [Rank devices]): `local_rank` when >= 0 (it must be
// below `gpu_count`, else the error names both), else `rank % gpu_count`. Needs gpu_count >= 1.
int select_cuda_device(int rank, int local_rank, int gpu_count);

// LOCAL_RANK from `env` (the process environment when null), or -1 when unset. Throws
// c10::Error naming the variable when it is not a non-negative integer.
int local_rank_from_env(const std::map<std::string, std::string>* env = nullptr);

// Makes select_cuda_device(rank, local_rank, cuda_device_count()) this thread's current CUDA
// device and returns it; returns -1 and does nothing on a machine without GPUs.
int use_rank_cuda_device(int rank, int local_rank = -1);

// The device a rank's local tensors of `device_type` live on: cpu for "cpu", cuda:<current
// device> for "cuda", meta for "meta" (a fake world's, NOTE: [Fake world]). `what` names the
// caller in errors (e.g. the mesh): a "cuda" request on a machine without GPUs, or another
// device type, throws c10::Error saying so.
c10::Device rank_device(const std::string& device_type, const std::string& what = "");

}  // namespace comm
}  // namespace dtensor
