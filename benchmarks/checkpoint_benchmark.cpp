// Distributed checkpoint figures, 4 ranks as gloo processes (the harness's worker
// pool), rank 0 reporting the median of kIters timed iterations per repetition. The state dict
// is 256 MiB: 4 large tensors [3584, 4096] float (56 MiB each) and 256 small ones [32, 1024]
// (128 KiB each), all DTensors Shard(0) on a mesh of 4 (64 MiB per rank). Files go to $TMPDIR
// (or /tmp); no side fsyncs (sync_files = false), so the figures compare the code paths, not
// the disk. The harness's collective call check (on in test programs, off in applications) is
// turned off, as in an application.
//  1. save vs each rank writing the same local bytes to its own file with write(2);
//  2. load (same layout) vs each rank reading them back with pread(2);
//  3. torch::save of the whole unsharded state (gathered beforehand, not timed) from rank 0;
//  4. async_save: the time the caller is blocked (staging copies), vs a synchronous save; with
//     the default options (async_blocked: the process's staging cache, allocated by the first,
//     untimed, save), with fresh staging buffers each time (async_blocked_fresh,
//     cache_staging = false) and with StagingBuffers of the caller's reused
//     (async_blocked_reused);
//  5. load with resharding: saved Shard(0) on 4 ranks, loaded as (Shard(1), Shard(0)) on 2x2;
//  6. load without checking the checksums (load_unverified), and read_metadata alone (every
//     rank parses `.metadata`, the first step of each load);
//  7. a second, literal baseline for load: ONE process (rank 0) preads all 256 MiB, the four
//     ranks' files one after the other, while the other ranks wait (raw_read_one_process);
//  8. save and load in PyTorch's DCP format (SaveOptions::format = kPyTorchDcp: save_dcp,
//     load_dcp); PyTorch's own dcp.save / dcp.load of the same state on 4 Gloo processes is
//     benchmarks/dcp_pytorch_bench.py;
//  9. save as Hugging Face safetensors (kHuggingFace: every rank its shard file, save_hf; with
//     the consolidated files written too, save_hf_consolidated) and load of those shards
//     (load_hf); PyTorch's HuggingFaceStorageWriter / Reader on the same state are in
//     benchmarks/dcp_pytorch_bench.py as well.
//
//   build/benchmarks/checkpoint_benchmark --benchmark_repetitions=3 --benchmark_report_aggregates_only
#include "benchmarks/process_bench.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/comm.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/serialize.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace dtensor {
namespace {

namespace dcp = checkpoint;
constexpr int kWorld = 4;
constexpr int kIters = 5;

enum Case {
  kSave,
  kRawWrite,
  kLoad,
  kRawRead,
  kTorchSave,
  kAsyncBlocked,
  kLoadResharded,
  kAsyncBlockedReused,
  kAsyncBlockedFresh,
  kLoadUnverified,
  kReadMetadata,
  kRawReadOneProcess,
  kSaveDcp,
  kLoadDcp,
  kSaveHf,
  kSaveHfConsolidated,
  kLoadHf,
  kNumCases
};
const char* kCaseNames[] = {"save",          "raw_write",    "load",
                            "raw_read",      "torch_save_rank0", "async_blocked",
                            "load_reshard",  "async_blocked_reused", "async_blocked_fresh",
                            "load_unverified", "read_metadata", "raw_read_one_process",
                            "save_dcp",      "load_dcp",     "save_hf",
                            "save_hf_consolidated", "load_hf"};

// A directory all ranks share, removed at the end.
std::string shared_dir(comm::Group& g) {
  std::string mine;
  if (g.rank() == 0) {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = (tmp && *tmp) ? tmp : "/tmp";
    mine = base + "/dcp_bench_" + std::to_string(::getpid());
    std::filesystem::create_directories(mine);
  }
  return comm::all_gather_object(g, mine)[0];
}

dcp::StateDict make_state(const DeviceMesh& mesh, std::vector<Placement> ps) {
  dcp::StateDict sd;
  for (int i = 0; i < 4; ++i) sd["large." + std::to_string(i)] = dtensor::full({3584, 4096}, float(i), mesh, ps);
  for (int i = 0; i < 256; ++i) sd["small." + std::to_string(i)] = dtensor::full({32, 1024}, float(i), mesh, ps);
  return sd;
}

std::vector<at::Tensor> locals(const dcp::StateDict& sd) {
  std::vector<at::Tensor> out;
  for (const auto& [k, v] : sd) out.push_back(local_tensor(std::get<at::Tensor>(v)));
  return out;
}

void raw_write(const std::vector<at::Tensor>& ts, const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TORCH_CHECK(fd >= 0);
  for (const auto& t : ts) {
    const char* p = static_cast<const char*>(t.data_ptr());
    size_t n = t.nbytes();
    while (n) {
      ssize_t w = ::write(fd, p, n);
      TORCH_CHECK(w > 0);
      p += w;
      n -= size_t(w);
    }
  }
  ::close(fd);
}

void raw_read(std::vector<at::Tensor>& ts, const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0);
  off_t off = 0;
  for (auto& t : ts) {
    char* p = static_cast<char*>(t.data_ptr());
    size_t n = t.nbytes();
    while (n) {
      ssize_t r = ::pread(fd, p, n, off);
      TORCH_CHECK(r > 0);
      p += r;
      n -= size_t(r);
      off += r;
    }
  }
  ::close(fd);
}

class CheckpointBench : public testing::MultiProcessTest {};

void run_case(testing::MultiRankTest& t, Case c) {
  comm::set_check_collectives_default(false);  // every rank, before any collective
  const std::string dir = shared_dir(t.group());
  auto mesh = init_device_mesh("cpu", {kWorld});
  dcp::StateDict sd = make_state(mesh, {Shard{0}});
  dcp::SaveOptions so;
  so.sync_files = false;
  const std::string ckpt = dir + "/ckpt";
  const std::string raw = dir + "/raw_" + std::to_string(t.rank());
  switch (c) {
    case kSave:
      bench::report_median_ms(t, kIters, [&] { dcp::save(sd, ckpt, so); });
      break;
    case kSaveDcp:
      so.format = dcp::CheckpointFormat::kPyTorchDcp;
      bench::report_median_ms(t, kIters, [&] { dcp::save(sd, ckpt, so); });
      break;
    case kLoadDcp: {
      so.format = dcp::CheckpointFormat::kPyTorchDcp;
      dcp::save(sd, ckpt, so);
      dcp::StateDict dest = make_state(mesh, {Shard{0}});
      bench::report_median_ms(t, kIters, [&] { dcp::load(dest, ckpt); });
      break;
    }
    case kSaveHf:
    case kSaveHfConsolidated:
      so.format = dcp::CheckpointFormat::kHuggingFace;
      so.enable_consolidation = c == kSaveHfConsolidated;
      bench::report_median_ms(t, kIters, [&] { dcp::save(sd, ckpt, so); });
      break;
    case kLoadHf: {
      so.format = dcp::CheckpointFormat::kHuggingFace;
      dcp::save(sd, ckpt, so);
      dcp::StateDict dest = make_state(mesh, {Shard{0}});
      bench::report_median_ms(t, kIters, [&] { dcp::load(dest, ckpt); });
      break;
    }
    case kRawWrite: {
      auto ts = locals(sd);
      bench::report_median_ms(t, kIters, [&] { raw_write(ts, raw); });
      break;
    }
    case kLoad: {
      dcp::save(sd, ckpt, so);
      dcp::StateDict dest = make_state(mesh, {Shard{0}});
      bench::report_median_ms(t, kIters, [&] { dcp::load(dest, ckpt); });
      break;
    }
    case kRawRead: {
      auto ts = locals(sd);
      raw_write(ts, raw);
      auto dest = locals(make_state(mesh, {Shard{0}}));
      bench::report_median_ms(t, kIters, [&] { raw_read(dest, raw); });
      break;
    }
    case kTorchSave: {
      std::vector<at::Tensor> full;
      for (const auto& [k, v] : sd) full.push_back(full_tensor(std::get<at::Tensor>(v)));
      bench::report_median_ms(t, kIters, [&] {
        if (t.rank() == 0) torch::save(full, dir + "/full.pt");
      });
      break;
    }
    case kAsyncBlocked:
    case kAsyncBlockedReused:
    case kAsyncBlockedFresh: {
      if (c == kAsyncBlockedReused) so.staging = std::make_shared<dcp::StagingBuffers>();
      if (c == kAsyncBlockedFresh) so.cache_staging = false;
      dcp::release_staging_cache();
      std::vector<double> blocked, total;
      auto once = [&] {
        t.group().barrier();
        auto t0 = std::chrono::steady_clock::now();
        auto fut = dcp::async_save(sd, ckpt, so);
        auto t1 = std::chrono::steady_clock::now();
        fut.get();
        t.group().barrier();
        auto t2 = std::chrono::steady_clock::now();
        blocked.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        total.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      };
      once();
      blocked.clear();
      total.clear();
      for (int i = 0; i < kIters; ++i) once();
      std::sort(blocked.begin(), blocked.end());
      std::sort(total.begin(), total.end());
      if (t.rank() == 0) {
        std::printf("BENCH_MS %.4f\nBENCH_COUNTER async_total_ms %.4f\n", blocked[kIters / 2], total[kIters / 2]);
      }
      std::fflush(stdout);
      dcp::release_staging_cache();
      break;
    }
    case kLoadUnverified: {
      dcp::save(sd, ckpt, so);
      dcp::StateDict dest = make_state(mesh, {Shard{0}});
      dcp::LoadOptions lo;
      lo.verify_checksums = false;
      bench::report_median_ms(t, kIters, [&] { dcp::load(dest, ckpt, lo); });
      break;
    }
    case kReadMetadata:
      dcp::save(sd, ckpt, so);
      bench::report_median_ms(t, kIters, [&] { dcp::read_metadata(ckpt); });
      break;
    case kRawReadOneProcess: {
      auto ts = locals(sd);
      raw_write(ts, raw);
      std::vector<std::vector<at::Tensor>> dests;  // rank 0: one set per rank's file
      if (t.rank() == 0) {
        for (int r = 0; r < kWorld; ++r) {
          dests.emplace_back();
          for (const auto& x : ts) dests.back().push_back(at::full_like(x, 0));
        }
      }
      t.group().barrier();  // every file written
      bench::report_median_ms(t, kIters, [&] {
        for (int r = 0; r < int(dests.size()); ++r) raw_read(dests[size_t(r)], dir + "/raw_" + std::to_string(r));
      });
      break;
    }
    case kLoadResharded: {
      dcp::save(sd, ckpt, so);
      auto mesh2 = init_device_mesh("cpu", {2, 2});
      dcp::StateDict dest = make_state(mesh2, {Shard{1}, Shard{0}});
      bench::report_median_ms(t, kIters, [&] { dcp::load(dest, ckpt); });
      break;
    }
    default:
      break;
  }
  t.group().barrier();
  if (t.rank() == 0) std::filesystem::remove_all(dir);
}

#define CASE_TEST(c) \
  DTENSOR_TEST_F(CheckpointBench, c) { run_case(*this, c); }
CASE_TEST(kSave)
CASE_TEST(kRawWrite)
CASE_TEST(kLoad)
CASE_TEST(kRawRead)
CASE_TEST(kTorchSave)
CASE_TEST(kAsyncBlocked)
CASE_TEST(kLoadResharded)
CASE_TEST(kAsyncBlockedReused)
CASE_TEST(kAsyncBlockedFresh)
CASE_TEST(kLoadUnverified)
CASE_TEST(kReadMetadata)
CASE_TEST(kRawReadOneProcess)
CASE_TEST(kSaveDcp)
CASE_TEST(kLoadDcp)
CASE_TEST(kSaveHf)
CASE_TEST(kSaveHfConsolidated)
CASE_TEST(kLoadHf)

const char* kTestIds[] = {"CheckpointBench.kSave",      "CheckpointBench.kRawWrite",     "CheckpointBench.kLoad",
                          "CheckpointBench.kRawRead",   "CheckpointBench.kTorchSave",    "CheckpointBench.kAsyncBlocked",
                          "CheckpointBench.kLoadResharded", "CheckpointBench.kAsyncBlockedReused",
                          "CheckpointBench.kAsyncBlockedFresh", "CheckpointBench.kLoadUnverified",
                          "CheckpointBench.kReadMetadata", "CheckpointBench.kRawReadOneProcess",
                          "CheckpointBench.kSaveDcp",   "CheckpointBench.kLoadDcp",
                          "CheckpointBench.kSaveHf",    "CheckpointBench.kSaveHfConsolidated",
                          "CheckpointBench.kLoadHf"};

void BM_Checkpoint(benchmark::State& state) {
  const int c = int(state.range(0));
  state.SetLabel(kCaseNames[c]);
  bench::run_in_worker_pool(state, kWorld, kTestIds[c]);
  state.counters["MiB_per_s"] =
      benchmark::Counter(256.0 * double(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Checkpoint)->DenseRange(0, kNumCases - 1)->ArgName("case")->Unit(benchmark::kMillisecond)
    ->UseManualTime()->Iterations(1);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
