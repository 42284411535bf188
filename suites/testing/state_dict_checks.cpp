// suites/testing/state_dict_checks.cpp: see state_dict_checks.h.
#include "suites/testing/state_dict_checks.h"

#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace dtensor {
namespace testing {

void expect_holds(const checkpoint::StateDictValue& v, const at::Tensor& full, const std::string& what) {
  if (const auto* t = std::get_if<at::Tensor>(&v)) {
    if (is_dtensor(*t)) {
      const auto& spec = get_spec(*t);
      auto [shape, offset] = compute_local_shape_and_global_offset(full.sizes(), spec.mesh, spec.placements);
      at::Tensor expected = full;
      for (size_t d = 0; d < shape.size(); ++d) expected = expected.narrow(int64_t(d), offset[d], shape[d]);
      EXPECT_TRUE(at::equal(local_tensor(*t), expected)) << what << ": " << local_tensor(*t) << " vs " << expected;
    } else {
      EXPECT_TRUE(at::equal(*t, full)) << what << ": " << *t << " vs " << full;
    }
    return;
  }
  const auto& st = std::get<sharded::ShardedTensor>(v);
  for (const auto& shard : st.local_shards()) {
    at::Tensor expected = full;
    const auto& m = shard.metadata;
    for (size_t d = 0; d < m.shard_sizes().size(); ++d) {
      expected = expected.narrow(int64_t(d), m.shard_offsets()[d], m.shard_sizes()[d]);
    }
    EXPECT_TRUE(at::equal(shard.tensor, expected)) << what << ": " << shard.tensor << " vs " << expected;
  }
}

}  // namespace testing
}  // namespace dtensor
