// converters/samples/samples.h: the families of the op sample database (op_db.h). Each
// family lives in its own file and adds its ops' samples to the database; op_db() calls
// every function declared here.
#pragma once

#include "converters/op_db.h"

#include <string>
#include <utility>
#include <vector>

namespace dtensor {
namespace testing {
namespace samples {

void add_pointwise_samples(OpDb& db);
void add_reduction_samples(OpDb& db);
void add_matrix_samples(OpDb& db);
void add_view_samples(OpDb& db);
void add_tensor_samples(OpDb& db);
void add_index_samples(OpDb& db);
void add_conv_samples(OpDb& db);
void add_pool_samples(OpDb& db);
void add_random_samples(OpDb& db);
void add_embedding_samples(OpDb& db);
void add_norm_samples(OpDb& db);
void add_softmax_loss_samples(OpDb& db);
void add_linalg_samples(OpDb& db);

// ---- helpers shared by the sample files -------------------------------------------------------
using Samples = std::vector<OpSample>;
using Kwargs = std::vector<std::pair<std::string, c10::IValue>>;

// Adds `kwargs` to every sample.
inline Samples with_kwargs(Samples s, const Kwargs& kwargs) {
  for (auto& sample : s)
    for (const auto& kv : kwargs) sample.kw(kv.first, kv.second);
  return s;
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
