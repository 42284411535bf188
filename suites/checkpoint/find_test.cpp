// dtensor/checkpoint lookups: find_tensor_shard, find_shard and find_state_dict_object over plain
// tensors, DTensors, ShardedTensors and other objects, with every error of PyTorch's checkpoint/utils.py; as 4 ranks
// (gloo processes and threads) since sharded values need a group.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/comm.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace {

using checkpoint::MetadataIndex;
using testing::contains;
using testing::error_of;

TEST(FindTensorShard, PlainTensorsAreFoundOnlyAtTheOrigin) {
  at::Tensor t = at::ones({4, 2});
  EXPECT_TRUE(checkpoint::find_tensor_shard(t, MetadataIndex("w")).is_same(t));
  EXPECT_TRUE(checkpoint::find_tensor_shard(t, MetadataIndex("w", {{0, 0}})).is_same(t));
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_tensor_shard(t, MetadataIndex("w", {{2, 0}})); }),
               "FQN: 'w' is not a ShardedTensor, can't find by offset: '[2, 0]'");
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_tensor_shard(t, MetadataIndex("w", {{0}})); }),
               "can't find by offset: '[0]'");
}

TEST(FindStateDictObject, ObjectsAndMissingNames) {
  checkpoint::StateDict sd{
      {"step", c10::IValue(int64_t{7})}, {"w", at::ones({2})}, {"boxed", c10::IValue(at::zeros({3}))}};
  EXPECT_EQ(std::get<c10::IValue>(checkpoint::find_state_dict_object(sd, MetadataIndex("step"))).toInt(), 7);
  EXPECT_TRUE(std::get<at::Tensor>(checkpoint::find_state_dict_object(sd, MetadataIndex("w", {{0}}))).is_same(
      std::get<at::Tensor>(sd.at("w"))));
  // A tensor boxed in an IValue is a tensor.
  EXPECT_EQ(std::get<at::Tensor>(checkpoint::find_state_dict_object(sd, MetadataIndex("boxed"))).numel(), 3);
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_state_dict_object(sd, MetadataIndex("opt")); }),
               "Could not find FQN: 'opt'");
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_state_dict_object(sd, MetadataIndex("step", {{0}})); }),
               "FQN: 'step' is not a ShardedTensor, can't find by offset: '[0]'");
}

DTENSOR_RANK_FIXTURES(FindGloo, FindThreads);

DTENSOR_TEST_BOTH(FindGloo, FindThreads, ShardsOfShardedTensorsAndDTensors) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // another rank's shard
  const int r = t.rank(), n = t.ranks();
  std::vector<sharded::RemoteDevice> one_each, two_each;  // the ShardedTensor lives on the CPU
  for (int i = 0; i < n; ++i) one_each.emplace_back("rank:" + std::to_string(i) + "/cpu");
  for (int i = 0; i < 2 * n; ++i) two_each.emplace_back("rank:" + std::to_string(i % n) + "/cpu");
  const at::Tensor full = at::arange(4 * n, at::kFloat).view({2 * n, 2});
  // Two shards per rank: rows r and r + n.
  sharded::ShardedTensor st = sharded::shard_tensor(full, sharded::ChunkShardingSpec(0, one_each));
  st.reshard(sharded::ChunkShardingSpec(0, two_each));
  const std::vector<int64_t> second{r + n, 0};
  EXPECT_TRUE(at::equal(checkpoint::find_tensor_shard(st, MetadataIndex("w", second)), full[r + n].unsqueeze(0)));
  // The index hint: right, wrong, out of range: the result is the same.
  for (int64_t hint : {1, 0, 5, -1})
    EXPECT_EQ(checkpoint::find_shard(st, MetadataIndex("w", second, hint)).metadata.shard_offsets(), second);
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_shard(st, MetadataIndex("w")); }),
               "Cannot lookup w since its a ShardedTensor and no offset was provided");
  const int other = (r + 1) % n;
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_tensor_shard(st, MetadataIndex("w", {{other, 0}})); }),
               "Could not find shard at '[" + std::to_string(other) + ", 0]' for FQN: 'w'");
  // A DTensor gives its local tensor (PyTorch's DTensor.__get_tensor_shard__).
  auto mesh = init_device_mesh(t.device_type(), {n});
  at::Tensor dt = distribute_tensor(full.to(c10::Device(t.device_type())), mesh, {Shard{0}});
  EXPECT_TRUE(checkpoint::find_tensor_shard(dt, MetadataIndex("d", {{2 * r, 0}})).is_same(local_tensor(dt)));
  // Through a state dict.
  checkpoint::StateDict sd{{"w", st}, {"d", dt}};
  at::Tensor found = std::get<at::Tensor>(checkpoint::find_state_dict_object(sd, MetadataIndex("w", {{r, 0}})));
  EXPECT_TRUE(at::equal(found, full[r].unsqueeze(0)));
  EXPECT_PRED2(contains, error_of([&] { checkpoint::find_state_dict_object(sd, MetadataIndex("w")); }),
               "Cannot lookup w since its a ShardedTensor and no offset was provided");
}

}  // namespace
}  // namespace dtensor
