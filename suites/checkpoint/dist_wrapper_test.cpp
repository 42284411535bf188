// dtensor/checkpoint (torch.distributed.checkpoint.utils): DistWrapper's object collectives and
// exception-robust steps, without a group and as ranks (gloo processes and threads; tests whose
// ranks 1 to 3 play distinct roles need 4 or more), the MetadataIndex and the file view.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/comm.h"
#include "harness/harness.h"
#include "suites/testing/checkpoint_errors.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

using checkpoint::CheckpointException;
using checkpoint::DistWrapper;
using testing::contains;
using testing::error_of;

using testing::checkpoint_error_of;
using testing::failing_ranks;

// ---- without a group (use_dist = false) ----------------------------------------------------------

TEST(DistWrapper, WithoutDistIsAWorldOfOne) {
  DistWrapper dist(nullptr, /*use_dist=*/false, /*coordinator_rank=*/0);
  EXPECT_EQ(dist.get_rank(), 0);
  EXPECT_EQ(dist.get_world_size(), 1);
  EXPECT_TRUE(dist.is_coordinator());
  EXPECT_EQ(dist.group(), nullptr);
  EXPECT_EQ(dist.broadcast_object(std::optional<std::string>("x")), "x");
  EXPECT_EQ(*dist.gather_object(7), std::vector<int>{7});
  EXPECT_EQ(dist.all_gather_object(7), std::vector<int>{7});
  EXPECT_EQ(dist.scatter_object(std::optional<std::vector<int>>(std::vector<int>{5})), 5);
  EXPECT_EQ(dist.reduce_scatter(
                "plan", [] { return 3; }, [](std::vector<int> all) { return std::vector<int>{all[0] * 2}; }),
            6);
  EXPECT_EQ(dist.all_reduce(
                "sum", [] { return 3; }, [](std::vector<int> all) { return std::string(all.size(), '+'); }),
            "+");
  EXPECT_EQ(dist.all_gather("gather", [] { return 1.5; }), std::vector<double>{1.5});
  EXPECT_EQ(dist.broadcast("meta", [] { return std::string("m"); }), "m");
}

TEST(DistWrapper, WithoutDistStillReportsFailures) {
  DistWrapper dist(nullptr, false, 0);
  auto e =
      checkpoint_error_of([&] { dist.all_gather("write", []() -> int { throw std::out_of_range("disk full"); }); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "write");
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{0});
  EXPECT_EQ(e->failures().at(0).type, "std::out_of_range");
  EXPECT_EQ(e->failures().at(0).message, "disk full");
  EXPECT_PRED2(contains, e->what_without_backtrace(),
               "CheckpointException ranks:[0] step: 'write'\n(RANK 0) std::out_of_range: disk full");
  EXPECT_PRED2(contains, error_of([&] { dist.scatter_object<int>(std::nullopt); }),
               "DistWrapper.scatter_object: the coordinator (rank 0) passed no object list");
  EXPECT_PRED2(contains, error_of([&] { dist.broadcast_object<int>(std::nullopt); }),
               "DistWrapper.broadcast_object: the coordinator (rank 0) passed no object");
}

// ---- across ranks ----------------------------------------------------------------------------------

// 0, 1, ..., n - 1.
std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

DTENSOR_RANK_FIXTURES(DistWrapperGloo, DistWrapperThreads);

// PyTorch's _DistWrapper.barrier(): dist.barrier(group) when use_dist, nothing otherwise.
DTENSOR_TEST_F(DistWrapperThreads, Barrier) {
  {
    testing::CallCounter counter;
    DistWrapper dist(group_ptr(), /*use_dist=*/true);
    dist.barrier();
    EXPECT_EQ(counter.calls, (std::map<std::string, int>{{"barrier", 1}}));
  }
  testing::CallCounter counter;
  DistWrapper local(group_ptr(), /*use_dist=*/false);
  local.barrier();
  EXPECT_TRUE(counter.calls.empty());
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, ObjectCollectives) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // coordinator rank 1
  const int r = t.rank(), n = t.ranks();
  DistWrapper dist(t.group_ptr(), /*use_dist=*/true, /*coordinator_rank=*/1);
  EXPECT_EQ(dist.get_rank(), r);
  EXPECT_EQ(dist.get_world_size(), n);
  EXPECT_EQ(dist.is_coordinator(), r == 1);
  // Only the coordinator's object counts.
  EXPECT_EQ(dist.broadcast_object(std::optional<int>(100 + r)), 101);
  auto gathered = dist.gather_object(std::string(r + 1, 'a'));
  EXPECT_EQ(gathered.has_value(), r == 1);
  std::vector<std::string> strings;  // "a", "aa", ...
  std::vector<int> squares, list_of_n;
  for (int i : iota(n)) {
    strings.push_back(std::string(i + 1, 'a'));
    squares.push_back(i * i);
    list_of_n.push_back(10 + i);
  }
  if (gathered) EXPECT_EQ(*gathered, strings);
  EXPECT_EQ(dist.all_gather_object(r * r), squares);
  std::optional<std::vector<int>> list;
  if (r == 1) list = list_of_n;
  EXPECT_EQ(dist.scatter_object(list), 10 + r);
  // A group of nullptr is the default group.
  EXPECT_EQ(DistWrapper(nullptr, true, 0).all_gather_object(r).size(), static_cast<size_t>(n));
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, CoordinatorMistakesRaiseOnEveryRank) {
  const int r = t.rank(), n = t.ranks();
  const int coordinator = n - 1;  // the last rank
  const std::string who = "the coordinator (rank " + std::to_string(coordinator) + ")";
  DistWrapper dist(t.group_ptr(), true, coordinator);
  std::optional<std::vector<int>> one_short;
  if (r == coordinator) one_short = std::vector<int>(static_cast<size_t>(n - 1), 1);
  EXPECT_PRED2(contains, error_of([&] { dist.scatter_object(one_short); }),
               "DistWrapper.scatter_object: " + who + " passed " + std::to_string(n - 1) + " objects for " +
                   std::to_string(n) + " ranks");
  EXPECT_PRED2(contains, error_of([&] { dist.scatter_object<int>(std::nullopt); }), who + " passed no object list");
  EXPECT_PRED2(contains, error_of([&] { dist.broadcast_object<int>(std::nullopt); }),
               "DistWrapper.broadcast_object: " + who + " passed no object");
  EXPECT_PRED2(contains, error_of([&] { DistWrapper(t.group_ptr(), true, n); }),
               "DistWrapper: coordinator_rank=" + std::to_string(n) + " is not a rank of the");
  // The group is still usable.
  EXPECT_EQ(dist.all_gather_object(1).size(), static_cast<size_t>(n));
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, ReduceScatterGivesEachRankItsResult) {
  const int r = t.rank();
  DistWrapper dist(t.group_ptr(), true, 0);
  int calls = 0;
  int mine = dist.reduce_scatter(
      "plan", [&] { return r * 10; },
      [&](std::vector<int> all) {
        ++calls;
        const int total = std::accumulate(all.begin(), all.end(), 0);  // 10 * (0 + ... + n - 1)
        std::vector<int> out;
        for (size_t i = 0; i < all.size(); ++i) out.push_back(total + static_cast<int>(i));
        return out;
      });
  EXPECT_EQ(mine, 10 * (t.ranks() * (t.ranks() - 1) / 2) + r);
  EXPECT_EQ(calls, r == 0 ? 1 : 0);  // reduce runs on the coordinator only
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, ReduceScatterMapFailuresReachEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(4);  // ranks 1 and 3 fail differently
  const int r = t.rank();
  DistWrapper dist(t.group_ptr(), true, 0);
  bool reduced = false;
  auto e = checkpoint_error_of([&] {
    dist.reduce_scatter(
        "plan",
        [&] {
          if (r == 1) TORCH_CHECK(false, "no space on rank 1");
          if (r == 3) throw std::runtime_error("bad plan on rank 3");
          return r;
        },
        [&](std::vector<int> all) {
          reduced = true;
          return all;
        });
  });
  ASSERT_TRUE(e);
  EXPECT_FALSE(reduced);  // reduce does not run when a map failed
  EXPECT_EQ(e->step(), "plan");
  EXPECT_EQ(failing_ranks(*e), (std::vector<int>{1, 3}));
  EXPECT_EQ(e->failures().at(1).type, "c10::Error");
  EXPECT_PRED2(contains, e->failures().at(1).message, "no space on rank 1");
  EXPECT_EQ(e->failures().at(3).type, "std::runtime_error");
  EXPECT_PRED2(contains, e->what_without_backtrace(), "CheckpointException ranks:[1, 3] step: 'plan'");
  EXPECT_PRED2(contains, e->what_without_backtrace(), "(RANK 3) std::runtime_error: bad plan on rank 3");
  // The next step works: no rank was left behind in a collective.
  EXPECT_EQ(dist.all_gather("after", [&] { return r; }), iota(t.ranks()));
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, ReduceScatterReduceFailuresReachEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(3);  // coordinator rank 2
  DistWrapper dist(t.group_ptr(), true, 2);
  auto thrown = checkpoint_error_of([&] {
    dist.reduce_scatter(
        "plan", [] { return 1; },
        [](std::vector<int>) -> std::vector<int> { throw std::logic_error("cannot merge plans"); });
  });
  ASSERT_TRUE(thrown);
  EXPECT_EQ(failing_ranks(*thrown), std::vector<int>{2});
  EXPECT_EQ(thrown->failures().at(2).message, "cannot merge plans");
  // One result per rank is required.
  auto short_result = checkpoint_error_of([&] {
    dist.reduce_scatter(
        "plan", [] { return 1; }, [](std::vector<int> all) { return std::vector<int>(all.size() - 1, 0); });
  });
  ASSERT_TRUE(short_result);
  EXPECT_PRED2(contains, short_result->failures().at(2).message,
               "reduce_fun of step 'plan' returned " + std::to_string(t.ranks() - 1) + " results for " +
                   std::to_string(t.ranks()) + " ranks");
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, AllReduce) {
  const int r = t.rank();
  const int coordinator = t.ranks() - 1;  // the last rank
  DistWrapper dist(t.group_ptr(), true, coordinator);
  auto joined = dist.all_reduce(
      "metadata", [&] { return std::to_string(r); },
      [](std::vector<std::string> all) {
        std::string s;
        for (auto& a : all) s += a;
        return s;
      });
  std::string digits;
  for (int i : iota(t.ranks())) digits += std::to_string(i);
  EXPECT_EQ(joined, digits);  // "0123" on 4 ranks
  auto map_failed = checkpoint_error_of([&] {
    dist.all_reduce(
        "metadata",
        [&]() -> int {
          if (r == 0) throw std::invalid_argument("rank 0 has no metadata");
          return r;
        },
        [](std::vector<int> all) { return all.size(); });
  });
  ASSERT_TRUE(map_failed);
  EXPECT_EQ(failing_ranks(*map_failed), std::vector<int>{0});
  EXPECT_EQ(map_failed->failures().at(0).type, "std::invalid_argument");
  auto reduce_failed = checkpoint_error_of([&] {
    dist.all_reduce(
        "finish", [] { return 1; }, [](std::vector<int>) -> int { TORCH_CHECK(false, "finish failed"); });
  });
  ASSERT_TRUE(reduce_failed);
  EXPECT_EQ(reduce_failed->step(), "finish");
  EXPECT_EQ(failing_ranks(*reduce_failed), std::vector<int>{coordinator});
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, AllGatherAndBroadcast) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(3);  // coordinator 1, and even ranks 0 and 2 fail
  const int r = t.rank();
  DistWrapper dist(t.group_ptr(), true, 1);
  std::vector<std::vector<int>> sizes;  // {}, {1}, {2, 2}, {3, 3, 3}, ...
  std::vector<int> even;
  for (int i : iota(t.ranks())) {
    sizes.push_back(std::vector<int>(static_cast<size_t>(i), i));
    if (i % 2 == 0) even.push_back(i);
  }
  EXPECT_EQ(dist.all_gather("sizes", [&] { return std::vector<int>(r, r); }), sizes);
  auto e = checkpoint_error_of([&] {
    dist.all_gather("write", [&]() -> int {
      if (r % 2 == 0) throw std::runtime_error("write failed on " + std::to_string(r));
      return r;
    });
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), even);
  EXPECT_EQ(e->failures().at(2).message, "write failed on 2");
  int map_calls = 0;
  EXPECT_EQ(dist.broadcast("read_metadata",
                           [&] {
                             ++map_calls;
                             return std::string("meta of ") + std::to_string(r);
                           }),
            "meta of 1");
  EXPECT_EQ(map_calls, r == 1 ? 1 : 0);  // only the coordinator runs it
  auto b = checkpoint_error_of([&] {
    dist.broadcast("read_metadata", []() -> int { throw std::runtime_error("no .metadata file"); });
  });
  ASSERT_TRUE(b);
  EXPECT_EQ(failing_ranks(*b), std::vector<int>{1});
  EXPECT_EQ(b->failures().at(1).message, "no .metadata file");
}

// all_gather_unless_quiet (load's step): one all_reduce when every rank is quiet; otherwise the
// values (or the failures) of every rank reach every rank.
DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, AllGatherUnlessQuiet) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(4);  // ranks 1, 2 and 3 play parts
  const int r = t.rank();
  testing::CommCounter counting;
  DistWrapper dist(t.group_ptr(), /*use_dist=*/true, /*coordinator_rank=*/0);
  auto empty = [](const std::vector<int>& v) { return v.empty(); };
  int map_calls = 0;
  auto quiet = dist.all_gather_unless_quiet(
      "read",
      [&] {
        ++map_calls;
        return std::vector<int>{};
      },
      empty);
  EXPECT_FALSE(quiet.has_value());
  EXPECT_EQ(map_calls, 1);
  EXPECT_EQ(counting.counts(), (std::map<std::string, int64_t>{{funcol::all_reduce, 1}}));
  // One rank with something to say: every rank gets every value.
  counting.reset();
  auto loud = dist.all_gather_unless_quiet(
      "read", [&] { return r == 2 ? std::vector<int>{7} : std::vector<int>{}; }, empty);
  ASSERT_TRUE(loud.has_value());
  std::vector<std::vector<int>> only_rank_2(static_cast<size_t>(t.ranks()));
  only_rank_2[2] = {7};
  EXPECT_EQ(*loud, only_rank_2);
  EXPECT_EQ(counting.counts()[funcol::all_reduce], 1);
  EXPECT_GE(counting.counts()[funcol::all_gather_into_tensor], 1);
  // A rank's failure (in map_fun or in quiet) is raised on every rank, naming it.
  auto e = checkpoint_error_of([&] {
    dist.all_gather_unless_quiet(
        "read",
        [&]() -> std::vector<int> {
          if (r == 3) throw std::runtime_error("checksum mismatch on 3");
          return {};
        },
        empty);
  });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "read");
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{3});
  EXPECT_EQ(e->failures().at(3).message, "checksum mismatch on 3");
  auto q = checkpoint_error_of([&] {
    dist.all_gather_unless_quiet(
        "read", [&] { return std::vector<int>{r}; },
        [&](const std::vector<int>& v) -> bool {
          if (v[0] == 1) throw std::runtime_error("cannot tell");
          return true;
        });
  });
  ASSERT_TRUE(q);
  EXPECT_EQ(failing_ranks(*q), std::vector<int>{1});
  // Without a group: no collective.
  DistWrapper local(nullptr, /*use_dist=*/false);
  EXPECT_FALSE(local.all_gather_unless_quiet("read", [] { return std::vector<int>{}; }, empty).has_value());
  EXPECT_EQ(*local.all_gather_unless_quiet("read", [] { return std::vector<int>{1}; }, empty),
            (std::vector<std::vector<int>>{{1}}));
}

DTENSOR_TEST_BOTH(DistWrapperGloo, DistWrapperThreads, AllGatherKeysIsTheSortedUnion) {
  std::map<std::string, int> local{{"shared", 0}, {"only_" + std::to_string(t.rank()), 1}};
  if (t.rank() == t.ranks() - 1) local["a_first"] = 2;
  std::vector<std::string> expected{"a_first"};
  for (int i : iota(t.ranks())) expected.push_back("only_" + std::to_string(i));
  std::sort(expected.begin() + 1, expected.end());  // "only_10" sorts before "only_2"
  expected.push_back("shared");
  EXPECT_EQ(checkpoint::all_gather_keys(local, t.group_ptr()), expected);
}

// ---- MetadataIndex, file view, device info -------------------------------------------------------

TEST(MetadataIndex, EqualityAndHashIgnoreTheIndexHint) {
  using checkpoint::MetadataIndex;
  MetadataIndex a("fc.weight", {{4, 0}}, 1), b("fc.weight", {{4, 0}}), c("fc.weight"), d("fc.weight", {{0, 0}});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_EQ(std::unordered_set<MetadataIndex>({a, b, c, d}).size(), 3u);
  EXPECT_EQ(a.to_string(), "MetadataIndex(fqn='fc.weight', offset=[4, 0], index=1)");
  EXPECT_EQ(c.to_string(), "MetadataIndex(fqn='fc.weight', offset=None, index=None)");
}

TEST(FileView, ReadsAndSeeksInsideItsRange) {
  std::string data;
  for (int i = 0; i < 200; ++i) data.push_back(static_cast<char>(i));
  std::istringstream file(data);
  auto view = checkpoint::create_file_view(file, 50, 100);
  std::string got(10, '\0');
  view->read(got.data(), 10);
  EXPECT_EQ(got, data.substr(50, 10));
  EXPECT_EQ(view->tellg(), 10);
  view->seekg(-5, std::ios::end);  // 5 bytes before the end of the range
  EXPECT_EQ(view->tellg(), 95);
  std::string rest(20, '\0');
  view->read(rest.data(), 20);  // stops at the end of the range
  EXPECT_EQ(view->gcount(), 5);
  EXPECT_EQ(rest.substr(0, 5), data.substr(145, 5));
  EXPECT_TRUE(view->eof());
  view->clear();
  view->seekg(20);
  EXPECT_EQ(view->get(), 70);
  view->seekg(5, std::ios::cur);
  EXPECT_EQ(view->get(), 76);
  view->seekg(101);  // outside the range
  EXPECT_TRUE(view->fail());
  EXPECT_PRED2(contains, error_of([&] { checkpoint::create_file_view(file, -1, 3); }),
               "offset and length must be >= 0, got offset -1");
}

TEST(FileView, WorksOnAFileWhoseEndComesFirst) {
  const std::string path = ::testing::TempDir() + "dtensor_file_view_test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "0123456789";
  }
  std::ifstream file(path, std::ios::binary);
  auto view = checkpoint::create_file_view(file, 6, 100);  // the file ends after 4 bytes
  std::string all((std::istreambuf_iterator<char>(*view)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "6789");
  std::remove(path.c_str());
}

TEST(NormalizeDeviceInfo, CpuHasNoIndex) {
  EXPECT_EQ(checkpoint::normalize_device_info("cpu", 3), "cpu");
  EXPECT_EQ(checkpoint::normalize_device_info("cuda", 1), "cuda:1");
}

}  // namespace
}  // namespace dtensor
