// dtensor/sharded: metadata and ChunkShardingSpec (single process), and ShardedTensor as 4
// ranks (gloo processes and threads): shard_tensor and its cross-rank checks, gather, reshard,
// construction from local shards with every validation error, the DTensor bridge, and loading
// under load_with_process_group.
#include "dtensor/comm/comm.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace {

using sharded::ChunkShardingSpec;
using sharded::EnumerableShardingSpec;
using sharded::RemoteDevice;
using sharded::ShardedTensor;
using sharded::ShardMetadata;
using testing::contains;
using testing::error_of;

std::vector<RemoteDevice> cpu_ranks(std::vector<int> ranks) {
  std::vector<RemoteDevice> out;
  for (int r : ranks) out.emplace_back("rank:" + std::to_string(r) + "/cpu");
  return out;
}
ChunkShardingSpec chunk(int64_t dim, std::vector<int> ranks = {0, 1, 2, 3}) { return {dim, cpu_ranks(ranks)}; }

at::Tensor full_tensor_of(int64_t rows, int64_t cols) { return at::arange(rows * cols, at::kFloat).view({rows, cols}); }

// Piece `idx` of torch.chunk(t, chunks, dim); empty when torch.chunk makes fewer pieces.
at::Tensor chunk_piece(const at::Tensor& t, int64_t chunks, int64_t dim, size_t idx) {
  auto pieces = t.chunk(chunks, dim);
  return idx < pieces.size() ? pieces[idx] : t.narrow(dim, t.size(dim), 0);
}

// ---- metadata (single process) ---------------------------------------------------------------

TEST(RemoteDevice, ParsesEveryForm) {
  RemoteDevice r("rank:3/cpu");
  EXPECT_EQ(r.rank(), 3);
  EXPECT_EQ(r.device(), c10::Device(c10::kCPU));
  EXPECT_EQ(r.to_string(), "rank:3/cpu");
  RemoteDevice w("trainer0/cpu");
  EXPECT_FALSE(w.rank().has_value());
  EXPECT_EQ(*w.worker_name(), "trainer0");
  RemoteDevice d("cpu");
  EXPECT_FALSE(d.rank() || d.worker_name());
  EXPECT_EQ(d.to_string(), "cpu");
  EXPECT_EQ(RemoteDevice("rank:1").to_string(), "rank:1/cpu");  // a bare worker is on the CPU
  EXPECT_EQ(RemoteDevice(2, c10::Device(c10::kCPU)), RemoteDevice("rank:2/cpu"));
  for (const char* bad : {"rank:x/cpu", "a/b/c", "/cpu", "rank:1:2/cpu", "host:1/cpu"})
    EXPECT_PRED2(contains, error_of([&] { RemoteDevice{bad}; }),
                 std::string("Could not parse remote_device: ") + bad + ". The valid format is");
  EXPECT_PRED2(contains, error_of([] { RemoteDevice("rank:1/gpu7"); }), "('gpu7' is not a device)");
}

TEST(ShardMetadata, ValidatesOffsetsAndSizes) {
  ShardMetadata m({4, 0}, {4, 10}, RemoteDevice("rank:1/cpu"));
  EXPECT_EQ(m.numel(), 40);
  EXPECT_EQ(m.to_string(), "ShardMetadata(shard_offsets=[4, 0], shard_sizes=[4, 10], placement=rank:1/cpu)");
  EXPECT_EQ(ShardMetadata({0}, {1}).to_string(), "ShardMetadata(shard_offsets=[0], shard_sizes=[1], placement=None)");
  EXPECT_PRED2(contains, error_of([] { ShardMetadata({0, 0}, {1}); }),
               "shard_offsets and shard_sizes should have the same number of elements, found 2 and 1 respectively");
  EXPECT_PRED2(contains, error_of([] { ShardMetadata({-1}, {1}); }), "shard_offsets should be >=0");
  EXPECT_PRED2(contains, error_of([] { ShardMetadata({0}, {-2}); }), "shard_sizes should be >= 0");
}

TEST(ShardMetadata, OverlapAndCoverageChecks) {
  ShardMetadata a({0, 0}, {2, 4}), b({2, 0}, {2, 4}), c({1, 0}, {2, 4});
  sharded::validate_non_overlapping_shards_metadata({a, b});
  sharded::check_tensor({a, b}, {4, 4});
  EXPECT_PRED2(contains, error_of([&] { sharded::validate_non_overlapping_shards_metadata({a, b, c}); }),
               "Shards ShardMetadata(shard_offsets=[0, 0], shard_sizes=[2, 4], placement=None) and "
               "ShardMetadata(shard_offsets=[1, 0], shard_sizes=[2, 4], placement=None) overlap");
  // Empty shards at the origin never overlap; an empty shard at the end touches nothing.
  sharded::validate_non_overlapping_shards_metadata({ShardMetadata({0, 0}, {0, 4}), ShardMetadata({0, 0}, {0, 4})});
  sharded::validate_non_overlapping_shards_metadata({a, b, ShardMetadata({4, 0}, {0, 4})});
  EXPECT_PRED2(contains, error_of([&] { sharded::check_tensor({a}, {4, 4}); }),
               "Total volume of shards: 8 does not match tensor volume: 16, in other words all the individual "
               "shards do not cover the entire tensor");
  EXPECT_PRED2(contains, error_of([&] { sharded::check_tensor({a, b}, {3, 4}); }),
               "Shard offset 2 and length 2 exceeds tensor dim: 3 for shard");
  EXPECT_PRED2(contains, error_of([&] { sharded::check_tensor({a}, {8}); }),
               "Rank of tensor is 1, but shards rank is 2");
}

TEST(ChunkShardingSpec, BuildMetadataFollowsTorchChunk) {
  auto offsets_and_sizes = [](const sharded::ShardedTensorMetadata& m, int64_t d) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const auto& s : m.shards_metadata) out.emplace_back(s.shard_offsets()[d], s.shard_sizes()[d]);
    return out;
  };
  using P = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(offsets_and_sizes(chunk(0).build_metadata({10, 3}, {}), 0), (P{{0, 3}, {3, 3}, {6, 3}, {9, 1}}));
  // torch.chunk(5, 4) makes 2, 2, 1: the fourth shard is empty and sits at the end.
  EXPECT_EQ(offsets_and_sizes(chunk(0).build_metadata({5, 3}, {}), 0), (P{{0, 2}, {2, 2}, {4, 1}, {5, 0}}));
  auto m = chunk(-1).build_metadata({2, 8}, {});
  EXPECT_EQ(offsets_and_sizes(m, 1), (P{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  EXPECT_EQ(m.shards_metadata[2].shard_sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(*m.shards_metadata[2].placement(), RemoteDevice("rank:2/cpu"));
  EXPECT_PRED2(contains, error_of([] { chunk(2).build_metadata({2, 8}, {}); }), "Invalid sharding dim: 2");
  EXPECT_PRED2(contains, error_of([] { chunk(-3).build_metadata({2, 8}, {}); }), "Invalid sharding dim: -3");
  EXPECT_PRED2(contains, error_of([] { ChunkShardingSpec(0, {}); }), "needs at least one placement");
}

TEST(ChunkShardingSpec, EqualityStringAndJson) {
  EXPECT_EQ(chunk(0).to_string(),
            "ChunkShardingSpec(dim=0, placements=[rank:0/cpu, rank:1/cpu, rank:2/cpu, rank:3/cpu])");
  EXPECT_EQ(chunk(0), chunk(0));
  EXPECT_NE(chunk(0), chunk(1));
  EXPECT_NE(chunk(0), chunk(0, {3, 2, 1, 0}));
  EXPECT_EQ(ChunkShardingSpec::from_json(chunk(1, {2, 0}).to_json()), chunk(1, {2, 0}));
}

TEST(InferShardingSpec, RecognisesChunkLayoutsElseEnumerates) {
  const auto spec = chunk(1, {3, 1, 0, 2});
  auto inferred = sharded::infer_sharding_spec(spec.build_metadata({4, 10}, {}).shards_metadata, {4, 10});
  ASSERT_TRUE(inferred);
  EXPECT_EQ(*inferred, spec);
  // A 2-D block layout is not a chunk layout: an EnumerableShardingSpec of the blocks.
  std::vector<ShardMetadata> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.emplace_back(std::vector<int64_t>{i / 2 * 2, i % 2 * 2}, std::vector<int64_t>{2, 2},
                        RemoteDevice("rank:" + std::to_string(i) + "/cpu"));
  auto enumerated = sharded::infer_sharding_spec(blocks, {4, 4});
  ASSERT_TRUE(enumerated);
  EXPECT_EQ(*enumerated, sharded::EnumerableShardingSpec(blocks));
  EXPECT_FALSE(sharded::infer_sharding_spec({}, {4, 4}));
}

// test_sharding_spec.py test_enumerable_sharding_spec: a 10x10 tensor as a 2x2 grid of 5x5 blocks.
std::vector<ShardMetadata> grid_10x10() {
  std::vector<ShardMetadata> out;
  for (int i = 0; i < 4; ++i)
    out.emplace_back(std::vector<int64_t>{i / 2 * 5, i % 2 * 5}, std::vector<int64_t>{5, 5},
                     RemoteDevice("rank:" + std::to_string(i) + "/cpu"));
  return out;
}

TEST(EnumerableShardingSpec, ValidatesShardsAndBuildsMetadata) {
  EnumerableShardingSpec spec(grid_10x10());
  const auto meta = spec.build_metadata({10, 10}, {});
  EXPECT_EQ(meta.shards_metadata, grid_10x10());
  EXPECT_EQ(meta.size, (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(spec.to_string().rfind("EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], shard_sizes=[5, "
                                   "5], placement=rank:0/cpu), ",
                                   0),
            0u)
      << spec.to_string();
  EXPECT_EQ(EnumerableShardingSpec::from_json(spec.to_json()), spec);
  EXPECT_NE(static_cast<const sharded::ShardingSpec&>(spec),
            static_cast<const sharded::ShardingSpec&>(chunk(0)));
  auto overlapping = grid_10x10();
  overlapping[1] = ShardMetadata({0, 4}, {5, 5}, RemoteDevice("rank:1/cpu"));
  auto three_d = grid_10x10();
  three_d[3] = ShardMetadata({5, 5, 0}, {5, 5, 1}, RemoteDevice("rank:3/cpu"));
  EXPECT_PRED2(contains, error_of([] { EnumerableShardingSpec({}); }), "Empty shard list provided");
  EXPECT_PRED2(contains, error_of([&] { EnumerableShardingSpec{overlapping}; }), "overlap");
  EXPECT_PRED2(contains, error_of([&] { EnumerableShardingSpec{three_d}; }), "Found inconsistent ranks for shards: 2 and 3");
  EXPECT_PRED2(contains, error_of([&] { spec.build_metadata({10, 11}, {}); }),
               "Total volume of shards: 100 does not match tensor volume: 110");
  EXPECT_PRED2(contains, error_of([&] { spec.build_metadata({10, 9}, {}); }), "exceed");
  EXPECT_PRED2(contains, error_of([&] { spec.build_metadata({100}, {}); }), "has shards of 2 dims but the tensor has 1");
}

TEST(Shard, ChecksItsTensorAgainstItsMetadata) {
  EXPECT_PRED2(contains, error_of([] { sharded::Shard(at::zeros({2, 3}), ShardMetadata({0, 0}, {3, 3})); }),
               "Shard tensor size does not match with metadata.shard_lengths! Found shard tensor size: [2, 3], "
               "metadata.shard_lengths: [3, 3]");
  EXPECT_PRED2(contains,
               error_of([] { sharded::Shard(at::zeros({2}), ShardMetadata({0}, {2}, RemoteDevice("rank:0/meta"))); }),
               "Local shard tensor device does not match with local Shard's placement! Found local shard tensor "
               "device: cpu, local shard metadata placement device: meta");
  auto s = sharded::Shard::from_tensor_and_offsets(at::zeros({2, 3}), {4, 0}, 1);
  EXPECT_EQ(s.metadata.to_string(), "ShardMetadata(shard_offsets=[4, 0], shard_sizes=[2, 3], placement=rank:1/cpu)");
}

// ---- 4 ranks ------------------------------------------------------------------------------------

// NOTE: [Written for 4 ranks] in suites/sharded/shard_module_test.cpp.
DTENSOR_RANK_FIXTURES(ShardedGloo, ShardedThreads);

// Only `src`'s values count: other ranks pass a tensor of the same shape filled with -1.
at::Tensor input_on(const testing::MultiRankTest& t, int src, int64_t rows, int64_t cols) {
  return t.rank() == src ? full_tensor_of(rows, cols) : at::full({rows, cols}, -1.0f);
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ShardTensorScattersTorchChunkPieces) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  testing::run_subtests({{"dim", {0, 1}}, {"rows", {10, 5, 8}}, {"src", {0, 2}}}, [&](const testing::SubtestParams& p) {
    const int64_t dim = p.get<int64_t>("dim"), rows = p.get<int64_t>("rows");
    const int src = static_cast<int>(p.get<int64_t>("src"));
    at::Tensor full = full_tensor_of(rows, 6);
    at::Tensor in = input_on(t, src, rows, 6);
    ShardedTensor st = sharded::shard_tensor(in, chunk(dim), src);
    at::Tensor local = st.local_tensor();
    EXPECT_TRUE(at::equal(local, chunk_piece(full, 4, dim, r))) << local;
    EXPECT_TRUE(local.is_contiguous());
    EXPECT_EQ(st.size(), full.sizes().vec());
    EXPECT_EQ(st.metadata().shards_metadata.size(), 4u);
    ASSERT_TRUE(st.sharding_spec());
    EXPECT_EQ(*st.sharding_spec(), chunk(dim));
    EXPECT_EQ(st.process_group().get(), comm::default_group().get());
  });
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ShardTensorFollowsPlacementOrderAndRequiresGrad) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  at::Tensor in = input_on(t, 0, 8, 2).requires_grad_();
  ShardedTensor st = sharded::shard_tensor(in, chunk(0, {3, 2, 1, 0}));
  EXPECT_TRUE(at::equal(st.local_tensor(), full_tensor_of(8, 2).narrow(0, 2 * (3 - r), 2)));
  EXPECT_TRUE(st.local_tensor().requires_grad());
  EXPECT_TRUE(st.local_tensor().is_leaf());
  EXPECT_TRUE(st.metadata().tensor_properties.requires_grad);
  EXPECT_EQ(st.local_shards()[0].metadata.shard_offsets(), (std::vector<int64_t>{2 * (3 - r), 0}));
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ShardTensorChecksEveryRankBeforeMovingData) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  at::Tensor in = full_tensor_of(8, 4);
  // src_rank: rank 3 disagrees. Every rank raises, naming itself and the first other rank.
  const std::string src_err = error_of([&] { sharded::shard_tensor(in, chunk(0), r == 3 ? 1 : 0); });
  if (r == 3)
    EXPECT_PRED2(contains, src_err, "src_rank=1 on rank: 3 does not match with src_rank=0 on rank: 0");
  else
    EXPECT_PRED2(contains, src_err,
                 "src_rank=0 on rank: " + std::to_string(r) + " does not match with src_rank=1 on rank: 3");
  // spec: rank 1 disagrees.
  const std::string spec_err = error_of([&] { sharded::shard_tensor(in, chunk(r == 1 ? 1 : 0)); });
  EXPECT_PRED2(contains, spec_err,
               r == 1 ? "sharding_spec=ChunkShardingSpec(dim=1, "
                      : "does not match with sharding_spec=ChunkShardingSpec(dim=1, ");
  // A non-contiguous tensor on one rank only.
  at::Tensor maybe_strided = r == 2 ? full_tensor_of(4, 8).t() : in;
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(maybe_strided, chunk(0)); }),
               "input tensor is not a contiguous Tensor (on rank 2)");
  // Sizes and dtypes must agree too (metadata is computed from each rank's tensor).
  at::Tensor other = r == 1 ? full_tensor_of(6, 4) : in;
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(other, chunk(0)); }),
               "shard_tensor: input tensor has size [6, 4] and dtype Float on rank: 1, but size [8, 4] and dtype "
               "Float on rank: 0");
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(at::Tensor(), chunk(0)); }),
               "shard_tensor: rank 0: input tensor is undefined");
  // Nothing was left half done: the group still works.
  EXPECT_TRUE(at::equal(sharded::shard_tensor(in, chunk(0)).local_tensor(), in.narrow(0, 2 * r, 2)));
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ShardTensorSpecErrors) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  at::Tensor in = full_tensor_of(8, 4);
  // A spec on a subset of the ranks is fine (rank 3 holds nothing; EnumerableAndSubsetSpecs).
  EXPECT_EQ(sharded::shard_tensor(in, chunk(0, {0, 1, 2})).local_shards().size(), t.rank() < 3 ? 1u : 0u);
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(in, chunk(0, {0, 1, 1, 2})); }),
               "ChunkShardingSpec.shard: rank 1 holds several placements of");
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(in, chunk(0, {0, 1, 2, 7})); }),
               "Global rank 7 does not exist in input process group: [0, 1, 2, 3]");
  EXPECT_PRED2(contains, error_of([&] {
                 sharded::shard_tensor(in, ChunkShardingSpec(0, {"w0/cpu", "w1/cpu", "w2/cpu", "w3/cpu"}));
               }),
               "RPC framework needs to be initialized for using worker names: w0");
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(in, chunk(2)); }), "Invalid sharding dim: 2");
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_tensor(in, chunk(0), 4); }),
               "ChunkShardingSpec.shard: src_rank=4 is not a rank of the");
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, GatherAssemblesTheWholeTensorOnDst) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  for (int64_t rows : {9, 3}) {  // uneven, and empty shards
    SCOPED_TRACE("rows " + std::to_string(rows));
    at::Tensor full = full_tensor_of(rows, 5);
    ShardedTensor st = sharded::shard_tensor(full, chunk(1, {2, 0, 3, 1}));
    at::Tensor got = st.gather(/*dst=*/1);
    if (r == 1)
      EXPECT_TRUE(at::equal(got, full)) << got;
    else
      EXPECT_FALSE(got.defined());
    // With a caller's output.
    std::optional<at::Tensor> out;
    if (r == 3) out = at::zeros({rows, 5});
    st.gather(3, out);
    if (r == 3) EXPECT_TRUE(at::equal(*out, full));
  }
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, GatherOutputMistakesRaiseOnTheirRankOnly) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  ShardedTensor st = sharded::shard_tensor(full_tensor_of(8, 2), chunk(0));
  // dst 0 passes nothing: rank 0 raises after the gather; the others return.
  const std::string missing = error_of([&] { st.gather(0, std::nullopt); });
  EXPECT_PRED2(contains, missing,
               r == 0
                   ? "ShardedTensor.gather on rank 0: Argument ``dst_tensor`` must be specified on destination rank 0"
                   : "<no error>");
  std::optional<at::Tensor> out;
  if (r == 0) out = at::zeros({4, 4});
  EXPECT_PRED2(contains, error_of([&] { st.gather(0, out); }),
               r == 0 ? "Argument ``dst_tensor`` have size [4, 4], but should be [8, 2]" : "<no error>");
  std::optional<at::Tensor> stray;
  if (r == 2) stray = at::zeros({8, 2});
  std::optional<at::Tensor> right;
  if (r == 0) right = at::zeros({8, 2});
  EXPECT_PRED2(contains, error_of([&] { st.gather(0, r == 2 ? stray : right); }),
               r == 2 ? "Argument ``dst_tensor`` must NOT be specified on non-destination ranks." : "<no error>");
  if (r == 0) EXPECT_TRUE(at::equal(*right, full_tensor_of(8, 2)));
  EXPECT_PRED2(contains, error_of([&] { st.gather(4); }), "ShardedTensor.gather: dst=4 is not a rank");
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ReshardMovesDataToTheNewLayout) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  const at::Tensor full = full_tensor_of(9, 8);
  ShardedTensor st = sharded::shard_tensor(full, chunk(0));
  ShardedTensor alias = st;  // a handle: reshard changes both
  EXPECT_EQ(&st.reshard(chunk(1)), &st);
  EXPECT_TRUE(at::equal(alias.local_tensor(), chunk_piece(full, 4, 1, r)));
  EXPECT_EQ(*alias.sharding_spec(), chunk(1));
  st.reshard(chunk(1, {3, 2, 1, 0}));  // same dim, other order
  EXPECT_TRUE(at::equal(st.local_tensor(), chunk_piece(full, 4, 1, 3 - r)));
  const at::Tensor before = st.local_tensor();
  st.reshard(chunk(1, {3, 2, 1, 0}));  // the same spec: nothing moves
  EXPECT_TRUE(st.local_tensor().is_same(before));
  // Two shards per rank (eight placements), then back to one.
  st.reshard(ChunkShardingSpec(0, cpu_ranks({0, 1, 2, 3, 0, 1, 2, 3})));
  ASSERT_EQ(st.local_shards().size(), 2u);
  EXPECT_PRED2(
      contains, error_of([&] { st.local_tensor(); }),
      "ShardedTensor.local_tensor: only works with exactly one local shard, rank " + std::to_string(r) + " has 2");
  EXPECT_TRUE(at::equal(st.local_shards()[0].tensor, chunk_piece(full, 8, 0, r)));
  EXPECT_TRUE(at::equal(st.local_shards()[1].tensor, chunk_piece(full, 8, 0, r + 4)));  // rows 8, then empty
  at::Tensor gathered = st.gather(2);
  if (r == 2) EXPECT_TRUE(at::equal(gathered, full));
  st.reshard(chunk(0));
  EXPECT_TRUE(at::equal(st.local_tensor(), chunk_piece(full, 4, 0, r)));  // 3, 3, 3, 0 rows
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ReshardRefusesSpecsThatDifferAcrossRanks) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  ShardedTensor st = sharded::shard_tensor(full_tensor_of(8, 8), chunk(0));
  EXPECT_PRED2(contains, error_of([&] { st.reshard(chunk(t.rank() == 2 ? 0 : 1)); }),
               "ShardedTensor.reshard: rank 2 passed");
  EXPECT_TRUE(at::equal(st.local_tensor(), full_tensor_of(8, 8).narrow(0, 2 * t.rank(), 2)));  // unchanged
}

// Rank r's rows [2r, 2r + 2) of an [8, 3] tensor, as a Shard placed on rank r.
sharded::Shard rows_of(int r, at::ScalarType dtype = at::kFloat) {
  return sharded::Shard::from_tensor_and_offsets(full_tensor_of(8, 3).narrow(0, 2 * r, 2).to(dtype).clone(), {2 * r, 0},
                                                 r);
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, InitFromLocalShardsBuildsGlobalMetadata) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  ShardedTensor st = ShardedTensor::init_from_local_shards({rows_of(r)}, {8, 3});
  EXPECT_EQ(st.metadata().shards_metadata.size(), 4u);
  EXPECT_EQ(st.metadata().shards_metadata[3], rows_of(3).metadata);
  ASSERT_TRUE(st.sharding_spec());  // inferred
  EXPECT_EQ(*st.sharding_spec(), chunk(0));
  at::Tensor g = st.gather(0);
  if (r == 0) EXPECT_TRUE(at::equal(g, full_tensor_of(8, 3)));
  // Ranks 0 and 2 hold two shards each, ranks 1 and 3 none: still a chunk layout (placements
  // 0, 0, 2, 2), but not a DTensor one.
  std::vector<sharded::Shard> mine;
  if (r % 2 == 0) {
    mine.push_back(rows_of(r));
    mine.push_back(sharded::Shard::from_tensor_and_offsets(full_tensor_of(8, 3).narrow(0, 2 * r + 2, 2).contiguous(),
                                                           {2 * r + 2, 0}, r));
  }
  ShardedTensor two = ShardedTensor::init_from_local_shards(mine, {8, 3});
  ASSERT_TRUE(two.sharding_spec());
  EXPECT_EQ(*two.sharding_spec(), chunk(0, {0, 0, 2, 2}));
  EXPECT_FALSE(two.is_dtensor_compatible());
  at::Tensor g2 = two.gather(1);
  if (r == 1) EXPECT_TRUE(at::equal(g2, full_tensor_of(8, 3)));
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, InitFromLocalShardsErrorsReachEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  auto init = [&](std::vector<sharded::Shard> shards, std::vector<int64_t> size = {8, 3}) {
    return error_of([&] { ShardedTensor::init_from_local_shards(std::move(shards), size); });
  };
  // Overlap: rank 1 claims rows 1..2.
  auto overlapping = r == 1 ? sharded::Shard::from_tensor_and_offsets(at::zeros({2, 3}), {1, 0}, 1) : rows_of(r);
  EXPECT_PRED2(contains, init({overlapping}), "overlap");
  // Missing: rank 3 passes nothing.
  std::vector<sharded::Shard> none;
  EXPECT_PRED2(contains, init(r == 3 ? none : std::vector<sharded::Shard>{rows_of(r)}),
               "Total volume of shards: 18 does not match tensor volume: 24");
  EXPECT_PRED2(contains, init({}), "ShardedTensor have no local shards on all ranks!");
  // Mismatched dtype, global size, requires_grad across ranks.
  EXPECT_PRED2(contains, init({rows_of(r, r == 2 ? at::kDouble : at::kFloat)}),
               "ShardedTensor dtype property does not match from different ranks! Found dtype=Float on rank:0, and "
               "dtype=Double on rank:2.");
  EXPECT_PRED2(contains, error_of([&] {
                 ShardedTensor::init_from_local_shards({rows_of(r)}, r == 3 ? std::vector<int64_t>{9, 3}
                                                                             : std::vector<int64_t>{8, 3});
               }),
               "ShardedTensor global_size property does not match from different ranks! Found global_size=[8, 3] on "
               "rank:0, and global_size=[9, 3] on rank:3.");
  auto grad = rows_of(r);
  if (r == 1) grad.tensor.requires_grad_();
  EXPECT_PRED2(contains, init({grad}), "requires_grad property does not match from different ranks! Found "
                                       "requires_grad=False on rank:0, and requires_grad=True on rank:1.");
  // A rank's own shards inconsistent: every rank raises naming that rank.
  auto elsewhere = r == 1 ? sharded::Shard::from_tensor_and_offsets(at::zeros({2, 3}), {2, 0}, 2) : rows_of(r);
  EXPECT_PRED2(contains, init({elsewhere}),
               "ShardedTensor.init_from_local_shards: the local shards of rank 1 are invalid: Local shard metadata's "
               "rank does not match with the rank in its process group! Found current rank in the process group: 1, "
               "local ShardMetadata placement's rank: 2");
  std::vector<sharded::Shard> mixed{rows_of(r)};
  if (r == 2)
    mixed.push_back(sharded::Shard::from_tensor_and_offsets(at::zeros({1, 3}, at::kDouble), {7, 0}, 2));
  EXPECT_PRED2(contains, init(mixed),
               "the local shards of rank 2 are invalid: Local shards' tensor dtype property need to be the same on "
               "rank:2! Found one local shard tensor dtype=Float, the other local shard tensor dtype=Double.");
  at::Tensor strided = at::zeros({3, 2}).t();
  auto noncontig =
      r == 0 ? sharded::Shard(strided, ShardMetadata({0, 0}, {2, 3}, RemoteDevice("rank:0/cpu"))) : rows_of(r);
  EXPECT_PRED2(
      contains, init({noncontig}),
      "the local shards of rank 0 are invalid: Only torch.contiguous_format memory_format is currently supported!");
  auto outside = r == 0 ? sharded::Shard(at::zeros({2, 3}), ShardMetadata({0, 0}, {2, 3}, RemoteDevice("rank:9/cpu")))
                        : rows_of(r);
  EXPECT_PRED2(contains, init({outside}),
               "the local shards of rank 0 are invalid: Global rank 9 does not exist in input process group");
  // Still usable afterwards.
  EXPECT_EQ(ShardedTensor::init_from_local_shards({rows_of(r)}, {8, 3}).local_tensor().size(0), 2);
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, InitFromGlobalMetadataValidatesLocalShards) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  const auto meta = chunk(0).build_metadata({8, 3}, {});
  auto init = [&](std::vector<sharded::Shard> shards, sharded::ShardedTensorMetadata m) {
    return error_of(
        [&] { ShardedTensor::init_from_local_shards_and_global_metadata(std::move(shards), std::move(m)); });
  };
  EXPECT_EQ(init({rows_of(r)}, meta), "<no error>");
  EXPECT_PRED2(contains, init({}, meta),
               "Number of local shards (0) does not match number of local shards metadata in sharded_tensor_metadata "
               "(1) on rank (" + std::to_string(r) + ")");
  // A shard the global metadata does not list for this rank.
  auto other_rows = sharded::Shard::from_tensor_and_offsets(at::zeros({2, 3}), {(2 * r + 2) % 8, 0}, r);
  EXPECT_PRED2(contains, init({other_rows}, meta),
               "Local shard ShardMetadata(shard_offsets=[" + std::to_string((2 * r + 2) % 8) +
                   ", 0], shard_sizes=[2, 3], "
                   "placement=rank:" +
                   std::to_string(r) + "/cpu) on rank " + std::to_string(r) +
                   " is not one of this rank's shards in the global metadata");
  // Wrong size: the shard agrees with its own metadata, not with the global one.
  auto short_rows = sharded::Shard::from_tensor_and_offsets(at::zeros({1, 3}), {2 * r, 0}, r);
  EXPECT_PRED2(contains, init({short_rows}, meta),
               "Local shards' tensor size property is incompatible with local ShardMetadata on rank " +
                   std::to_string(r) + ": local ShardMetadata size=[2, 3], local shard tensor size=[1, 3]");
  EXPECT_PRED2(contains, init({rows_of(r, at::kDouble)}, meta),
               "Local shards' tensor dtype property is incompatible with tensor property on rank " + std::to_string(r) +
                   ": tensor property dtype=Float, local shard tensor dtype=Double");
  auto grad = rows_of(r);
  grad.tensor.requires_grad_();
  EXPECT_PRED2(contains, init({grad}, meta),
               "tensor property requires_grad=False, local shard tensor requires_grad=True");
  auto empty = meta;
  empty.shards_metadata.clear();
  EXPECT_PRED2(contains, init({}, empty), "shards_metadata must not be empty!");
  // Global metadata that overlaps or leaves a gap.
  auto overlapping = meta;
  overlapping.shards_metadata[1] = ShardMetadata({1, 0}, {2, 3}, RemoteDevice("rank:1/cpu"));
  auto mine = r == 1 ? sharded::Shard::from_tensor_and_offsets(at::zeros({2, 3}), {1, 0}, 1) : rows_of(r);
  EXPECT_PRED2(contains, init({mine}, overlapping), "overlap");
  auto gap = meta;
  gap.size = {9, 3};
  EXPECT_PRED2(contains, init({rows_of(r)}, gap), "Total volume of shards: 24 does not match tensor volume: 27");
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, ConvertsToAndFromDTensor) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  const at::Tensor full = full_tensor_of(5, 4);
  for (auto order : {std::vector<int>{0, 1, 2, 3}, std::vector<int>{3, 1, 0, 2}}) {
    ShardedTensor st = sharded::shard_tensor(full, chunk(0, order));
    ASSERT_TRUE(st.is_dtensor_compatible());
    at::Tensor dt = st.to_dtensor();
    ASSERT_TRUE(is_dtensor(dt));
    EXPECT_EQ(dt.sizes(), full.sizes());
    EXPECT_TRUE(at::equal(full_tensor(dt), full));
    EXPECT_EQ(local_tensor(dt).data_ptr(), st.local_tensor().data_ptr());  // shared, not copied
    ShardedTensor back = ShardedTensor::from_dtensor(dt);
    EXPECT_EQ(*back.sharding_spec(), chunk(0, order));
    EXPECT_EQ(back.metadata().shards_metadata, st.metadata().shards_metadata);
    EXPECT_EQ(back.local_tensor().data_ptr(), st.local_tensor().data_ptr());
  }
  // A DTensor distributed by DTensor's own shard math is the same chunk layout.
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  ShardedTensor from_dt = ShardedTensor::from_dtensor(distribute_tensor(full, mesh, {Shard{1}}));
  EXPECT_EQ(from_dt.metadata().shards_metadata, chunk(1).build_metadata({5, 4}, {}).shards_metadata);
  EXPECT_TRUE(at::equal(from_dt.local_tensor(), full.narrow(1, r, 1)));
  // Passing the mesh: it must be the spec's mesh.
  ShardedTensor st = sharded::shard_tensor(full, chunk(0));
  EXPECT_TRUE(at::equal(full_tensor(st.to_dtensor(&mesh)), full));
  ShardedTensor reversed = sharded::shard_tensor(full, chunk(0, {3, 2, 1, 0}));
  EXPECT_PRED2(
      contains, error_of([&] { reversed.to_dtensor(&mesh); }),
      "ShardedTensor.to_dtensor: " + mesh.to_string() + " is not the 1-D mesh of the spec's ranks [3, 2, 1, 0]");
  // Requires grad: the DTensor is a leaf that does.
  at::Tensor leaf = sharded::shard_tensor(full.clone().requires_grad_(), chunk(0)).to_dtensor(&mesh);
  EXPECT_TRUE(leaf.requires_grad());
  EXPECT_TRUE(leaf.is_leaf());
  // Not convertible.
  st.reshard(ChunkShardingSpec(0, cpu_ranks({0, 1, 2, 3, 0, 1, 2, 3})));
  EXPECT_PRED2(contains, error_of([&] { st.to_dtensor(); }),
               "ShardedTensor.to_dtensor: needs a ChunkShardingSpec layout with one shard on each rank");
  EXPECT_PRED2(contains, error_of([&] { ShardedTensor::from_dtensor(distribute_tensor(full, mesh, {Replicate{}})); }),
               "ShardedTensor.from_dtensor: needs a DTensor with placement Shard(dim) on a 1-D mesh, got");
  EXPECT_PRED2(contains, error_of([&] { ShardedTensor::from_dtensor(full); }), "the tensor is not a DTensor");
}

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, LoadWithProcessGroupSetsTheLoadingGroup) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  EXPECT_EQ(sharded::get_current_process_group().get(), comm::default_group().get());
  comm::GroupPtr pair = comm::new_group({2, 3});  // collective; nullptr on ranks 0 and 1
  if (pair) {
    at::Tensor in = full_tensor_of(4, 2);
    ShardedTensor st = sharded::shard_tensor(in, chunk(0, {2, 3}), 0, pair);
    EXPECT_TRUE(at::equal(st.local_tensor(), in.narrow(0, 2 * (r - 2), 2)));
    sharded::ShardedTensorState saved = st.state();
    EXPECT_EQ(saved.local_rank, r - 2);
    EXPECT_EQ(saved.global_rank, r);
    {
      sharded::LoadWithProcessGroupGuard guard(pair);
      EXPECT_EQ(sharded::get_current_process_group().get(), pair.get());
      EXPECT_PRED2(contains, error_of([&] { sharded::LoadWithProcessGroupGuard nested(pair); }),
                   "ProcessGroup already set by previous \"load_with_process_group\" context manager");
      ShardedTensor loaded = ShardedTensor::from_state(saved);
      EXPECT_EQ(loaded.process_group().get(), pair.get());
      EXPECT_TRUE(at::equal(loaded.local_tensor(), st.local_tensor()));
      at::Tensor g = loaded.gather(0);  // collective over the pair only
      if (r == 2) EXPECT_TRUE(at::equal(g, in));
    }
    // Outside the guard the default group is used, where this rank's rank differs.
    EXPECT_EQ(sharded::get_current_process_group().get(), comm::default_group().get());
    EXPECT_PRED2(
        contains, error_of([&] { ShardedTensor::from_state(saved); }),
        "Local rank at save time was " + std::to_string(r - 2) + ", but at load time was " + std::to_string(r));
    auto moved = saved;
    moved.global_world_size = 8;
    sharded::LoadWithProcessGroupGuard guard(pair);
    EXPECT_PRED2(contains, error_of([&] { ShardedTensor::from_state(moved); }),
                 "Global world size at save time was 8, but at load time was 4");
    moved = saved;
    moved.global_rank = 0;
    EXPECT_PRED2(contains, error_of([&] { ShardedTensor::from_state(moved); }),
                 "Global rank at save time was 0, but at load time was " + std::to_string(r));
  }
  EXPECT_PRED2(contains, error_of([] { sharded::LoadWithProcessGroupGuard guard(nullptr); }),
               "load_with_process_group: the process group is null");
}

// ---- Factories (test_sharded_tensor.py test_create_sharded_tensor_with_ones / _zeros / _full /
// _rand, test_sharded_tensor_like) --------------------------------------------------------------

DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, FactoriesCreateOnlyTheLocalShards) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  ChunkShardingSpec spec(0, cpu_ranks({0, 1, 2, 3}));
  const int64_t h = 10, w = 20;
  const int64_t expected_h = r == 3 ? 1 : 3;  // ceil(10 / 4) rows, the last rank the rest
  ShardedTensor st = sharded::ones(spec, {h, w});
  ASSERT_EQ(st.local_shards().size(), 1u);
  EXPECT_EQ(st.size(), (std::vector<int64_t>{h, w}));
  EXPECT_TRUE(at::equal(st.local_tensor(), at::ones({expected_h, w})));
  EXPECT_TRUE(at::equal(sharded::zeros(spec, {h, w}).local_tensor(), at::zeros({expected_h, w})));
  ShardedTensor f = sharded::full(spec, {h, w}, 2.5, at::TensorOptions().dtype(at::kDouble));
  EXPECT_EQ(f.dtype(), at::kDouble);
  EXPECT_TRUE(at::equal(f.local_tensor(), at::full({expected_h, w}, 2.5, at::kDouble)));
  EXPECT_EQ(sharded::empty(spec, {h, w}).local_tensor().sizes(), (c10::IntArrayRef{expected_h, w}));
  at::Tensor u = sharded::rand(spec, {h, w}).local_tensor();
  EXPECT_EQ(u.sizes(), (c10::IntArrayRef{expected_h, w}));
  EXPECT_TRUE(u.ge(0).all().item<bool>() && u.lt(1).all().item<bool>());
  EXPECT_EQ(sharded::randn(spec, {h, w}).local_tensor().sizes(), (c10::IntArrayRef{expected_h, w}));
  // requires_grad and *_like keep size, spec, dtype and requires_grad.
  ShardedTensor g = sharded::zeros(spec, {h, w}, at::TensorOptions().requires_grad(true));
  EXPECT_TRUE(g.local_tensor().requires_grad());
  ShardedTensor like = sharded::full_like(g, 7);
  EXPECT_EQ(*like.sharding_spec(), spec);
  EXPECT_TRUE(like.local_tensor().requires_grad());
  EXPECT_TRUE(at::equal(like.local_tensor().detach(), at::full({expected_h, w}, 7.0f)));
  EXPECT_TRUE(at::equal(sharded::ones_like(f).local_tensor(), at::ones({expected_h, w}, at::kDouble)));
  EXPECT_EQ(sharded::rand_like(f).local_tensor().scalar_type(), at::kDouble);
  // ... unless dtype / requires_grad are given (torch.zeros_like(st, dtype=..., requires_grad=...)).
  ShardedTensor z = sharded::zeros_like(f, at::TensorOptions().dtype(at::kHalf).requires_grad(true));
  EXPECT_EQ(z.dtype(), at::kHalf);
  EXPECT_TRUE(z.local_tensor().requires_grad());
  EXPECT_EQ(*z.sharding_spec(), spec);
  EXPECT_FALSE(sharded::randn_like(g, at::TensorOptions().requires_grad(false)).local_tensor().requires_grad());
  // A spec placing shards on a rank outside the group names it.
  ChunkShardingSpec bad(0, cpu_ranks({0, 1, 2, 5}));
  EXPECT_PRED2(contains, error_of([&] { sharded::zeros(bad, {h, w}); }), "Global rank 5 does not exist");
}

// test_sharded_tensor.py TestShardedTensorEnumerable (test_grid_sharding, test_uneven_shards)
// and TestShardedTensorChunked test_partial_world_size: specs placing shards on some ranks only.
DTENSOR_TEST_BOTH(ShardedGloo, ShardedThreads, EnumerableAndSubsetSpecs) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  const at::Tensor full = full_tensor_of(10, 10);
  // The 2x2 grid: one 5x5 block per rank, by factory and by shard().
  EnumerableShardingSpec grid(grid_10x10());
  ShardedTensor ones = sharded::ones(grid, {10, 10});
  ASSERT_EQ(ones.local_shards().size(), 1u);
  EXPECT_TRUE(at::equal(ones.local_tensor(), at::ones({5, 5})));
  EXPECT_EQ(ones.local_shards()[0].metadata, grid_10x10()[static_cast<size_t>(r)]);
  EXPECT_EQ(*ones.sharding_spec(), grid);
  EXPECT_EQ(*sharded::zeros_like(ones).sharding_spec(), grid);
  ShardedTensor st = grid.shard(full + r, /*src_rank=*/1);  // rank 1's values
  EXPECT_TRUE(at::equal(st.local_tensor(), (full + 1).narrow(0, r / 2 * 5, 5).narrow(1, r % 2 * 5, 5)));
  at::Tensor gathered = st.gather(0);
  if (r == 0) EXPECT_TRUE(at::equal(gathered, full + 1));
  // Uneven: rank 0 holds two shards, rank 1 one, ranks 2 and 3 none.
  std::vector<ShardMetadata> uneven = {ShardMetadata({0, 0}, {5, 10}, RemoteDevice("rank:0/cpu")),
                                       ShardMetadata({5, 0}, {5, 4}, RemoteDevice("rank:1/cpu")),
                                       ShardMetadata({5, 4}, {5, 6}, RemoteDevice("rank:0/cpu"))};
  ShardedTensor u = EnumerableShardingSpec(uneven).shard(full);
  EXPECT_EQ(u.local_shards().size(), r == 0 ? 2u : r == 1 ? 1u : 0u);
  for (const auto& sh : u.local_shards())
    EXPECT_TRUE(at::equal(sh.tensor, full.narrow(0, sh.metadata.shard_offsets()[0], sh.metadata.shard_sizes()[0])
                                         .narrow(1, sh.metadata.shard_offsets()[1], sh.metadata.shard_sizes()[1])));
  at::Tensor u_full = u.gather(3);
  if (r == 3) EXPECT_TRUE(at::equal(u_full, full));
  // A ChunkShardingSpec on ranks 2 and 3 of the 4 (test_partial_world_size).
  ChunkShardingSpec partial(0, cpu_ranks({2, 3}));
  ShardedTensor e = sharded::empty(partial, {10, 20});
  EXPECT_EQ(e.metadata().shards_metadata.size(), 2u);
  if (r >= 2) {
    ASSERT_EQ(e.local_shards().size(), 1u);
    EXPECT_EQ(e.local_tensor().sizes(), (c10::IntArrayRef{5, 20}));
    EXPECT_EQ(e.local_shards()[0].metadata.shard_offsets(), (std::vector<int64_t>{(r - 2) * 5, 0}));
  } else {
    EXPECT_TRUE(e.local_shards().empty());
  }
  ShardedTensor p = partial.shard(full + r, /*src_rank=*/0);
  if (r >= 2) EXPECT_TRUE(at::equal(p.local_tensor(), full.narrow(0, (r - 2) * 5, 5)));
  else EXPECT_TRUE(p.local_shards().empty());
  EXPECT_EQ(*p.sharding_spec(), partial);
  at::Tensor p_full = p.gather(1);
  if (r == 1) EXPECT_TRUE(at::equal(p_full, full));
  // Still one placement per rank at most.
  EXPECT_PRED2(contains, error_of([&] { ChunkShardingSpec(0, cpu_ranks({2, 2})).shard(full); }),
               "rank 2 holds several placements");
}

}  // namespace
}  // namespace dtensor
