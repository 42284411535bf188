// Context parallel (dtensor/experimental/context_parallel.h, NOTE: [Context parallel]), tested
// as PyTorch's test/distributed/tensor/test_attention.py does: attention on the sequence sharded
// over the ranks (ring attention, reached through scaled_dot_product_attention inside
// context_parallel) equals the single-device attention, in its output and in the gradients of
// q, k and v, causal or not, with and without the head-tail load balancer; all-to-alls counted
// (W - 1 in forward, 2W - 1 in backward); buffers sharded and restored; the balancer's layout;
// and the errors.
#include "dtensor/compat.h"
#include "dtensor/experimental/context_parallel.h"
#include "dtensor/experimental/load_balancer.h"
#include "dtensor/nn/functional.h"
#include "harness/harness.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

using experimental::context_parallel;
using experimental::context_parallel_unshard;
using experimental::ContextParallelOptions;
using experimental::HeadTailLoadBalancer;
using testing::contains;
using testing::error_of;
using testing::values;
namespace F = nn::functional;

class ContextParallelTest : public testing::DTensorOpTestBase {};

bool close(const at::Tensor& a, const at::Tensor& b) { return at::allclose(a, b, 1e-4, 1e-5); }

// The balancer's layout, written out: 2W chunks, rank r gets chunks r and 2W-1-r.
TEST(HeadTailLoadBalancer, GivesEachRankAHeadAndATailChunk) {
  HeadTailLoadBalancer lb(8, 2);
  EXPECT_TRUE(at::equal(lb.generate_indices(), at::tensor({0, 1, 6, 7, 2, 3, 4, 5}, at::kLong)));
  const at::Tensor x = at::arange(24, at::kFloat).view({3, 8});
  EXPECT_TRUE(at::equal(x.index_select(1, lb.generate_indices()).index_select(1, lb.generate_indices(true)), x));
  EXPECT_TRUE(at::equal(lb.shard(x, 1, 1), x.index_select(1, at::tensor({2, 3, 4, 5}, at::kLong))));
  EXPECT_TRUE(at::equal(lb.unshard(at::cat({lb.shard(x, -1, 0), lb.shard(x, -1, 1)}, 1), 1), x));
  EXPECT_PRED2(contains, error_of([] { HeadTailLoadBalancer(10, 4); }), "sequence length 10 is not divisible by 2 * world_size = 8");
  EXPECT_PRED2(contains, error_of([&] { lb.shard(at::zeros({3, 6}), 1, 0); }), "has 6 entries along dim 1");
}

// test_ring_attention_sdpa: output and gradients against the single-device attention.
DTENSOR_TEST_F(ContextParallelTest, RingAttentionEqualsSingleDeviceAttention) {
  const int64_t w = ranks(), seq = 4 * w;
  const at::Tensor q = values({2, 3, seq, 8}, 0.1), k = values({2, 3, seq, 8}, 1.3), v = values({2, 3, seq, 5}, 2.7);
  const at::Tensor dout = values({2, 3, seq, 5}, 4.2);
  testing::CommCounter counting;
  auto mesh = init_device_mesh(device_type(), {w}, {}, group_ptr());
  for (bool causal : {false, true}) {
    for (bool balance : {true, false}) {
      const std::string what = std::string(causal ? "causal" : "not causal") + (balance ? ", balanced" : ", contiguous");
      std::vector<at::Tensor> ref_in{q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_()};
      const at::Tensor ref = compat::scaled_dot_product_attention(ref_in[0], ref_in[1], ref_in[2], {}, 0.0, causal);
      ref.backward(dout);
      ContextParallelOptions o;
      o.load_balance = balance;
      at::Tensor cq = q.clone(), ck = k.clone(), cv = v.clone(), cd = dout.clone();
      auto cp = context_parallel(mesh, {cq, ck, cv, cd}, {2, 2, 2, 2}, {}, o);
      EXPECT_EQ(cq.size(2), seq / w) << what;
      cq.requires_grad_(true), ck.requires_grad_(true), cv.requires_grad_(true);
      counting.reset();
      const at::Tensor out = F::scaled_dot_product_attention(cq, ck, cv, {}, 0.0, causal);
      EXPECT_EQ(counting.collectives(), w - 1) << what;
      EXPECT_EQ(counting.counts()[funcol::all_to_all_single], w - 1) << what;
      out.backward(cd);
      EXPECT_EQ(counting.counts()[funcol::all_to_all_single], w == 1 ? 0 : 3 * w - 2) << what;  // none on one rank
      const auto full = context_parallel_unshard(mesh, {out, cq.grad(), ck.grad(), cv.grad()}, {2, 2, 2, 2}, o);
      EXPECT_TRUE(close(full[0], ref)) << what << ": output " << (full[0] - ref).abs().max().item<double>();
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(close(full[i + 1], ref_in[i].grad())) << what << ": gradient of input " << i << " is "
                                                           << (full[i + 1] - ref_in[i].grad()).abs().max().item<double>() << " apart";
    }
  }
}

// The buffers hold their local parts inside the scope and their whole values after it, also
// when the body throws; no_restore_buffers stay sharded. Attention outside the scope is
// libtorch's again.
DTENSOR_TEST_F(ContextParallelTest, BuffersAreShardedAndRestored) {
  auto mesh = build_device_mesh();
  const int64_t w = ranks(), r = rank();
  const at::Tensor tokens0 = at::arange(2 * 4 * w, at::kLong).view({2, 4 * w});
  const at::Tensor table0 = values({4 * w, 3});
  at::Tensor tokens = tokens0.clone(), table = table0.clone(), labels = tokens0.clone();
  const HeadTailLoadBalancer lb(4 * w, w);
  {
    auto cp = context_parallel(mesh, {tokens, table, labels}, {1, 0, -1}, {labels});
    EXPECT_TRUE(at::equal(tokens, lb.shard(tokens0, 1, r)));
    EXPECT_TRUE(at::equal(table, lb.shard(table0, 0, r)));
    EXPECT_TRUE(at::equal(labels, lb.shard(tokens0, 1, r)));
  }
  EXPECT_TRUE(at::equal(tokens, tokens0));
  EXPECT_TRUE(at::equal(table, table0));
  EXPECT_TRUE(at::equal(labels, lb.shard(tokens0, 1, r)));  // not restored
  try {
    auto cp = context_parallel(mesh, {tokens}, {1});
    throw std::runtime_error("the body failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(at::equal(tokens, tokens0));
  // Outside the scope attention is the single-device one on whatever it is given.
  const at::Tensor q = values({1, 2, 4, 4});
  EXPECT_TRUE(close(F::scaled_dot_product_attention(q, q, q, {}, 0.0, true),
                    compat::scaled_dot_product_attention(q, q, q, {}, 0.0, true)));
}

// Bad input raises on every rank, naming what is wrong, and changes no buffer.
DTENSOR_TEST_F(ContextParallelTest, BadInputIsAnErrorOnEveryRank) {
  auto mesh = build_device_mesh();
  const int64_t w = ranks();
  at::Tensor odd = at::zeros({2, 2 * w + 1});
  EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh, {odd}, {1}); }),
               "buffer 0 has sequence length " + std::to_string(2 * w + 1) + " along dim 1, not divisible by " +
                   std::to_string(2 * w));
  EXPECT_EQ(odd.size(1), 2 * w + 1);
  at::Tensor x = at::zeros({2, 4 * w}), y = at::zeros({2, 4 * w});
  EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh, {x, y}, {1}); }), "2 buffers but 1 buffer_seq_dims");
  EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh, {x}, {2}); }), "has no dim 2");
  at::Tensor p = at::zeros({4 * w}).requires_grad_();
  EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh, {p}, {0}); }), "requires grad");
  EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh, {x}, {1}, {y}); }),
               "not one of the buffers");
  EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh, {x, y, x}, {1, 1, 1}); }),
               "buffer 2 is buffer 0 again");
  EXPECT_EQ(x.size(1), 4 * w);
  if (w % 2 == 0) {
    auto mesh2 = init_device_mesh(device_type(), {2, w / 2}, {"dp", "cp"}, group_ptr());
    EXPECT_PRED2(contains, error_of([&] { auto cp = context_parallel(mesh2, {x}, {1}); }), "the mesh must be 1-D");
  }
  auto cp = context_parallel(mesh, {x}, {1});
  EXPECT_PRED2(contains, error_of([&] { auto inner = context_parallel(mesh, {y}, {1}); }), "already open");
  const at::Tensor q = values({1, 2, 4, 4});
  EXPECT_PRED2(contains, error_of([&] { F::scaled_dot_product_attention(q, q, q, at::ones({4, 4}, at::kBool)); }),
               "attn_mask is not supported by ring attention");
  EXPECT_PRED2(contains, error_of([&] { F::scaled_dot_product_attention(q, q, q, {}, 0.1); }),
               "dropout_p = 0.1 is not supported");
  EXPECT_PRED2(contains, error_of([&] { F::scaled_dot_product_attention(q, q, values({1, 2, 3, 4}), {}, 0.0, true); }),
               "do not match");
  EXPECT_PRED2(contains, error_of([&] { F::scaled_dot_product_attention(q, values({1, 2, 6, 4}), values({1, 2, 6, 4}), {}, 0.0, true); }),
               "a causal mask needs queries and keys of one sequence");
  if (w > 1) {
    const at::Tensor q3 = values({1, 2, 3, 4});
    EXPECT_PRED2(contains, error_of([&] { F::scaled_dot_product_attention(q3, q3, q3, {}, 0.0, true); }),
                 "odd length 3");
  }
}

}  // namespace
}  // namespace dtensor
