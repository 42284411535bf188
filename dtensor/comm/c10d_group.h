// dtensor/comm/c10d_group.h
//
// C10dGroup: the Group interface over libtorch's c10d process groups (DESIGN.md D2).
//
//   auto store = dtensor::comm::make_file_store("/tmp/rdzv", 4);
//   auto g = dtensor::comm::C10dGroup::create(store, rank, 4, {"gloo"});   // collective
//
// Backends: "gloo" (always), "nccl" (only when libtorch was built with CUDA; this library is
// then compiled with DTENSOR_WITH_NCCL), "mpi" (only when libtorch was built with MPI), and a
// per-device list such as "cpu:gloo,cuda:nccl" that routes each call by its tensor's device.
// Asking for a backend this build lacks throws c10::Error saying so; backend_available()
// answers without throwing (the harness uses it to skip).
//
// NOTE: [Backend routing]
// A single backend gets every tensor, except that NCCL only moves CUDA tensors: a CPU tensor
// given to an "nccl" group (object collectives, the harness's flags, small metadata) is
// staged through the rank's current CUDA device and copied back. A per-device list sends
// each tensor to the entry of its device type; a device without an entry is an error naming
// the list and what to add (e.g. "cpu:gloo" given a CUDA tensor: add ",cuda:nccl").
// Gloo (and MPI) given a CUDA tensor ("gloo", or "cuda:gloo" in a list: every rank's CUDA
// tensors on one GPU, as a one-GPU machine runs its multi-rank suites) get a host copy and the
// result is copied back: Gloo's CUDA support differs by collective and by how libtorch built
// it, and the host copy is right for every collective.
// Barriers go to the first entry.
//
// Collectives are issued asynchronously: each returns c10d's own Work, wrapped as a
// comm::Work (NOTE: [Async collectives] in work.h).
// What a backend lacks is composed here (native_collectives says which): Gloo has no
// reduce_scatter that moves less than an all-reduce (NOTE: [Composed reduce_scatter]: an
// all_to_all and a local reduction), gathers into one tensor through views of its blocks, and
// has no AVG (SUM, then divide). NCCL does all of them natively (_allgather_base,
// _reduce_scatter_base, ReduceOp::AVG).
// Errors from c10d (a peer died, a timeout) surface as CollectiveError naming the op and group.
#pragma once

#include "dtensor/comm/group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace dtensor {
namespace comm {

struct C10dGroupOptions {
  std::string backend = "gloo";
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
  // Address Gloo binds to; empty means: $DTENSOR_GLOO_HOSTNAME, else Gloo's default device
  // (this host's name, falling back to loopback).
  std::string gloo_hostname;
};

// True when `backend` (a name or a "device:backend,..." list) can be created by this build on
// this machine; otherwise false and, if `why` is given, the reason.
bool backend_available(const std::string& backend, std::string* why = nullptr);

namespace detail {
// One entry of a backend spec: "gloo" is {"", "gloo"}; "cpu:gloo,cuda:nccl" is
// {{"cpu", "gloo"}, {"cuda", "nccl"}}.
struct BackendEntry {
  std::string device;
  std::string backend;
};
// Throws c10::Error naming the spec and what is wrong (an empty entry, an unknown device, a
// device listed twice, nccl for CPU tensors, a mix of plain and device:backend entries).
std::vector<BackendEntry> parse_backend(const std::string& spec);

// Where a tensor of `device_type` ("cpu", "cuda") goes: entries[entry], staged through the
// rank's CUDA device when `stage_through_cuda`, through host memory when
// `stage_through_host`. NOTE: [Backend routing]; throws for a device with no entry.
struct BackendRoute {
  size_t entry = 0;
  bool stage_through_cuda = false;
  bool stage_through_host = false;
};
BackendRoute route_tensor(const std::string& spec, const std::vector<BackendEntry>& entries,
                          const std::string& device_type);

// The collectives a backend runs natively; the others are emulated (file comment).
struct NativeCollectives {
  bool all_gather_base = false;      // all_gather into one tensor
  bool reduce_scatter_base = false;  // reduce_scatter from one tensor
  bool avg = false;                  // ReduceOp::AVG
};
NativeCollectives native_collectives(const std::string& backend);

// True when `spec` sends CUDA tensors to nccl (the ranks then need one GPU each).
bool backend_uses_nccl(const std::string& spec);
// True when `spec` is meant for CUDA tensors: it uses nccl or names a cuda: entry
// ("cpu:gloo,cuda:gloo"). The ranks then make a GPU current (rank modulo the GPU count).
bool backend_uses_cuda(const std::string& spec);
}  // namespace detail

class C10dGroup final : public Group {
 public:
  // Collective over `size` processes that share `store`: every one calls it with its rank.
  static std::shared_ptr<C10dGroup> create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, const C10dGroupOptions& options = {});
  ~C10dGroup() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override;
  const std::vector<int>& global_ranks() const override;

  WorkPtr all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM) override;
  WorkPtr all_gather_into_async(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op = ReduceOp::SUM) override;
  WorkPtr all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                  const std::vector<int64_t>& output_splits = {},
                                  const std::vector<int64_t>& input_splits = {}) override;
  WorkPtr broadcast_async(const at::Tensor& tensor, int src) override;
  WorkPtr barrier_async() override;
  WorkPtr send_async(const at::Tensor& tensor, int dst, int tag = 0) override;
  WorkPtr recv_async(const at::Tensor& tensor, int src, int tag = 0) override;
  WorkPtr gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) override;
  WorkPtr scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) override;
  std::shared_ptr<Group> new_subgroup(const std::vector<int>& ranks) override;

  struct Impl;

 private:
  explicit C10dGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace comm
}  // namespace dtensor
