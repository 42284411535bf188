// dtensor/checkpoint/save_load.h: plan_save and plan_load, as 4 ranks (gloo processes and
// threads). The references are real: the metadata the real save commits, the files it writes,
// and each real rank's own plan, which rank r of a fake world (comm::FakeGroup, on meta
// tensors) must reproduce exactly without the other ranks.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/comm.h"
#include "dtensor/comm/fake_group.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"
#include "suites/testing/shared_dir.h"
#include "suites/testing/state_dict_checks.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>

namespace dtensor {
namespace {

namespace fs = std::filesystem;
using checkpoint::LoadOptions;
using checkpoint::PlannedLoad;
using checkpoint::PlannedSave;
using checkpoint::SaveOptions;
using checkpoint::StateDict;
using sharded::ChunkShardingSpec;
using sharded::RemoteDevice;
using testing::contains;

DTENSOR_RANK_FIXTURES(CheckpointPlanGloo, CheckpointPlanThreads);

std::vector<RemoteDevice> cpu_ranks(int n) {
  std::vector<RemoteDevice> out;
  for (int r = 0; r < n; ++r) out.emplace_back("rank:" + std::to_string(r) + "/cpu");
  return out;
}

// Every kind of value save takes, its DTensors on `mesh1` (1-D) and `mesh2` (2-D) and its
// plain tensors on `device`: uneven shards, a Partial DTensor, a 0-dim and an empty tensor, a
// ShardedTensor (on CPU over `group`), objects.
StateDict every_kind(const DeviceMesh& mesh1, const DeviceMesh& mesh2, const comm::GroupPtr& group, c10::Device device) {
  const auto on = at::TensorOptions().device(device);
  const int n = group->size();
  return StateDict{
      {"plain", at::zeros({2, 3}, on)},
      {"dt_rows", dtensor::zeros({7, 5}, mesh1, {Shard{0}})},
      {"dt_2d", dtensor::zeros({7, 5}, mesh2, {Shard{1}, Shard{0}})},
      {"dt_2d_rep", dtensor::zeros({6, 4}, mesh2, {Replicate{}, Shard{1}}, at::kBFloat16)},
      {"dt_partial", from_local(at::ones({3}, on), mesh1, {Partial{}})},
      {"st", sharded::shard_tensor(at::zeros({10, 2}, at::kDouble), ChunkShardingSpec(0, cpu_ranks(n)), 0, group)},
      {"scalar", at::zeros({}, on.dtype(at::kDouble))},
      {"empty", at::empty({0, 3}, on)},
      {"dt_empty", dtensor::zeros({0, 4}, mesh1, {Shard{1}})},
      {"step", c10::IValue(int64_t(42))},
      {"name", c10::IValue(std::string("hello"))},
  };
}

nlohmann::json json_of(const checkpoint::SavePlan& p) { return p; }
nlohmann::json json_of(const checkpoint::Metadata& m) { return m; }

std::string reads_string(const PlannedLoad& l) {
  std::ostringstream os;
  for (const auto& r : l.reads) os << r.fqn << " " << r.box.to_string() << " " << r.file << " " << r.bytes << "\n";
  for (const auto& o : l.objects) os << "object " << o << "\n";
  return os.str();
}

DTENSOR_TEST_BOTH(CheckpointPlanGloo, CheckpointPlanThreads, AFakeRankPlansWhatTheRealRankSavesAndLoads) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  testing::SharedDir dir(t.group());
  const int n = t.ranks();
  const std::vector<int64_t> shape2 = t.mesh_shape_2d();
  auto mesh1 = init_device_mesh(t.device_type(), {n}, {}, t.group_ptr());
  auto mesh2 = init_device_mesh(t.device_type(), shape2, {}, t.group_ptr());
  const StateDict sd = every_kind(mesh1, mesh2, t.group_ptr(), c10::kCPU);

  SaveOptions real_opts;
  real_opts.process_group = t.group_ptr();
  const PlannedSave real = checkpoint::plan_save(sd, real_opts);

  // This rank of a fake world of n, its DTensors on a meta mesh: no other rank, no data.
  auto fake_world = std::make_shared<comm::FakeGroup>(t.rank(), n);
  auto fake1 = init_device_mesh("meta", {n}, {}, fake_world);
  auto fake2 = init_device_mesh("meta", shape2, {}, fake_world);
  const StateDict fake_sd = every_kind(fake1, fake2, fake_world, c10::kMeta);
  EXPECT_TRUE(local_tensor(std::get<at::Tensor>(fake_sd.at("dt_2d"))).is_meta());
  SaveOptions fake_opts;
  fake_opts.process_group = fake_world;
  const PlannedSave fake = checkpoint::plan_save(fake_sd, fake_opts);
  EXPECT_EQ(json_of(fake.plan), json_of(real.plan)) << "rank " << t.rank();
  EXPECT_EQ(fake.bytes_per_rank, real.bytes_per_rank);
  EXPECT_EQ(json_of(fake.metadata), json_of(real.metadata));

  // The real save writes what was planned: the same chunks, files and byte ranges (and, beside
  // them, the checksums a plan has no bytes for), and each rank's file has its planned size.
  const checkpoint::Metadata saved = checkpoint::save(sd, dir.sub("ckpt"), real_opts);
  checkpoint::Metadata without_checksums = saved;
  for (auto& [fqn, e] : without_checksums.entries) {
    for (auto& c : e.chunks) c.crc32.clear();
  }
  EXPECT_EQ(json_of(real.metadata), json_of(without_checksums));
  EXPECT_FALSE(real.metadata.checksummed);
  ASSERT_EQ(int(real.bytes_per_rank.size()), n);
  int64_t written = 0;
  for (int r = 0; r < n; ++r) {
    const fs::path file = fs::path(dir.sub("ckpt")) / ("__" + std::to_string(r) + "_1.distcp");
    const int64_t on_disk = fs::exists(file) ? int64_t(fs::file_size(file)) : 0;
    EXPECT_EQ(real.bytes_per_rank[size_t(r)], on_disk) << file;
    written += on_disk;
  }
  EXPECT_EQ(written, saved.total_bytes());
  // Rows of "dt_rows" are written by the rank holding them; replicated keys once.
  EXPECT_EQ(real.metadata.entries.at("plain").chunks.size(), 1u);
  EXPECT_EQ(real.metadata.entries.at("dt_partial").chunks.size(), 1u);

  // Load into other layouts (columns for rows; the 2-D key resharded onto the 1-D mesh; None
  // placeholders take whole tensors): the fake rank plans the real rank's reads, and each
  // destination's reads tile its local shard.
  auto dest_of = [&](const DeviceMesh& m1, const DeviceMesh& m2, c10::Device device) {
    StateDict d = every_kind(m1, m2, m1.world(), device);
    d["dt_rows"] = dtensor::zeros({7, 5}, m1, {Shard{1}});
    d["dt_2d"] = dtensor::zeros({7, 5}, m2, {Shard{0}, Replicate{}});
    d["dt_partial"] = dtensor::zeros({3}, m1, {Replicate{}});
    d["plain"] = c10::IValue();
    return d;
  };
  StateDict real_dest = dest_of(mesh1, mesh2, c10::kCPU);
  const PlannedLoad real_load = checkpoint::plan_load(real_dest, saved);
  const PlannedLoad fake_load = checkpoint::plan_load(dest_of(fake1, fake2, c10::kMeta), fake.metadata);
  EXPECT_EQ(reads_string(fake_load), reads_string(real_load));
  EXPECT_EQ(fake_load.bytes, real_load.bytes);
  std::map<std::string, int64_t> read_bytes;
  for (const auto& r : real_load.reads) read_bytes[r.fqn] += r.bytes;
  auto local_bytes = [&](const std::string& fqn) {
    const at::Tensor& v = std::get<at::Tensor>(real_dest.at(fqn));
    const at::Tensor l = is_dtensor(v) ? local_tensor(v) : v;
    return int64_t(l.numel()) * int64_t(l.element_size());
  };
  for (const char* fqn : {"dt_rows", "dt_2d", "dt_2d_rep", "dt_partial", "scalar"}) {
    EXPECT_EQ(read_bytes[fqn], local_bytes(fqn)) << fqn << "\n" << reads_string(real_load);
  }
  EXPECT_EQ(read_bytes["plain"], 2 * 3 * 4);  // the None placeholder: the whole tensor
  EXPECT_EQ(real_load.objects, (std::vector<std::string>{"name", "step"}));
  checkpoint::load(real_dest, dir.sub("ckpt"), LoadOptions{t.group_ptr()});
  EXPECT_EQ(std::get<at::Tensor>(real_dest.at("plain")).sizes(), at::IntArrayRef({2, 3}));
}

DTENSOR_TEST_BOTH(CheckpointPlanGloo, CheckpointPlanThreads, PlanningErrorsAreSavesAndLoads) {
  const int n = t.ranks();
  auto mesh = init_device_mesh(t.device_type(), {n}, {}, t.group_ptr());
  SaveOptions o;
  o.process_group = t.group_ptr();
  // Ranks that disagree on a key's size: every rank raises, naming the key and the ranks.
  StateDict bad{{"w", dtensor::zeros({t.rank() == 0 ? 5 : 6, 2}, mesh, {Shard{0}})}};
  const std::string e = testing::error_of([&] { checkpoint::plan_save(bad, o); });
  EXPECT_TRUE(contains(e, "key 'w' has global size [5, 2] on rank 0 but [6, 2] on rank 1")) << e;
  // A load plan checks keys, dtypes and shapes as load does.
  StateDict sd{{"w", dtensor::zeros({8, 2}, mesh, {Shard{0}})}, {"step", c10::IValue(int64_t(1))}};
  const checkpoint::Metadata m = checkpoint::plan_save(sd, o).metadata;
  StateDict wrong{{"w", dtensor::zeros({8, 3}, mesh, {Shard{0}})}, {"extra", at::zeros({1})}};
  const std::string le = testing::error_of([&] { checkpoint::plan_load(wrong, m); });
  EXPECT_TRUE(contains(le, "missing from the checkpoint: ['extra']")) << le;
  LoadOptions lax;
  lax.strict = false;
  const std::string shape_error = testing::error_of([&] { checkpoint::plan_load(wrong, m, lax); });
  EXPECT_TRUE(contains(shape_error, "key 'w' has shape [8, 3] in the state dict but [8, 2] in the checkpoint"))
      << shape_error;
  StateDict fewer{{"w", dtensor::zeros({8, 2}, mesh, {Shard{1}})}};
  const PlannedLoad l = checkpoint::plan_load(fewer, m, lax);
  EXPECT_EQ(l.keys.unexpected_keys, (std::vector<std::string>{"step"}));
  EXPECT_TRUE(l.objects.empty());
}

TEST(CheckpointPlan, SavingFromAFakeWorldNamesPlanSave) {
  auto world = std::make_shared<comm::FakeGroup>(3, 8);
  auto mesh = init_device_mesh("meta", {8}, {}, world);
  StateDict sd{{"w", dtensor::zeros({16, 4}, mesh, {Shard{0}})}};
  SaveOptions o;
  o.process_group = world;
  testing::TempDir tmp;
  const std::string e = testing::error_of([&] { checkpoint::save(sd, tmp.path(), o); });
  EXPECT_TRUE(contains(e, "checkpoint::save: the process group is a fake world (backend 'fake', rank 3 of 8)")) << e;
  EXPECT_TRUE(contains(e, "checkpoint::plan_save plans the save")) << e;
  EXPECT_TRUE(fs::is_empty(tmp.path()));
  const std::string ae = testing::error_of([&] { checkpoint::async_save(sd, tmp.path(), o).get(); });
  EXPECT_TRUE(contains(ae, "checkpoint::async_save: the process group is a fake world")) << ae;
  // The plan: 8 row blocks of 2 rows, one per rank, rank 3's in its own file.
  const PlannedSave p = checkpoint::plan_save(sd, o);
  ASSERT_EQ(p.plan.items.size(), 1u);
  EXPECT_EQ(p.plan.items[0].chunk.to_string(), "offsets=[6, 0] sizes=[2, 4]");
  EXPECT_EQ(p.bytes_per_rank, std::vector<int64_t>(8, 2 * 4 * 4));
  EXPECT_EQ(p.metadata.entries.at("w").chunks.size(), 8u);
  EXPECT_EQ(p.metadata.entries.at("w").chunks[3].file, "__3_1.distcp");
  o.format = checkpoint::CheckpointFormat::kHuggingFace;
  const std::string fe = testing::error_of([&] { checkpoint::plan_save(sd, o); });
  EXPECT_TRUE(contains(fe, "plan_save plans the dtensor-cpp format")) << fe;
}

TEST(CheckpointPlan, OverlapsAreFoundAmongThousandsOfShards) {
  // A key split into 20000 row blocks (FSDP's shards on a large world) validates; one block
  // that overlaps a distant one is named.
  std::vector<checkpoint::SavePlan> plans(20000);
  for (int r = 0; r < 20000; ++r) {
    checkpoint::WriteItem w;
    w.fqn = "w";
    w.dtype = "float32";
    w.global_size = {40000, 2};
    w.chunk = {{2 * int64_t(r), 0}, {2, 2}};
    w.nbytes = 16;
    plans[size_t(r)].items.push_back(w);
  }
  EXPECT_EQ(checkpoint::create_global_save_plan(plans)[7].items.at(0).chunk.to_string(), "offsets=[14, 0] sizes=[2, 2]");
  // Rank 0 offers rows [0, 30000) of column 0, which overlap the blocks of ranks 1 to 14999.
  plans[0].items[0].chunk = {{0, 0}, {30000, 1}};
  const std::string e = testing::error_of([&] { checkpoint::create_global_save_plan(plans); });
  EXPECT_TRUE(contains(e, "key 'w': chunks offsets=[0, 0] sizes=[30000, 1] and offsets=[2, 0] sizes=[2, 2] overlap"))
      << e;
}

}  // namespace
}  // namespace dtensor
