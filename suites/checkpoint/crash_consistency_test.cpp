// dtensor/checkpoint/save_load.h: crash consistency of save (NOTE: [Crash consistency of save]
// in dtensor/checkpoint/save_load.cpp). What disks and machines do to a save in progress: a
// rank killed (SIGKILL) at each point of a save, a failure at each point, a full disk, a
// read-only directory, two jobs saving into one directory at once, and a committed checkpoint
// whose files a new save id would name. After each, the previous checkpoint loads bit-exact
// and the new one is either complete or absent; a failed save leaves no files behind, a killed
// one leaves files that the next save ignores and removes.
//
// The kill cases run a 4-process save as a child program (CrashChild below), since the harness
// reports a killed rank as the failure of its test; the others run as gloo processes and as
// threads at any world size.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/save_internal.h"
#include "dtensor/comm/comm.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/checkpoint_errors.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"
#include "suites/testing/shared_dir.h"

#include <ATen/ATen.h>

#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <exception>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace dtensor {
namespace {

namespace fs = std::filesystem;
using checkpoint::CheckpointException;
using checkpoint::LoadOptions;
using checkpoint::SaveOptions;
using checkpoint::StateDict;
using checkpoint::detail::SaveFaultPoint;
using testing::checkpoint_error_of;
using testing::contains;
using testing::failing_ranks;

DTENSOR_RANK_FIXTURES(CrashGloo, CrashThreads);

// ---- the state saved ------------------------------------------------------------------------

// Rows of w at world size n: every rank holds a shard (3 rows, the last 2), so every rank writes.
int64_t w_rows(int64_t n) { return 3 * n - 1; }

// Version v of the values: not round numbers, so that a bit-exact comparison means something.
at::Tensor w_full(int64_t n, int v) {
  return at::arange(w_rows(n) * 3, at::kFloat).view({w_rows(n), 3}).mul(0.37f).add(float(v) / 7.0f);
}
at::Tensor b_full(int v) { return at::linspace(-1.0, 1.0, 5, at::kDouble).mul(v); }

// Version v as the ranks save it: w sharded by rows, b plain (written once), step an object.
StateDict state(const DeviceMesh& mesh, int v) {
  return StateDict{{"w", distribute_tensor(w_full(mesh.size(), v), mesh, {Shard{0}})},
                   {"b", b_full(v)},
                   {"step", c10::IValue(int64_t(100 + v))}};
}
// Placeholders to load a checkpoint of world size n into, in one process.
StateDict whole_dest(int64_t n) {
  return StateDict{{"w", at::zeros({w_rows(n), 3})}, {"b", at::zeros({5}, at::kDouble)}, {"step", c10::IValue()}};
}
StateDict sharded_dest(const DeviceMesh& mesh) {
  return StateDict{{"w", distribute_tensor(at::zeros({w_rows(mesh.size()), 3}), mesh, {Shard{0}})},
                   {"b", at::zeros({5}, at::kDouble)},
                   {"step", c10::IValue()}};
}

// `sd` (loaded) holds version v, bit for bit.
void expect_version(const StateDict& sd, int64_t n, int v) {
  const at::Tensor& w = std::get<at::Tensor>(sd.at("w"));
  if (is_dtensor(w)) {
    const auto& spec = get_spec(w);
    auto [shape, offset] = compute_local_shape_and_global_offset(w.sizes(), spec.mesh, spec.placements);
    EXPECT_TRUE(at::equal(local_tensor(w), w_full(n, v).narrow(0, offset[0], shape[0]))) << "w of version " << v;
  } else {
    EXPECT_TRUE(at::equal(w, w_full(n, v))) << "w of version " << v << ": " << w;
  }
  EXPECT_TRUE(at::equal(std::get<at::Tensor>(sd.at("b")), b_full(v))) << "b of version " << v;
  EXPECT_EQ(std::get<c10::IValue>(sd.at("step")).toInt(), 100 + v);
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string join(const std::vector<std::string>& v) {
  std::ostringstream os;
  for (const auto& s : v) os << s << " ";
  return os.str();
}

using testing::SharedDir;  // suites/testing/shared_dir.h

// The save fault hook (save_internal.h) for the duration of a scope, set in every rank (each
// process has its own; thread ranks set the same one). Every rank constructs and destroys it;
// the barriers keep a rank's save from starting before every rank set it, and the hook from
// being cleared while a rank still saves.
class FaultHookScope {
 public:
  FaultHookScope(comm::Group& g, checkpoint::detail::SaveFaultHook hook) : group_(g) {
    checkpoint::detail::set_save_fault_hook(std::move(hook));
    group_.barrier();
  }
  ~FaultHookScope() {
    // Not when a failed collective unwinds (a peer was killed): no barrier would complete.
    if (std::uncaught_exceptions() == 0) group_.barrier();
    checkpoint::detail::set_save_fault_hook(nullptr);
  }

 private:
  comm::Group& group_;
};

// A small tmpfs mounted by rank 0 at `path` (a fresh directory) for the test's duration.
// error() says why it could not be mounted (not root, no CAP_SYS_ADMIN): skip with it.
class TmpfsMount {
 public:
  TmpfsMount(comm::Group& g, std::string path, const std::string& options) : group_(g), path_(std::move(path)) {
    std::string error;
    if (g.rank() == 0) {
      fs::create_directories(path_);
      if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) == 0) {
        mounted_ = true;
      } else {
        error = "cannot mount a tmpfs (" + options + ") at '" + path_ + "': " + std::strerror(errno) +
                " (this case needs root with CAP_SYS_ADMIN)";
      }
    }
    error_ = comm::all_gather_object(g, error)[0];
  }
  ~TmpfsMount() {
    group_.barrier();
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }
  // Rank 0 remounts it read-only; collective.
  void make_read_only(const std::string& options) {
    std::string error;
    if (group_.rank() == 0 && ::mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, options.c_str()) != 0)
      error = std::strerror(errno);
    error = comm::all_gather_object(group_, error)[0];
    ASSERT_EQ(error, "") << "remounting '" << path_ << "' read-only";
  }

 private:
  comm::Group& group_;
  std::string path_;
  bool mounted_ = false;
  std::string error_;
};

// ---- a rank killed at each point of a save ----------------------------------------------------

class CrashChild : public testing::MultiProcessTest {
 public:
  int world_size() const override { return 4; }
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(120); }
};

constexpr int kChildRanks = 4;

// Runs only as the child of SaveCrashConsistency.ARankKilledAtAnyPointLeavesTheOldOrTheNewCheckpoint:
// saves version 1 into DTENSOR_DCP_CRASH_DIR, then version 2, during which rank
// DTENSOR_DCP_KILL_RANK kills itself (SIGKILL) at the fault point DTENSOR_DCP_KILL_POINT.
DTENSOR_TEST_F(CrashChild, DISABLED_SaveKilledAtFaultPoint) {
  const char* dir = std::getenv("DTENSOR_DCP_CRASH_DIR");
  const char* point = std::getenv("DTENSOR_DCP_KILL_POINT");
  const char* victim = std::getenv("DTENSOR_DCP_KILL_RANK");
  if (!dir || !point || !victim) GTEST_SKIP() << "run by SaveCrashConsistency.ARankKilledAtAnyPoint...";
  auto mesh = init_device_mesh(device_type(), {ranks()});
  SaveOptions opts;
  opts.checksum_block_bytes = 16;  // several blocks per file: mid_data leaves a part of it
  checkpoint::save(state(mesh, 1), dir, opts);
  const std::string kill_point = point;
  const int kill_rank = std::atoi(victim);
  FaultHookScope hook(group(), [kill_point, kill_rank](SaveFaultPoint p, int r) {
    if (r != kill_rank || kill_point != checkpoint::detail::to_string(p)) return;
    std::cout << "killing rank " << r << " at " << kill_point << std::endl;
    std::raise(SIGKILL);
  });
  checkpoint::save(state(mesh, 2), dir, opts);
  ADD_FAILURE() << "the save finished: rank " << kill_rank << " never reached " << kill_point;
}

// The process ranks of the child are not run in a thread-rank pass (NOTE: [Rank kinds of a
// pass] in harness/multi_rank_test.cpp): nor is this test.
const char* process_ranks_skipped() {
  const char* kind = std::getenv("DTENSOR_RANK_KIND");
  return kind && std::string(kind) == "threads" ? "process ranks are not run in this pass (DTENSOR_RANK_KIND=threads)"
                                                : nullptr;
}

TEST(SaveCrashConsistency, ARankKilledAtAnyPointLeavesTheOldOrTheNewCheckpoint) {
  if (const char* why = process_ranks_skipped()) GTEST_SKIP() << why;
  struct Case {
    const char* point;
    int rank;
    bool committed;  // the new checkpoint is complete (else absent)
  };
  const Case cases[] = {
      {"before_data", kChildRanks - 1, false}, {"mid_data", kChildRanks - 1, false},
      {"mid_data", 0, false},                  {"after_data", kChildRanks - 1, false},
      {"after_data", 0, false},                {"before_rename", 0, false},
      {"after_rename", 0, true},
  };
  LoadOptions lopts;
  lopts.no_dist = true;
  SaveOptions sopts;
  sopts.no_dist = true;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("rank ") + std::to_string(c.rank) + " killed at " + c.point);
    testing::TempDir tmp;
    const std::string ckpt = tmp.path() + "/ckpt";
    auto run = testing::run_self(
        {"--gtest_filter=CrashChild.DISABLED_SaveKilledAtFaultPoint", "--gtest_also_run_disabled_tests"},
        {{"DTENSOR_DCP_CRASH_DIR", ckpt},
         {"DTENSOR_DCP_KILL_POINT", c.point},
         {"DTENSOR_DCP_KILL_RANK", std::to_string(c.rank)}});
    // It died there, and of that.
    EXPECT_NE(run.exit_code, 0) << run.output;
    const std::string rank = "[rank " + std::to_string(c.rank) + "] ";
    EXPECT_PRED2(contains, run.output, rank + "killing rank " + std::to_string(c.rank) + " at " + c.point);
    EXPECT_PRED2(contains, run.output, rank + "crashed: killed by signal SIGKILL");
    // A killed coordinator left its lock (it held it when it died): the next save takes it over.
    if (c.rank == 0)
      EXPECT_TRUE(fs::exists(fs::path(ckpt) / checkpoint::detail::DirectoryLock::kFileName)) << join(entries(ckpt));

    // The old checkpoint, or the new one complete: bit-exact.
    EXPECT_EQ(checkpoint::read_metadata(ckpt).save_id, c.committed ? 2 : 1);
    StateDict sd = whole_dest(kChildRanks);
    checkpoint::load(sd, ckpt, lopts);
    expect_version(sd, kChildRanks, c.committed ? 2 : 1);

    // The next save (another job: this process) is not blocked and leaves only its own files.
    StateDict next{{"w", w_full(kChildRanks, 3)}, {"b", b_full(3)}, {"step", c10::IValue(int64_t(103))}};
    const auto m = checkpoint::save(next, ckpt, sopts);
    sd = whole_dest(kChildRanks);
    checkpoint::load(sd, ckpt, lopts);
    expect_version(sd, kChildRanks, 3);
    EXPECT_EQ(entries(ckpt), (std::vector<std::string>{".metadata", "__0_" + std::to_string(m.save_id) + ".distcp"}));
  }
}

// ---- a failure at each point of a save --------------------------------------------------------

// A rank whose disk fails at any point before the commit (the hook throws there): every rank
// raises naming that rank and its error, the previous checkpoint loads bit-exact, and nothing
// of the failed save is left in the directory.
DTENSOR_TEST_BOTH(CrashGloo, CrashThreads, AFailureAtAnyPointRaisesEverywhereAndLeavesNothing) {
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const int last = t.ranks() - 1;
  struct Case {
    SaveFaultPoint point;
    int rank;
    const char* step;
  };
  const Case cases[] = {
      {SaveFaultPoint::kBeforeData, last, "write"},
      {SaveFaultPoint::kMidData, last, "write"},
      {SaveFaultPoint::kAfterData, last, "write"},
      {SaveFaultPoint::kAfterData, 0, "write"},
      {SaveFaultPoint::kBeforeRename, 0, "commit"},
  };
  SaveOptions opts;
  opts.checksum_block_bytes = 16;
  int n = 0;
  for (const Case& c : cases) {
    const std::string where =
        std::string(checkpoint::detail::to_string(c.point)) + " on rank " + std::to_string(c.rank);
    SCOPED_TRACE(where);
    const std::string ckpt = dir.sub("ckpt" + std::to_string(n++));
    checkpoint::save(state(mesh, 1), ckpt, opts);
    t.group().barrier();
    const auto before = entries(ckpt);
    {
      FaultHookScope hook(t.group(), [&c, where](SaveFaultPoint p, int r) {
        if (p == c.point && r == c.rank) throw std::runtime_error("disk failed at " + where);
      });
      auto e = checkpoint_error_of([&] { checkpoint::save(state(mesh, 2), ckpt, opts); });
      ASSERT_TRUE(e);
      EXPECT_EQ(e->step(), c.step);
      EXPECT_EQ(failing_ranks(*e), std::vector<int>{c.rank});
      EXPECT_PRED2(contains, e->what_without_backtrace(), "disk failed at " + where);
    }
    StateDict sd = sharded_dest(mesh);
    checkpoint::load(sd, ckpt);
    expect_version(sd, t.ranks(), 1);
    EXPECT_EQ(checkpoint::read_metadata(ckpt).save_id, 1);
    t.group().barrier();  // every rank has cleaned up
    EXPECT_EQ(entries(ckpt), before) << "left: " << join(entries(ckpt));
  }
}

// ---- a save id that would name the committed checkpoint's files --------------------------------

// The committed `.metadata` says save 1 while its files are save 2's (a checkpoint whose
// metadata was written by another tool, or copied between directories): the next save must not
// write files of that name (it would overwrite the data the committed checkpoint reads).
DTENSOR_TEST_BOTH(CrashGloo, CrashThreads, ASaveNeverWritesTheCommittedCheckpointsFiles) {
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const std::string ckpt = dir.sub("ckpt");
  checkpoint::save(state(mesh, 1), ckpt);
  checkpoint::save(state(mesh, 2), ckpt);  // files __<r>_2.distcp
  t.group().barrier();
  const auto committed = entries(ckpt);
  if (t.rank() == 0) {
    const std::string path = ckpt + "/.metadata";
    std::string text = testing::read_file(path);
    const auto at = text.find("\"save_id\":2");
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, 11, "\"save_id\":1");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  t.group().barrier();
  ASSERT_EQ(checkpoint::read_metadata(ckpt).save_id, 1);
  {
    // The new save fails after every rank wrote its data file.
    const int last = t.ranks() - 1;
    FaultHookScope hook(t.group(), [last](SaveFaultPoint p, int r) {
      if (p == SaveFaultPoint::kAfterData && r == last) throw std::runtime_error("disk failed");
    });
    auto e = checkpoint_error_of([&] { checkpoint::save(state(mesh, 3), ckpt); });
    ASSERT_TRUE(e);
  }
  StateDict sd = sharded_dest(mesh);
  checkpoint::load(sd, ckpt);
  expect_version(sd, t.ranks(), 2);
  t.group().barrier();
  EXPECT_EQ(entries(ckpt), committed) << "left: " << join(entries(ckpt));
  // A save that succeeds takes an id of its own too.
  const auto m = checkpoint::save(state(mesh, 4), ckpt);
  EXPECT_GT(m.save_id, 2);
  sd = sharded_dest(mesh);
  checkpoint::load(sd, ckpt);
  expect_version(sd, t.ranks(), 4);
}

// ---- two jobs saving into one directory at once ------------------------------------------------

// While a save runs, another job's save into the same directory (here: rank 1, as a job of
// one process, while its own save waits for the others) is refused at once, naming the job
// that saves (its coordinator's pid and host); the first save completes undisturbed.
DTENSOR_TEST_BOTH(CrashGloo, CrashThreads, ASecondJobSavingIntoTheSameDirectoryIsRefusedNamingTheFirst) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // rank 1 is the other job
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const std::string ckpt = dir.sub("ckpt");
  checkpoint::save(state(mesh, 1), ckpt);
  const int coordinator_pid = comm::all_gather_object(t.group(), int(::getpid()))[0];
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);

  // What rank 1's other job got, in a file (the hook is process-wide: with thread ranks, every
  // rank's hook is the one the last rank set).
  const std::string outcome = dir.sub("other_job");
  {
    const int n = t.ranks();
    FaultHookScope hook(t.group(), [ckpt, outcome, n](SaveFaultPoint p, int r) {
      if (p != SaveFaultPoint::kAfterData || r != 1) return;  // the other job's own save is rank 0's
      SaveOptions other;
      other.no_dist = true;
      StateDict theirs{{"w", w_full(n, 9)}, {"b", b_full(9)}, {"step", c10::IValue(int64_t(109))}};
      std::string what = "saved";
      try {
        checkpoint::save(theirs, ckpt, other);
      } catch (const std::exception& e) {
        what = e.what();
      }
      std::ofstream(outcome) << what;
    });
    checkpoint::save(state(mesh, 2), ckpt);
  }
  EXPECT_PRED2(contains, testing::read_file(outcome),
               "checkpoint directory '" + ckpt + "' is being saved by another job: pid " +
                   std::to_string(coordinator_pid) + " on host " + host + " (coordinator rank 0 of " +
                   std::to_string(t.ranks()) + ")");
  StateDict sd = sharded_dest(mesh);
  checkpoint::load(sd, ckpt);
  expect_version(sd, t.ranks(), 2);
  t.group().barrier();
  for (const auto& name : entries(ckpt))
    EXPECT_TRUE(name == ".metadata" || contains(name, "_2.distcp")) << "left: " << join(entries(ckpt));
}

// A lock file left by a job that died: on a file system without flock its content decides,
// and it names a dead process of this host; with flock it is not held. Either way a save
// takes it over (and removes it when done).
TEST(SaveDirectoryLock, ALockLeftByADeadProcessOfThisHostDoesNotBlock) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0) << std::strerror(errno);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string rest = " (coordinator rank 0 of 4), since 2025-01-31T12:00:00Z";
  const std::string dead = "pid " + std::to_string(child) + " on host " + host + rest;
  EXPECT_TRUE(checkpoint::detail::lock_holder_is_gone(dead));
  EXPECT_TRUE(checkpoint::detail::lock_holder_is_gone("pid " + std::to_string(child) + " on host " + host +
                                                      ", since 2025-01-31T12:00:00Z"));
  const std::string alive = "pid " + std::to_string(::getpid()) + " on host " + host + rest;
  EXPECT_FALSE(checkpoint::detail::lock_holder_is_gone(alive));
  const std::string elsewhere = "pid " + std::to_string(child) + " on host another-" + host + rest;
  EXPECT_FALSE(checkpoint::detail::lock_holder_is_gone(elsewhere));
  EXPECT_FALSE(checkpoint::detail::lock_holder_is_gone("not an identity"));

  testing::TempDir tmp;
  const std::string ckpt = tmp.path() + "/ckpt";
  fs::create_directories(ckpt);
  std::ofstream(fs::path(ckpt) / checkpoint::detail::DirectoryLock::kFileName) << dead << "\n";
  SaveOptions opts;
  opts.no_dist = true;
  checkpoint::save(StateDict{{"w", w_full(1, 1)}, {"b", b_full(1)}, {"step", c10::IValue(int64_t(101))}}, ckpt, opts);
  EXPECT_EQ(entries(ckpt), (std::vector<std::string>{".metadata", "__0_1.distcp"}));
}

// ---- full disk, read-only directory -----------------------------------------------------------

// A 256 KiB tmpfs in a directory every rank sees, holding version 1 of the checkpoint (`ckpt`,
// whose files are `before`); error() says why not where the tmpfs cannot be mounted.
class DiskWithCheckpoint {
 public:
  static constexpr const char* kOptions = "size=256k";
  DiskWithCheckpoint(testing::MultiRankTest& t, const DeviceMesh& mesh)
      : dir_(t.group()), disk_(t.group(), dir_.sub("disk"), kOptions), ckpt_(dir_.sub("disk/ckpt")) {
    if (!disk_.error().empty()) return;
    checkpoint::save(state(mesh, 1), ckpt_);
    t.group().barrier();
    before_ = entries(ckpt_);
  }
  const std::string& error() const { return disk_.error(); }
  const std::string& ckpt() const { return ckpt_; }
  const std::vector<std::string>& before() const { return before_; }
  void make_read_only() { disk_.make_read_only(kOptions); }
  // Version 1 still loads, bit-exact.
  void expect_previous_loads(const DeviceMesh& mesh, int64_t ranks) const {
    StateDict sd = sharded_dest(mesh);
    checkpoint::load(sd, ckpt_);
    expect_version(sd, ranks, 1);
  }

 private:
  SharedDir dir_;
  TmpfsMount disk_;
  std::string ckpt_;
  std::vector<std::string> before_;
};

// The disk fills up in the middle of a save (one rank writes a key larger than the disk):
// every rank raises, naming the rank(s) that could not write, the file and the system's
// error; the previous checkpoint loads bit-exact, and no file of the failed save is left.
DTENSOR_TEST_BOTH(CrashGloo, CrashThreads, AFullDiskRaisesEverywhereAndKeepsThePreviousCheckpoint) {
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  DiskWithCheckpoint disk(t, mesh);
  if (!disk.error().empty()) GTEST_SKIP() << disk.error();
  StateDict big = state(mesh, 2);
  big["big"] = at::ones({1 << 20}, at::kByte);  // 1 MiB, written by one rank
  auto e = checkpoint_error_of([&] { checkpoint::save(big, disk.ckpt()); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "write");
  ASSERT_FALSE(e->failures().empty());
  for (const auto& [r, f] : e->failures()) {
    EXPECT_PRED2(contains, f.message, disk.ckpt() + "/__" + std::to_string(r) + "_");
    EXPECT_PRED2(contains, f.message, "No space left on device");
  }
  disk.expect_previous_loads(mesh, t.ranks());
  t.group().barrier();
  EXPECT_EQ(entries(disk.ckpt()), disk.before()) << "left: " << join(entries(disk.ckpt()));
}

// A read-only directory: the save raises on every rank naming the directory and the system's
// error; the checkpoint in it still loads.
DTENSOR_TEST_BOTH(CrashGloo, CrashThreads, AReadOnlyDirectoryRaisesEverywhereAndStillLoads) {
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  DiskWithCheckpoint disk(t, mesh);
  if (!disk.error().empty()) GTEST_SKIP() << disk.error();
  disk.make_read_only();
  auto e = checkpoint_error_of([&] { checkpoint::save(state(mesh, 2), disk.ckpt()); });
  ASSERT_TRUE(e);
  ASSERT_FALSE(e->failures().empty());
  for (const auto& [r, f] : e->failures()) {
    EXPECT_PRED2(contains, f.message, disk.ckpt() + "/");
    EXPECT_PRED2(contains, f.message, "Read-only file system");
  }
  disk.expect_previous_loads(mesh, t.ranks());
  EXPECT_EQ(entries(disk.ckpt()), disk.before());
}

}  // namespace
}  // namespace dtensor
