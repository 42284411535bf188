// dtensor/tensor/placement_helpers.cpp: PyTorch's Shard._split_tensor and _unpad_tensor, and
// shard_dim_alltoall (see dtensor.h).
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/redistribute.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace dtensor {

std::vector<at::Tensor> split_tensor(const Shard& shard, const at::Tensor& tensor, int64_t num_chunks, bool with_padding,
                                     std::vector<int64_t>* pad_sizes) {
  TORCH_CHECK(num_chunks > 0, "split_tensor: num_chunks must be positive, got ", num_chunks);
  const int64_t d = normalize_shard_dim(shard.dim, tensor.dim());
  if (shard.split_factor > 1) {
    // PyTorch's _StridedShard._split_tensor (on its own mesh dim): cut into split_factor
    // pieces, cut each of those into num_chunks, and piece i is the i-th cut of every piece,
    // concatenated (8 rows, sf 2, 4 chunks: rows {0,4}, {1,5}, {2,6}, {3,7}); padding goes to
    // the longest piece.
    std::vector<std::vector<at::Tensor>> cuts;
    for (const at::Tensor& piece : split_tensor(Shard{d}, tensor, shard.split_factor))
      cuts.push_back(split_tensor(Shard{d}, piece, num_chunks));
    std::vector<at::Tensor> out;
    int64_t longest = 0;
    for (int64_t i = 0; i < num_chunks; ++i) {
      std::vector<at::Tensor> parts;
      for (const auto& c : cuts) parts.push_back(c[static_cast<size_t>(i)]);
      out.push_back(at::cat(parts, d));
      longest = std::max(longest, out.back().size(d));
    }
    if (pad_sizes) pad_sizes->clear();
    for (at::Tensor& piece : out) {
      const int64_t pad = longest - piece.size(d);
      if (with_padding && pad > 0) {
        auto shape = piece.sizes().vec();
        shape[static_cast<size_t>(d)] = pad;
        piece = at::cat({piece, at::zeros(shape, piece.options())}, d);
      }
      if (pad_sizes) pad_sizes->push_back(pad);
    }
    return out;
  }
  const int64_t n = tensor.size(d);
  const int64_t full = shard_size_and_offset(n, num_chunks, 0).first;
  std::vector<at::Tensor> out;
  if (pad_sizes) pad_sizes->clear();
  for (int64_t i = 0; i < num_chunks; ++i) {
    auto so = shard_size_and_offset(n, num_chunks, i);
    at::Tensor piece = tensor.narrow(d, std::min(so.second, n), so.first).contiguous();
    const int64_t pad = full - so.first;
    if (with_padding && pad > 0) {
      auto shape = piece.sizes().vec();
      shape[static_cast<size_t>(d)] = pad;
      piece = at::cat({piece, at::zeros(shape, piece.options())}, d);
    }
    if (pad_sizes) pad_sizes->push_back(pad);
    out.push_back(piece);
  }
  return out;
}

at::Tensor unpad_tensor(const Shard& shard, const at::Tensor& tensor, int64_t pad_size) {
  const int64_t d = normalize_shard_dim(shard.dim, tensor.dim());
  TORCH_CHECK(pad_size >= 0 && pad_size <= tensor.size(d), "unpad_tensor: pad_size ", pad_size,
              " out of range for dim ", d, " of size ", tensor.size(d));
  return pad_size == 0 ? tensor : tensor.narrow(d, 0, tensor.size(d) - pad_size);
}

at::Tensor shard_dim_alltoall(const at::Tensor& input, int64_t gather_dim, int64_t shard_dim, const DeviceMesh& mesh,
                              int64_t mesh_dim) {
  TORCH_CHECK(mesh_dim >= 0 && mesh_dim < mesh.ndim(), "shard_dim_alltoall: mesh_dim ", mesh_dim, " out of range for ",
              mesh.to_string());
  const int64_t a = normalize_shard_dim(gather_dim, input.dim());
  const int64_t b = normalize_shard_dim(shard_dim, input.dim());
  std::vector<int64_t> global = input.sizes().vec();
  global[static_cast<size_t>(a)] *= mesh.size(mesh_dim);
  std::vector<Placement> from(static_cast<size_t>(mesh.ndim()), Replicate{}), to = from;
  from[static_cast<size_t>(mesh_dim)] = Shard{a};
  to[static_cast<size_t>(mesh_dim)] = Shard{b};
  // Only mesh dim `mesh_dim` moves; the others keep `input` as it is (Replicate -> Replicate).
  TensorMeta meta;
  meta.shape = global;
  const auto st = c10::contiguous_strides(global);
  meta.stride = std::vector<int64_t>(st.begin(), st.end());
  meta.dtype = input.scalar_type();
  DTensorSpec spec(mesh, from, meta);
  at::NoGradGuard no_grad;
  return detail::redistribute_local(input.contiguous(), spec, to);
}

}  // namespace dtensor
