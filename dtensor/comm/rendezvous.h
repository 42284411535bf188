// dtensor/comm/rendezvous.h
//
// How processes find each other, and init_process_group (PyTorch's
// torch.distributed.init_process_group).
//
//   // under torchrun / mpirun / srun:
//   dtensor::comm::init_process_group({.backend = "gloo"});          // init_method "env://"
//   // by hand:
//   dtensor::comm::init_process_group({"gloo", "file:///tmp/rdzv", rank, 4});
//   dtensor::comm::init_process_group({"gloo", "tcp://10.0.0.1:29500", rank, 4});
//
// Environment sources, tried in order: torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT), OpenMPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK; MASTER_ADDR/MASTER_PORT or
// localhost:29500), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; MASTER_ADDR or the first
// host of SLURM_STEP_NODELIST/SLURM_NODELIST). The source used is logged to stderr.
#pragma once

#include "dtensor/comm/c10d_group.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <string>

namespace dtensor {
namespace comm {

constexpr int kDefaultMasterPort = 29500;

struct RendezvousInfo {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  std::string master_addr;
  int master_port = kDefaultMasterPort;
  std::string source;  // "torchrun", "openmpi", "slurm"
};

// Reads the launcher variables from `env` (the process environment when null). Returns nullopt
// when no launcher's variables are set; throws c10::Error naming the variable when a launcher's
// variables are present but malformed or incomplete.
std::optional<RendezvousInfo> rendezvous_from_env(
    const std::map<std::string, std::string>* env = nullptr);

// First host of a Slurm nodelist: "node[03-05,7],gpu1" -> "node03".
std::string first_host_of_nodelist(const std::string& nodelist);

c10::intrusive_ptr<c10d::Store> make_file_store(const std::string& path, int world_size);
// Rank 0 hosts the server on addr:port (port 0 picks a free port); the others connect.
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& addr, int port, int rank,
                                               int world_size, std::chrono::milliseconds timeout);

struct InitOptions {
  std::string backend = "gloo";
  // "env://", "file:///path/to/file" or "tcp://host:port"
  std::string init_method = "env://";
  int rank = -1;        // required for file:// and tcp://; env:// reads it
  int world_size = -1;  // likewise
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
};

// Collective over every process of the job: creates the group and makes it the process-wide
// default group. Throws if a default group already exists.
GroupPtr init_process_group(const InitOptions& options = {});

}  // namespace comm
}  // namespace dtensor
