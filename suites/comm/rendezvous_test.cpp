// Rendezvous: launcher variables, stores, init_process_group errors. Plain tests (one process).
#include "dtensor/comm/comm.h"
#include "dtensor/comm/device.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

namespace dtensor {
namespace {

using Env = std::map<std::string, std::string>;

using testing::error_of;
TEST(RendezvousFromEnv, NoLauncherVariablesMeansNone) {
  Env env{{"HOME", "/root"}};
  EXPECT_FALSE(comm::rendezvous_from_env(&env).has_value());
}

TEST(RendezvousFromEnv, Torchrun) {
  Env env{{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "29400"}};
  auto r = comm::rendezvous_from_env(&env);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, "torchrun");
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->master_addr, "10.1.2.3");
  EXPECT_EQ(r->master_port, 29400);
}

TEST(RendezvousFromEnv, OpenMpiDefaultsToLocalhost) {
  Env env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  auto r = comm::rendezvous_from_env(&env);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, "openmpi");
  EXPECT_EQ(r->master_addr, "127.0.0.1");
  EXPECT_EQ(r->master_port, comm::kDefaultMasterPort);
}

TEST(RendezvousFromEnv, SlurmTakesFirstNodeOfTheList) {
  Env env{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
          {"SLURM_STEP_NODELIST", "gpu[07-10,12],cpu1"}};
  auto r = comm::rendezvous_from_env(&env);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->source, "slurm");
  EXPECT_EQ(r->master_addr, "gpu07");
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(comm::first_host_of_nodelist("node1,node2"), "node1");
}

TEST(RendezvousFromEnv, MalformedVariablesNameTheVariable) {
  Env bad_rank{{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  EXPECT_NE(error_of([&] { comm::rendezvous_from_env(&bad_rank); }).find("RANK='x' is not an integer"),
            std::string::npos);
  Env no_master{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  EXPECT_NE(error_of([&] { comm::rendezvous_from_env(&no_master); }).find("MASTER_ADDR is not set"),
            std::string::npos);
  Env out_of_range{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  EXPECT_NE(error_of([&] { comm::rendezvous_from_env(&out_of_range); }).find("rank 2 is outside [0, 2)"),
            std::string::npos);
}

TEST(InitProcessGroup, RejectsBadInitMethods) {
  EXPECT_NE(error_of([] { comm::init_process_group({"gloo", "udp://x", 0, 1}); }).find("unknown init_method"),
            std::string::npos);
  EXPECT_NE(error_of([] { comm::init_process_group({"gloo", "file:///tmp/x", 3, 2}); })
                .find("pass rank (0 <= rank < world_size)"),
            std::string::npos);
  EXPECT_FALSE(comm::is_initialized());
}

TEST(BackendAvailable, ExplainsWhatIsMissing) {
  std::string why;
  EXPECT_TRUE(comm::backend_available("gloo", &why));
  EXPECT_FALSE(comm::backend_available("bogus", &why));
  EXPECT_NE(why.find("unknown backend 'bogus'"), std::string::npos);
  EXPECT_FALSE(comm::backend_available("mpi", &why));
  EXPECT_NE(why.find("MPI"), std::string::npos);
  EXPECT_FALSE(comm::backend_available("gloo,cuda:nccl", &why));
  EXPECT_NE(why.find("mixes plain and device:backend"), std::string::npos);
}

// NOTE: [Backend routing]: a spec is one backend or a device:backend list; bad lists are named.
TEST(BackendRouting, ParsesListsAndNamesBadEntries) {
  auto e = comm::detail::parse_backend("cpu:gloo,cuda:nccl");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].device, "cpu");
  EXPECT_EQ(e[0].backend, "gloo");
  EXPECT_EQ(e[1].device, "cuda");
  EXPECT_EQ(e[1].backend, "nccl");
  e = comm::detail::parse_backend("nccl");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].device, "");
  struct Bad {
    const char* spec;
    const char* message;
  };
  for (Bad b : {Bad{"gloo,cuda:nccl", "mixes plain and device:backend entries"},
                Bad{"tpu:gloo", "unknown device 'tpu'; expected cpu or cuda"},
                Bad{"cpu:gloo,cpu:mpi", "names device cpu twice"},
                Bad{"cpu:nccl", "nccl moves CUDA tensors only"},
                Bad{"cpu:", "no backend for device cpu"},
                Bad{"gloo,,nccl", "has an empty entry"}}) {
    SCOPED_TRACE(b.spec);
    EXPECT_NE(error_of([&] { comm::detail::parse_backend(b.spec); }).find(b.message), std::string::npos)
        << error_of([&] { comm::detail::parse_backend(b.spec); });
    std::string why;
    EXPECT_FALSE(comm::backend_available(b.spec, &why));
    EXPECT_NE(why.find(b.message), std::string::npos) << why;
  }
}

TEST(BackendRouting, RoutesByTensorDevice) {
  const auto list = comm::detail::parse_backend("cpu:gloo,cuda:nccl");
  auto r = comm::detail::route_tensor("cpu:gloo,cuda:nccl", list, "cpu");
  EXPECT_EQ(r.entry, 0u);
  EXPECT_FALSE(r.stage_through_cuda);
  r = comm::detail::route_tensor("cpu:gloo,cuda:nccl", list, "cuda");
  EXPECT_EQ(r.entry, 1u);
  EXPECT_FALSE(r.stage_through_cuda);
  // A single backend takes every tensor; NCCL gets CPU tensors through the rank's GPU.
  const auto gloo = comm::detail::parse_backend("gloo");
  EXPECT_FALSE(comm::detail::route_tensor("gloo", gloo, "cpu").stage_through_cuda);
  EXPECT_FALSE(comm::detail::route_tensor("gloo", gloo, "cuda").stage_through_cuda);
  const auto nccl = comm::detail::parse_backend("nccl");
  EXPECT_TRUE(comm::detail::route_tensor("nccl", nccl, "cpu").stage_through_cuda);
  EXPECT_FALSE(comm::detail::route_tensor("nccl", nccl, "cuda").stage_through_cuda);
  // Gloo gets host copies of CUDA tensors ("cuda:gloo": the one-GPU nightly), never NCCL.
  EXPECT_TRUE(comm::detail::route_tensor("gloo", gloo, "cuda").stage_through_host);
  EXPECT_FALSE(comm::detail::route_tensor("gloo", gloo, "cpu").stage_through_host);
  EXPECT_FALSE(comm::detail::route_tensor("nccl", nccl, "cuda").stage_through_host);
  const auto both_gloo = comm::detail::parse_backend("cpu:gloo,cuda:gloo");
  r = comm::detail::route_tensor("cpu:gloo,cuda:gloo", both_gloo, "cuda");
  EXPECT_EQ(r.entry, 1u);
  EXPECT_TRUE(r.stage_through_host);
  EXPECT_FALSE(r.stage_through_cuda);
  EXPECT_FALSE(comm::detail::route_tensor("cpu:gloo,cuda:gloo", both_gloo, "cpu").stage_through_host);
  EXPECT_FALSE(comm::detail::route_tensor("cpu:gloo,cuda:nccl", list, "cuda").stage_through_host);
  // A device without an entry: the error names the list and what to add.
  const auto cpu_only = comm::detail::parse_backend("cpu:gloo");
  EXPECT_EQ(comm::detail::route_tensor("cpu:gloo", cpu_only, "cpu").entry, 0u);
  EXPECT_NE(error_of([&] { comm::detail::route_tensor("cpu:gloo", cpu_only, "cuda"); })
                .find("backend 'cpu:gloo' has no process group for cuda tensors; add one to the list, e.g. "
                      "'cpu:gloo,cuda:nccl'"),
            std::string::npos);
  const auto cuda_only = comm::detail::parse_backend("cuda:nccl");
  EXPECT_NE(error_of([&] { comm::detail::route_tensor("cuda:nccl", cuda_only, "cpu"); })
                .find("e.g. 'cuda:nccl,cpu:gloo'"),
            std::string::npos);
}

TEST(BackendRouting, NcclRunsEveryCollectiveNatively) {
  const auto nccl = comm::detail::native_collectives("nccl");
  EXPECT_TRUE(nccl.all_gather_base && nccl.reduce_scatter_base && nccl.avg);
  const auto gloo = comm::detail::native_collectives("gloo");  // emulated (DESIGN.md D2)
  EXPECT_FALSE(gloo.all_gather_base || gloo.reduce_scatter_base || gloo.avg);
  EXPECT_TRUE(comm::detail::backend_uses_nccl("nccl"));
  EXPECT_TRUE(comm::detail::backend_uses_nccl("cpu:gloo,cuda:nccl"));
  EXPECT_FALSE(comm::detail::backend_uses_nccl("gloo"));
  EXPECT_FALSE(comm::detail::backend_uses_nccl("cpu:gloo"));
  EXPECT_FALSE(comm::detail::backend_uses_nccl("tpu:nccl"));  // not a valid spec
  EXPECT_TRUE(comm::detail::backend_uses_cuda("nccl"));
  EXPECT_TRUE(comm::detail::backend_uses_cuda("cpu:gloo,cuda:gloo"));
  EXPECT_FALSE(comm::detail::backend_uses_nccl("cpu:gloo,cuda:gloo"));
  EXPECT_FALSE(comm::detail::backend_uses_cuda("gloo"));
  EXPECT_FALSE(comm::detail::backend_uses_cuda("cpu:gloo"));
}

// NOTE: [Rank devices]
TEST(RankDevice, LocalRankElseRankModuloGpus) {
  EXPECT_EQ(comm::select_cuda_device(5, -1, 4), 1);
  EXPECT_EQ(comm::select_cuda_device(3, -1, 8), 3);
  EXPECT_EQ(comm::select_cuda_device(5, 2, 4), 2);  // LOCAL_RANK wins (multi-node)
  EXPECT_NE(error_of([] { comm::select_cuda_device(5, 4, 4); })
                .find("rank 5 has local rank 4 (LOCAL_RANK), but this machine has only 4 CUDA devices"),
            std::string::npos);
  EXPECT_NE(error_of([] { comm::select_cuda_device(0, -1, 0); }).find("this machine has none"),
            std::string::npos);
}

TEST(RankDevice, LocalRankFromEnv) {
  Env none{{"RANK", "1"}};
  EXPECT_EQ(comm::local_rank_from_env(&none), -1);
  Env two{{"LOCAL_RANK", "2"}};
  EXPECT_EQ(comm::local_rank_from_env(&two), 2);
  for (const char* bad : {"", "x", "-1", "1x"}) {
    Env env{{"LOCAL_RANK", bad}};
    EXPECT_NE(error_of([&] { comm::local_rank_from_env(&env); })
                  .find("LOCAL_RANK='" + std::string(bad) + "' is not a non-negative integer"),
              std::string::npos)
        << bad;
  }
}

TEST(RankDevice, CpuAlwaysCudaOnlyWithGpus) {
  EXPECT_EQ(comm::rank_device("cpu"), c10::Device(c10::kCPU));
  EXPECT_NE(error_of([] { comm::rank_device("tpu", "my mesh"); })
                .find("my mesh: device type 'tpu' is not supported"),
            std::string::npos);
  if (comm::cuda_device_count() == 0) {
    EXPECT_EQ(comm::use_rank_cuda_device(3), -1);
    EXPECT_NE(error_of([] { comm::rank_device("cuda", "my mesh"); })
                  .find("my mesh: local tensors go on a CUDA device, but this machine has none"),
              std::string::npos);
  } else {
    const int index = comm::use_rank_cuda_device(0);
    EXPECT_EQ(comm::rank_device("cuda"), c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index)));
  }
}

// Gloo ranks may be threads of one process (DESIGN.md D2): a file and a TCP rendezvous.
TEST(C10dGroup, FileAndTcpRendezvousWithThreadRanks) {
  testing::TempDir dir;
  for (const std::string method : {"file", "tcp"}) {
    SCOPED_TRACE(method);
    constexpr int n = 2;
    std::vector<float> sums(n, -1);
    std::vector<std::string> errors(n);
    // The TCP server is rank 0's store; port 0 lets the kernel choose, so rank 0 creates first.
    c10::intrusive_ptr<c10d::Store> server;
    if (method == "tcp") server = comm::make_tcp_store("127.0.0.1", 0, 0, n, std::chrono::seconds(30));
    const int port = method == "tcp" ? static_cast<c10d::TCPStore&>(*server).getPort() : 0;
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        try {
          c10::intrusive_ptr<c10d::Store> store =
              method == "file" ? comm::make_file_store(dir.path() + "/store", n)
              : r == 0         ? server
                               : comm::make_tcp_store("127.0.0.1", port, r, n, std::chrono::seconds(30));
          comm::C10dGroupOptions o;
          o.gloo_hostname = "127.0.0.1";
          o.timeout = std::chrono::seconds(30);
          auto g = comm::C10dGroup::create(store, r, n, o);
          at::Tensor x = at::full({2}, r + 1.0);
          g->all_reduce(x);
          sums[r] = x[0].item<float>();
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(errors[r], "") << "rank " << r;
      EXPECT_EQ(sums[r], 3.0f) << "rank " << r;
    }
  }
}

TEST(DefaultGroup, MissingGroupErrorSaysWhatToDo) {
  EXPECT_NE(error_of([] { comm::default_group(); }).find("call dtensor::comm::init_process_group"),
            std::string::npos);
}

}  // namespace
}  // namespace dtensor
