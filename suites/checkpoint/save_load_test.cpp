// dtensor/checkpoint/save_load.h: distributed checkpoint save and load as 4 ranks (gloo
// processes and threads): every kind of value, the resharding matrix (every placement on 1-D
// and 2-D meshes and ShardedTensors, loaded into every other), other world sizes, and faults
// (a rank that cannot write, truncated and corrupted files, missing files, key, shape and
// dtype mismatches, a process killed in the middle of a save), each asserted on every rank.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/comm.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/checkpoint_errors.h"
#include "suites/testing/child_process.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"
#include "suites/testing/shared_dir.h"
#include "suites/testing/state_dict_checks.h"

#include <ATen/ATen.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

namespace fs = std::filesystem;
using checkpoint::CheckpointException;
using checkpoint::LoadOptions;
using checkpoint::SaveOptions;
using checkpoint::StateDict;
using sharded::ChunkShardingSpec;
using sharded::RemoteDevice;
using sharded::ShardedTensor;
using testing::contains;
using testing::expect_holds;

DTENSOR_RANK_FIXTURES(CheckpointGloo, CheckpointThreads);

using testing::SharedDir;  // suites/testing/shared_dir.h

using testing::checkpoint_error_of;
using testing::failing_ranks;

std::vector<RemoteDevice> cpu_ranks(int n) {
  std::vector<RemoteDevice> out;
  for (int r = 0; r < n; ++r) out.emplace_back("rank:" + std::to_string(r) + "/cpu");
  return out;
}

at::Tensor& tensor_at(StateDict& sd, const std::string& key) { return std::get<at::Tensor>(sd.at(key)); }

// 0, 1, ..., n - 1 (every rank).
std::vector<int> all_ranks(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// How many non-empty pieces Shard splits `size` into over `n` ranks (torch.chunk's count).
int64_t pieces(int64_t size, int64_t n) { return static_cast<int64_t>(at::arange(size).chunk(n).size()); }

// ---- every kind of value ------------------------------------------------------------------------

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, SavesAndLoadsEveryKindOfValue) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  SharedDir dir(t.group());
  const int n = t.ranks();
  auto mesh1 = init_device_mesh(t.device_type(), {n});
  auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  at::Tensor m75 = at::arange(35, at::kFloat).view({7, 5});
  at::Tensor m102 = at::arange(20, at::kDouble).view({10, 2});
  c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get());
  inner.insert("k", std::string("v"));
  c10::impl::GenericDict nested(c10::StringType::get(), c10::AnyType::get());
  nested.insert("lr", 0.1);
  nested.insert("betas", c10::List<double>({0.9, 0.99}));
  nested.insert("inner", inner);
  const std::string bytes("\x00\xff\x01binary\x80", 10);

  StateDict sd{
      {"plain", at::arange(6, at::kFloat).view({2, 3})},
      {"dt_rows", distribute_tensor(m75, mesh1, {Shard{0}})},
      {"dt_2d", distribute_tensor(m75, mesh2, {Shard{1}, Shard{0}})},
      {"dt_partial", from_local(at::full({3}, float(t.rank() + 1)), mesh1, {Partial{}})},
      {"st", sharded::shard_tensor(m102, ChunkShardingSpec(0, cpu_ranks(n)))},
      {"scalar", at::scalar_tensor(3.5, at::kDouble)},
      {"bf16", at::arange(8, at::kBFloat16)},
      {"empty", at::empty({0, 3})},
      {"step", c10::IValue(int64_t(42))},
      {"name", c10::IValue(std::string("hello"))},
      {"bytes", c10::IValue(bytes)},
      {"nested", c10::IValue(nested)},
  };
  auto meta = checkpoint::save(sd, dir.sub("ckpt"));
  EXPECT_EQ(meta.entries.size(), sd.size());
  // One chunk per non-empty box (7 rows over n; 5 columns over n / 2 times 7 rows over 2).
  EXPECT_EQ(int64_t(meta.entries.at("dt_rows").chunks.size()), pieces(7, n));
  EXPECT_EQ(int64_t(meta.entries.at("dt_2d").chunks.size()), pieces(5, n / 2) * pieces(7, 2));
  EXPECT_EQ(meta.entries.at("plain").chunks.size(), 1u);  // replicated: written once
  EXPECT_EQ(meta.entries.at("dt_partial").chunks.size(), 1u);
  EXPECT_EQ(meta.entries.at("empty").chunks.size(), 1u);
  EXPECT_EQ(meta.world_size, n);
  EXPECT_EQ(meta.save_id, 1);
  EXPECT_EQ(checkpoint::read_metadata(dir.sub("ckpt")).total_bytes(), meta.total_bytes());

  StateDict dest{
      {"plain", at::zeros({2, 3})},
      {"dt_rows", dtensor::zeros({7, 5}, mesh1, {Shard{0}})},
      {"dt_2d", dtensor::zeros({7, 5}, mesh2, {Shard{1}, Shard{0}})},
      {"dt_partial", dtensor::zeros({3}, mesh1, {Replicate{}})},
      {"st", sharded::shard_tensor(at::zeros({10, 2}, at::kDouble), ChunkShardingSpec(0, cpu_ranks(n)))},
      {"scalar", at::scalar_tensor(0.0, at::kDouble)},
      {"bf16", at::zeros({8}, at::kBFloat16)},
      {"empty", at::empty({0, 3})},
      {"step", c10::IValue()},
      {"name", c10::IValue()},
      {"bytes", c10::IValue()},
      {"nested", c10::IValue()},
  };
  auto res = checkpoint::load(dest, dir.sub("ckpt"));
  EXPECT_TRUE(res.missing_keys.empty());
  EXPECT_TRUE(res.unexpected_keys.empty());
  expect_holds(dest.at("plain"), at::arange(6, at::kFloat).view({2, 3}), "plain");
  expect_holds(dest.at("dt_rows"), m75, "dt_rows");
  expect_holds(dest.at("dt_2d"), m75, "dt_2d");
  expect_holds(dest.at("dt_partial"), at::full({3}, float(n * (n + 1) / 2)), "dt_partial");  // 1 + ... + n
  expect_holds(dest.at("st"), m102, "st");
  EXPECT_EQ(tensor_at(dest, "scalar").item<double>(), 3.5);
  EXPECT_TRUE(at::equal(tensor_at(dest, "bf16"), at::arange(8, at::kBFloat16)));
  EXPECT_EQ(std::get<c10::IValue>(dest.at("step")).toInt(), 42);
  EXPECT_EQ(std::get<c10::IValue>(dest.at("name")).toStringRef(), "hello");
  EXPECT_EQ(std::get<c10::IValue>(dest.at("bytes")).toStringRef(), bytes);
  auto got = std::get<c10::IValue>(dest.at("nested")).toGenericDict();
  EXPECT_EQ(got.at("lr").toDouble(), 0.1);
  EXPECT_EQ(got.at("betas").toDoubleVector(), (std::vector<double>{0.9, 0.99}));
  EXPECT_EQ(got.at("inner").toGenericDict().at("k").toStringRef(), "v");
  // A load with nothing to report takes one collective: the all_reduce telling every rank that
  // no rank failed (the keys, dtypes and shapes matched everywhere).
  testing::CommCounter counting;
  LoadOptions counted;
  counted.process_group = t.group_ptr();
  checkpoint::load(dest, dir.sub("ckpt"), counted);
  EXPECT_EQ(counting.counts(), (std::map<std::string, int64_t>{{funcol::all_reduce, 1}}));
  expect_holds(dest.at("dt_2d"), m75, "dt_2d (second load)");

  // A None placeholder receives the whole tensor, whatever layout saved it.
  StateDict whole{{"dt_2d", c10::IValue()}, {"st", c10::IValue()}};
  auto partial_res = checkpoint::load(whole, dir.sub("ckpt"), LoadOptions{nullptr, false, 0, /*strict=*/false});
  expect_holds(whole.at("dt_2d"), m75, "whole dt_2d");
  expect_holds(whole.at("st"), m102, "whole st");
  EXPECT_EQ(partial_res.unexpected_keys.size(), sd.size() - 2);

  // A second save into the same directory replaces the first and removes its files.
  sd["step"] = c10::IValue(int64_t(43));
  auto meta2 = checkpoint::save(sd, dir.sub("ckpt"));
  EXPECT_EQ(meta2.save_id, 2);
  t.group().barrier();
  for (const auto& e : fs::directory_iterator(dir.sub("ckpt"))) {
    std::string name = e.path().filename().string();
    EXPECT_TRUE(name == ".metadata" || name.find("_2.distcp") != std::string::npos) << name;
  }
}

// ---- the resharding matrix ----------------------------------------------------------------------

// How a tensor is laid out: a DTensor on the 1-D or the 2-D mesh, or a ShardedTensor.
struct Layout {
  std::string name;
  int mesh = 1;  // 1: mesh of n, 2: mesh of (n / 2)x2, 0: ShardedTensor chunked on `st_dim`
  std::vector<Placement> placements;
  int64_t st_dim = 0;
};

std::vector<Layout> all_layouts() {
  std::vector<Layout> out;
  std::vector<std::pair<std::string, Placement>> ps = {{"S0", Shard{0}}, {"S1", Shard{1}}, {"R", Replicate{}}};
  for (const auto& [n, p] : ps) out.push_back({"1d(" + n + ")", 1, {p}});
  for (const auto& [n0, p0] : ps) {
    for (const auto& [n1, p1] : ps) out.push_back({"2d(" + n0 + "," + n1 + ")", 2, {p0, p1}});
  }
  // FSDP x TP's layouts: dim 0 (1) split over tp first, each tp piece over dp (_StridedShard).
  out.push_back({"2d(SS0,S0)", 2, {StridedShard(0, 2), Shard{0}}});
  out.push_back({"2d(SS1,S1)", 2, {StridedShard(1, 2), Shard{1}}});
  out.push_back({"st(0)", 0, {}, 0});
  out.push_back({"st(1)", 0, {}, 1});
  return out;
}

checkpoint::StateDictValue make(const Layout& l, const at::Tensor& full, const DeviceMesh& mesh1,
                                const DeviceMesh& mesh2) {
  if (l.mesh == 0) return sharded::shard_tensor(full, ChunkShardingSpec(l.st_dim, cpu_ranks(int(mesh1.size()))));
  return distribute_tensor(full, l.mesh == 1 ? mesh1 : mesh2, l.placements);
}

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, ReshardsEveryLayoutIntoEveryOther) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  SharedDir dir(t.group());
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  const auto layouts = all_layouts();
  for (const auto& shape : std::vector<std::vector<int64_t>>{{4, 4}, {7, 5}}) {
    const std::string tag = std::to_string(shape[0]) + "x" + std::to_string(shape[1]);
    at::Tensor full = at::arange(shape[0] * shape[1], at::kFloat).view(shape);
    // One checkpoint holding the tensor in every layout...
    StateDict sd;
    for (const auto& l : layouts) sd[l.name] = make(l, full, mesh1, mesh2);
    checkpoint::save(sd, dir.sub(tag));
    // ... loaded into each layout in turn.
    for (const auto& to : layouts) {
      StateDict dest;
      for (const auto& from : layouts) dest[from.name] = make(to, at::zeros(shape), mesh1, mesh2);
      checkpoint::load(dest, dir.sub(tag));
      for (const auto& from : layouts) expect_holds(dest.at(from.name), full, tag + " " + from.name + " -> " + to.name);
    }
  }
}

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, LoadsIntoOtherWorldSizes) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  SharedDir dir(t.group());
  at::Tensor a = at::arange(35, at::kFloat).view({7, 5});
  at::Tensor b = at::arange(12, at::kLong);
  {
    // Saved at n ranks on a (n / 2)x2 mesh...
    auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
    StateDict sd{{"a", distribute_tensor(a, mesh2, {Shard{0}, Shard{1}})},
                 {"b", distribute_tensor(b, mesh2, {Replicate{}, Shard{0}})},
                 {"step", c10::IValue(int64_t(7))}};
    checkpoint::save(sd, dir.sub("at4"));
  }
  // ... loaded at 2 ranks (a group of ranks 0 and 1, 1-D mesh) ...
  comm::GroupPtr pair = comm::new_group({0, 1});
  if (pair) {
    auto mesh = init_device_mesh(t.device_type(), {2}, {}, pair);
    StateDict dest{{"a", dtensor::zeros({7, 5}, mesh, {Shard{1}})},
                   {"b", dtensor::zeros({12}, mesh, {Shard{0}}, at::kLong)},
                   {"step", c10::IValue()}};
    LoadOptions opts;
    opts.process_group = pair;
    checkpoint::load(dest, dir.sub("at4"), opts);
    expect_holds(dest.at("a"), a, "4 -> 2: a");
    expect_holds(dest.at("b"), b, "4 -> 2: b");
    EXPECT_EQ(std::get<c10::IValue>(dest.at("step")).toInt(), 7);
  }
  // ... and at 1 rank without a process group.
  if (t.rank() == 0) {
    StateDict dest{{"a", at::zeros({7, 5})}, {"b", c10::IValue()}, {"step", c10::IValue()}};
    LoadOptions opts;
    opts.no_dist = true;
    checkpoint::load(dest, dir.sub("at4"), opts);
    expect_holds(dest.at("a"), a, "4 -> 1: a");
    expect_holds(dest.at("b"), b, "4 -> 1: b");
    // 1 -> 4: saved by one process ...
    SaveOptions sopts;
    sopts.no_dist = true;
    StateDict one{{"a", a}, {"b", b}};
    auto meta = checkpoint::save(one, dir.sub("at1"), sopts);
    EXPECT_EQ(meta.world_size, 1);
  }
  t.group().barrier();
  // ... loaded by n ranks.
  auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  StateDict dest{{"a", dtensor::zeros({7, 5}, mesh2, {Shard{1}, Shard{1}})},
                 {"b", dtensor::zeros({12}, mesh2, {Shard{0}, Replicate{}}, at::kLong)}};
  checkpoint::load(dest, dir.sub("at1"));
  expect_holds(dest.at("a"), a, "1 -> 4: a");
  expect_holds(dest.at("b"), b, "1 -> 4: b");
}

// ---- faults -------------------------------------------------------------------------------------

// The state dict of the fault tests: "w" in rows over the ranks (2 rows each: rank r's start at
// row 2r), a replicated "b", an object.
int64_t w_rows(const DeviceMesh& mesh) { return 2 * mesh.size(); }
StateDict fault_state(const DeviceMesh& mesh, float v) {
  return StateDict{{"w", distribute_tensor(at::full({w_rows(mesh), 4}, v), mesh, {Shard{0}})},
                   {"b", at::full({4}, v)},
                   {"step", c10::IValue(int64_t(v))}};
}
StateDict fault_dest(const DeviceMesh& mesh, std::vector<Placement> w_placements = {Shard{0}}) {
  return StateDict{{"w", dtensor::zeros({w_rows(mesh), 4}, mesh, std::move(w_placements))},
                   {"b", at::zeros({4})},
                   {"step", c10::IValue()}};
}
void expect_fault_state(const StateDict& sd, float v) {
  const auto& w = std::get<at::Tensor>(sd.at("w"));
  expect_holds(sd.at("w"), at::full({w.size(0), 4}, v), "w");
  expect_holds(sd.at("b"), at::full({4}, v), "b");
  EXPECT_EQ(std::get<c10::IValue>(sd.at("step")).toInt(), int64_t(v));
}

// The data file holding the chunk of `key` at row `row`.
std::string file_of(const std::string& dir, const std::string& key, int64_t row) {
  auto m = checkpoint::read_metadata(dir);
  for (const auto& c : m.entries.at(key).chunks) {
    if (c.chunk.offsets.at(0) == row) return (fs::path(dir) / c.file).string();
  }
  ADD_FAILURE() << "no chunk of " << key << " at row " << row;
  return "";
}

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, ARankThatCannotWriteFailsEveryRankAndKeepsThePreviousSave) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(3);  // rank 2 fails
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const std::string ckpt = dir.sub("ckpt");
  checkpoint::save(fault_state(mesh, 1), ckpt);
  // Rank 2's next data file cannot be created: a directory is in its way.
  if (t.rank() == 0) fs::create_directory(fs::path(ckpt) / "__2_2.distcp");
  t.group().barrier();
  auto e = checkpoint_error_of([&] { checkpoint::save(fault_state(mesh, 2), ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "write");
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{2});
  EXPECT_PRED2(contains, e->what_without_backtrace(), "(RANK 2) c10::Error: cannot create data file '");
  EXPECT_PRED2(contains, e->what_without_backtrace(), "__2_2.distcp': a directory is in its way");
  // The previous checkpoint is intact.
  auto sd = fault_dest(mesh);
  checkpoint::load(sd, ckpt);
  expect_fault_state(sd, 1);
  EXPECT_EQ(checkpoint::read_metadata(ckpt).save_id, 1);
}

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, CorruptedTruncatedAndMissingFilesFailEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(3);  // rank 2's rows are corrupted
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const std::vector<int> everyone = all_ranks(t.ranks());
  const std::string ckpt = dir.sub("ckpt");
  checkpoint::save(fault_state(mesh, 3), ckpt);
  const std::string rows4 = file_of(ckpt, "w", 4);  // rank 2's rows, read by rank 2 only

  // One byte flipped: only rank 2 reads it, every rank raises naming rank 2.
  std::string original = testing::read_file(rows4);
  if (t.rank() == 0) {
    std::string flipped = original;
    auto m = checkpoint::read_metadata(ckpt);
    for (const auto& c : m.entries.at("w").chunks) {
      if (c.chunk.offsets[0] == 4) flipped[size_t(c.offset + 5)] ^= 0x10;
    }
    std::ofstream(rows4, std::ios::binary | std::ios::trunc) << flipped;
  }
  t.group().barrier();
  auto sd = fault_dest(mesh);
  auto e = checkpoint_error_of([&] { checkpoint::load(sd, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "read");
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{2});
  EXPECT_PRED2(contains, e->what_without_backtrace(), "(RANK 2) c10::Error: checksum mismatch in data file '" + rows4 +
                                                          "': key 'w' (chunk offsets=[4, 0] sizes=[2, 4])");
  // Loaded into Replicate, every rank reads those rows and fails.
  auto rep = fault_dest(mesh, {Replicate{}});
  e = checkpoint_error_of([&] { checkpoint::load(rep, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), everyone);
  // LoadOptions::verify_checksums = false reads without checking: the load succeeds, rank 2's
  // rows hold the flipped element.
  LoadOptions unchecked;
  unchecked.verify_checksums = false;
  auto unverified = fault_dest(mesh);
  checkpoint::load(unverified, ckpt, unchecked);
  const at::Tensor mine = local_tensor(std::get<at::Tensor>(unverified.at("w")));
  EXPECT_EQ((mine != 3.0f).sum().item<int64_t>(), t.rank() == 2 ? 1 : 0);
  t.group().barrier();

  // Truncated.
  if (t.rank() == 0) fs::resize_file(rows4, original.size() / 2);
  t.group().barrier();
  e = checkpoint_error_of([&] { checkpoint::load(rep, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), everyone);
  EXPECT_PRED2(contains, e->what_without_backtrace(), "data file '" + rows4 + "' is truncated: key 'w'");
  t.group().barrier();

  // Missing data file.
  if (t.rank() == 0) fs::remove(rows4);
  t.group().barrier();
  e = checkpoint_error_of([&] { checkpoint::load(rep, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), everyone);
  EXPECT_PRED2(contains, e->what_without_backtrace(),
               "cannot open data file '" + rows4 + "' (key 'w'): No such file or directory");
  t.group().barrier();

  // Missing metadata: no rank can read it; every rank raises naming every rank.
  if (t.rank() == 0) fs::remove(fs::path(ckpt) / ".metadata");
  t.group().barrier();
  e = checkpoint_error_of([&] { checkpoint::load(rep, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "read");
  EXPECT_EQ(failing_ranks(*e), everyone);
  EXPECT_PRED2(contains, e->what_without_backtrace(), "no checkpoint in '" + ckpt + "'");
}

// Checksum blocks smaller than the chunks (2 rows each here): a load into another row split
// reads the whole blocks of a shard straight into it and the blocks it needs only part of (at
// its edges) through a buffer, checking every block it touches. A flipped byte fails each rank
// that reads any part of its block, even one that does not need that byte.
DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, SmallChecksumBlocksAreCheckedAtShardEdges) {
  // The row splits and the ranks that meet a block's edge are worked out for 4 ranks.
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);
  SharedDir dir(t.group());
  auto mesh1 = init_device_mesh(t.device_type(), {t.ranks()});
  auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d());
  const std::string ckpt = dir.sub("ckpt");
  const at::Tensor full = at::arange(62 * 4, at::kFloat).view({62, 4});  // 16 bytes per row
  SaveOptions so;
  so.checksum_block_bytes = 32;
  // Saved rows [0, 16) [16, 32) [32, 48) [48, 62).
  checkpoint::save(StateDict{{"w", distribute_tensor(full, mesh1, {Shard{0}})}}, ckpt, so);
  // Loaded rows [0, 16) [16, 31) [31, 47) [47, 62): rank 1 ends and rank 2 starts mid-block.
  StateDict rows{{"w", dtensor::zeros({62, 4}, mesh2, {Shard{0}, Shard{0}})}};
  checkpoint::load(rows, ckpt);
  expect_holds(rows.at("w"), full, "rows");
  StateDict cols{{"w", dtensor::zeros({62, 4}, mesh1, {Shard{1}})}};
  checkpoint::load(cols, ckpt);
  expect_holds(cols.at("w"), full, "cols");

  // Flip a byte of row 30 (the block of rows 30-31): rank 1 needs it, rank 2 reads the block
  // for row 31 only; both fail, ranks 0 and 3 do not.
  const std::string path = file_of(ckpt, "w", 16);
  if (t.rank() == 0) {
    std::string bytes = testing::read_file(path);
    const auto m = checkpoint::read_metadata(ckpt);
    for (const auto& c : m.entries.at("w").chunks) {
      if (c.chunk.offsets[0] == 16) bytes[size_t(c.offset + 14 * 16 + 3)] ^= 0x01;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  t.group().barrier();
  auto e = checkpoint_error_of([&] { checkpoint::load(rows, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), (std::vector<int>{1, 2}));
  EXPECT_PRED2(contains, e->what_without_backtrace(), "(RANK 2) c10::Error: checksum mismatch in data file '" + path +
                                                          "': key 'w' (chunk offsets=[16, 0] sizes=[16, 4])");
}

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, KeyShapeAndDtypeMismatchesFailEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // rank 1 and the last rank err
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const int last = t.ranks() - 1;
  const std::string ckpt = dir.sub("ckpt");
  checkpoint::save(fault_state(mesh, 4), ckpt);

  // Unknown key on rank 1 only: strict load fails on every rank, naming rank 1 and the key.
  auto sd = fault_dest(mesh);
  if (t.rank() == 1) sd["extra"] = at::zeros({2});
  auto e = checkpoint_error_of([&] { checkpoint::load(sd, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{1});
  EXPECT_PRED2(contains, e->what_without_backtrace(), "missing from the checkpoint: ['extra']");
  // Not strict: reported, the rest loaded.
  LoadOptions lax;
  lax.strict = false;
  sd.erase("step");
  auto res = checkpoint::load(sd, ckpt, lax);
  EXPECT_EQ(res.missing_keys, std::vector<std::string>{"extra"});
  EXPECT_EQ(res.unexpected_keys, std::vector<std::string>{"step"});
  expect_holds(sd.at("w"), at::full({w_rows(mesh), 4}, 4.0f), "w");

  auto bad_shape = fault_dest(mesh);
  bad_shape["b"] = at::zeros({5});
  e = checkpoint_error_of([&] { checkpoint::load(bad_shape, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), all_ranks(t.ranks()));
  EXPECT_PRED2(contains, e->what_without_backtrace(),
               "key 'b' has shape [5] in the state dict but [4] in the checkpoint");
  auto bad_dtype = fault_dest(mesh);
  if (t.rank() == last) bad_dtype["w"] = dtensor::zeros({w_rows(mesh), 4}, mesh, {Shard{0}}, at::kDouble);
  e = checkpoint_error_of([&] { checkpoint::load(bad_dtype, ckpt); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{last});
  EXPECT_PRED2(contains, e->what_without_backtrace(),
               "key 'w' has dtype float64 in the state dict but float32 in the checkpoint");
}

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, InconsistentSavesFailEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // rank 1 and the last rank disagree with rank 0
  SharedDir dir(t.group());
  const int last = t.ranks() - 1;
  // Ranks disagree on a plain tensor's shape: the plan fails on the coordinator.
  StateDict sd{{"b", at::zeros({t.rank() == last ? 5 : 4})}};
  auto e = checkpoint_error_of([&] { checkpoint::save(sd, dir.sub("ckpt")); });
  ASSERT_TRUE(e);
  EXPECT_EQ(e->step(), "plan");
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{0});
  EXPECT_PRED2(contains, e->what_without_backtrace(),
               "key 'b' has global size [4] on rank 0 but [5] on rank " + std::to_string(last));
  // An unsupported value on one rank fails the plan step everywhere.
  StateDict bad{{"b", at::zeros({4})}};
  if (t.rank() == 1) bad["q"] = at::Tensor();
  e = checkpoint_error_of([&] { checkpoint::save(bad, dir.sub("ckpt")); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{1});
  EXPECT_PRED2(contains, e->what_without_backtrace(), "(RANK 1) c10::Error: checkpoint: key 'q' is an undefined tensor");
  EXPECT_FALSE(fs::exists(fs::path(dir.sub("ckpt")) / ".metadata"));
}

// ---- async_save ---------------------------------------------------------------------------------

DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, AsyncSaveWritesTheStateAsItWasWhenCalled) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // rank 1's write fails
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  StateDict sd = fault_state(mesh, 5);
  at::Tensor partial = from_local(at::full({2}, float(t.rank())), mesh, {Partial{}});
  sd["partial"] = partial;
  // The background save runs its collectives on a group of its own, so the caller may keep
  // using the default group meanwhile.
  SaveOptions opts;
  opts.process_group = comm::new_group(all_ranks(t.ranks()));
  auto fut = checkpoint::async_save(sd, dir.sub("ckpt"), opts);
  // The caller changes its parameters at once (in place) and keeps communicating.
  local_tensor(std::get<at::Tensor>(sd.at("w"))).add_(100);
  std::get<at::Tensor>(sd.at("b")).add_(100);
  t.group().barrier();
  auto meta = fut.get();
  EXPECT_EQ(meta.entries.size(), 4u);
  auto dest = fault_dest(mesh);
  dest["partial"] = dtensor::zeros({2}, mesh, {Replicate{}});
  checkpoint::load(dest, dir.sub("ckpt"));
  expect_fault_state(dest, 5);
  expect_holds(dest.at("partial"), at::full({2}, float(t.ranks() * (t.ranks() - 1) / 2)), "partial");  // 0 + ... + n-1

  // A failure in the background reaches every rank through the future.
  if (t.rank() == 0) fs::create_directory(fs::path(dir.sub("ckpt")) / "__1_2.distcp");
  t.group().barrier();
  auto failing = checkpoint::async_save(sd, dir.sub("ckpt"), opts);
  auto e = checkpoint_error_of([&] { failing.get(); });
  ASSERT_TRUE(e);
  EXPECT_EQ(failing_ranks(*e), std::vector<int>{1});
  EXPECT_PRED2(contains, e->what_without_backtrace(), "__1_2.distcp': a directory is in its way");
}

// ---- a process killed in the middle of a save ---------------------------------------------------

// The default staging cache (SaveOptions::cache_staging): a loop of async_saves reuses one set
// of buffers; a save while another still writes from its set gets a set of its own (it neither
// waits nor overwrites what the other writes); a set staged again after shapes and dtypes
// changed follows them; release_staging_cache() frees the cache; cache_staging = false keeps
// nothing. Every checkpoint holds the values of its own call.
DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, AsyncSavesCacheStagingByDefault) {
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  // The cache is the process's: the thread ranks share one.
  const int64_t ranks_here = dynamic_cast<testing::MultiThreadedTest*>(&t) ? t.ranks() : 1;
  checkpoint::release_staging_cache();
  SaveOptions opts;
  opts.process_group = comm::new_group(all_ranks(t.ranks()));
  SaveOptions other_group = opts;
  other_group.process_group = comm::new_group(all_ranks(t.ranks()));
  auto settle = [&](std::future<checkpoint::Metadata>& f) {
    f.get();
    t.group().barrier();  // every rank's save is done: its set is free
  };
  auto set_all = [](StateDict& sd, float v) {
    local_tensor(std::get<at::Tensor>(sd.at("w"))).fill_(v);
    std::get<at::Tensor>(sd.at("b")).fill_(v);
    sd["step"] = c10::IValue(int64_t(v));
  };
  StateDict sd = fault_state(mesh, 1);
  auto first = checkpoint::async_save(sd, dir.sub("one"), opts);
  t.group().barrier();
  // This rank's rows of w (2x4 floats) and the replicated b (4 floats).
  EXPECT_EQ(checkpoint::staging_cache_bytes(), 48 * ranks_here);
  t.group().barrier();
  set_all(sd, 2);
  settle(first);
  // The second save's write waits for `gate`: the third is staged while it is in flight.
  std::promise<void> open_gate;
  std::shared_future<void> gate = open_gate.get_future().share();
  auto opener = std::shared_ptr<void>(nullptr, [&](void*) { open_gate.set_value(); });  // on every way out
  SaveOptions gated = opts;
  gated.on_item_written = [gate](const std::string&, int64_t) { gate.wait(); };
  auto second = checkpoint::async_save(sd, dir.sub("two"), gated);
  t.group().barrier();
  EXPECT_EQ(checkpoint::staging_cache_bytes(), 48 * ranks_here) << "the second save reuses the first's buffers";
  t.group().barrier();  // every thread rank has read the cache's size
  set_all(sd, 3);
  auto third = checkpoint::async_save(sd, dir.sub("three"), other_group);
  t.group().barrier();
  EXPECT_EQ(checkpoint::staging_cache_bytes(), 96 * ranks_here) << "the third save needs a set of its own";
  opener.reset();  // opens the gate
  settle(third);
  settle(second);
  // Other shapes and dtypes under the same keys: w (2n)x6, b double.
  StateDict changed{{"w", distribute_tensor(at::full({w_rows(mesh), 6}, 4.0f), mesh, {Shard{0}})},
                    {"b", at::full({4}, 4.0, at::kDouble)},
                    {"step", c10::IValue(int64_t(4))}};
  auto fourth = checkpoint::async_save(changed, dir.sub("four"), opts);
  settle(fourth);
  // One set now holds 2x6 floats + 4 doubles (80 bytes), the other still 48.
  EXPECT_EQ(checkpoint::staging_cache_bytes(), 128 * ranks_here);

  auto dest = fault_dest(mesh);
  for (const auto& [name, v] : std::vector<std::pair<std::string, float>>{{"one", 1}, {"two", 2}, {"three", 3}}) {
    SCOPED_TRACE(name);
    checkpoint::load(dest, dir.sub(name));
    expect_fault_state(dest, v);
  }
  StateDict dest4{{"w", dtensor::zeros({w_rows(mesh), 6}, mesh, {Shard{1}})},
                  {"b", at::zeros({4}, at::kDouble)},
                  {"step", c10::IValue()}};
  checkpoint::load(dest4, dir.sub("four"));
  expect_holds(dest4.at("w"), at::full({w_rows(mesh), 6}, 4.0f), "w");
  expect_holds(dest4.at("b"), at::full({4}, 4.0, at::kDouble), "b");

  checkpoint::release_staging_cache();
  EXPECT_EQ(checkpoint::staging_cache_bytes(), 0);
  t.group().barrier();
  SaveOptions uncached = opts;
  uncached.cache_staging = false;
  checkpoint::async_save(sd, dir.sub("five"), uncached).get();
  EXPECT_EQ(checkpoint::staging_cache_bytes(), 0);
  checkpoint::load(dest, dir.sub("five"));
  expect_fault_state(dest, 3);
}

// StagingBuffers: later async_saves copy into the buffers the first one allocated; an
// async_save whose buffers a previous one still writes from waits for that write, so each
// checkpoint holds the values of its own call.
DTENSOR_TEST_BOTH(CheckpointGloo, CheckpointThreads, AsyncSavesReuseStagingBuffers) {
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  StateDict sd = fault_state(mesh, 1);
  SaveOptions opts;
  opts.process_group = comm::new_group(all_ranks(t.ranks()));
  opts.staging = std::make_shared<checkpoint::StagingBuffers>();
  auto first = checkpoint::async_save(sd, dir.sub("one"), opts);
  // This rank's rows of w (2x4 floats) and the replicated b (4 floats); objects are not staged.
  EXPECT_EQ(opts.staging->nbytes(), 48);
  // Changed at once and saved again without waiting for the first save.
  local_tensor(std::get<at::Tensor>(sd.at("w"))).fill_(2);
  std::get<at::Tensor>(sd.at("b")).fill_(2);
  sd["step"] = c10::IValue(int64_t(2));
  auto second = checkpoint::async_save(sd, dir.sub("two"), opts);
  EXPECT_EQ(opts.staging->nbytes(), 48);
  first.get();
  second.get();
  auto dest = fault_dest(mesh);
  checkpoint::load(dest, dir.sub("one"));
  expect_fault_state(dest, 1);
  checkpoint::load(dest, dir.sub("two"));
  expect_fault_state(dest, 2);
  // Another layout: the buffers follow it (all of w's (2n)x4 floats now on every rank).
  StateDict rep{{"w", distribute_tensor(at::full({w_rows(mesh), 4}, 3.0f), mesh, {Replicate{}})}};
  checkpoint::async_save(rep, dir.sub("three"), opts).get();
  EXPECT_EQ(opts.staging->nbytes(), w_rows(mesh) * 4 * 4);
}

// Runs only as the child of the test below: saves {w, v} at world size 1 and dies (SIGKILL)
// right after writing the first of them.
TEST(CheckpointChild, SaveKilledMidWrite) {
  const char* dir = std::getenv("DTENSOR_DCP_KILL_DIR");
  if (!dir) GTEST_SKIP() << "run by CheckpointAtomic.ProcessKilledMidSaveKeepsThePreviousCheckpoint";
  SaveOptions opts;
  opts.no_dist = true;
  opts.on_item_written = [](const std::string&, int64_t) { std::raise(SIGKILL); };
  StateDict sd{{"v", at::full({1000}, 2.0f)}, {"w", at::full({1000}, 2.0f)}};
  checkpoint::save(sd, dir, opts);
  ADD_FAILURE() << "still alive after the save";
}

TEST(CheckpointAtomic, ProcessKilledMidSaveKeepsThePreviousCheckpoint) {
  testing::TempDir tmp;
  const std::string ckpt = tmp.path() + "/ckpt";
  SaveOptions sopts;
  sopts.no_dist = true;
  LoadOptions lopts;
  lopts.no_dist = true;
  checkpoint::save(StateDict{{"v", at::full({1000}, 1.0f)}, {"w", at::full({1000}, 1.0f)}}, ckpt, sopts);
  auto run = testing::run_self({"--gtest_filter=CheckpointChild.SaveKilledMidWrite"}, {{"DTENSOR_DCP_KILL_DIR", ckpt}});
  EXPECT_NE(run.exit_code, 0) << run.output;
  // The killed save left its partial data file, but not a metadata file.
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "__0_2.distcp")) << run.output;
  EXPECT_EQ(checkpoint::read_metadata(ckpt).save_id, 1);
  StateDict sd{{"v", at::zeros({1000})}, {"w", at::zeros({1000})}};
  checkpoint::load(sd, ckpt, lopts);
  EXPECT_TRUE(at::equal(std::get<at::Tensor>(sd.at("v")), at::full({1000}, 1.0f)));
  EXPECT_TRUE(at::equal(std::get<at::Tensor>(sd.at("w")), at::full({1000}, 1.0f)));
  // The next save succeeds (as save 3: its id is above the debris's) and removes both the old
  // files and the debris.
  checkpoint::save(StateDict{{"v", at::full({1000}, 3.0f)}, {"w", at::full({1000}, 3.0f)}}, ckpt, sopts);
  checkpoint::load(sd, ckpt, lopts);
  EXPECT_TRUE(at::equal(std::get<at::Tensor>(sd.at("w")), at::full({1000}, 3.0f)));
  EXPECT_EQ(tmp.entries().size(), 1u);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpt)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".metadata", "__0_3.distcp"}));
}

}  // namespace
}  // namespace dtensor
