// dtensor/comm/object_collectives.cpp: byte strings over tensor collectives. Each call first
// exchanges lengths, then the bytes padded to the longest.
#include "dtensor/comm/object_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

namespace dtensor {
namespace comm {
namespace detail {

namespace {
at::Tensor to_tensor(const std::string& s, int64_t padded) {
  at::Tensor t = at::zeros({std::max<int64_t>(padded, 1)}, at::kByte);
  if (!s.empty()) std::memcpy(t.data_ptr<uint8_t>(), s.data(), s.size());
  return t;
}
std::string from_tensor(const at::Tensor& t, int64_t len) {
  return std::string(reinterpret_cast<const char*>(t.contiguous().data_ptr<uint8_t>()), len);
}
}  // namespace

std::vector<std::string> all_gather_bytes(Group& g, const std::string& bytes) {
  const int n = g.size();
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  at::Tensor lens = at::empty({n}, at::kLong);
  g.all_gather_into(lens, len);
  const int64_t max_len = std::max<int64_t>(lens.max().item<int64_t>(), 1);
  at::Tensor all = at::empty({n * max_len}, at::kByte);
  g.all_gather_into(all, to_tensor(bytes, max_len));
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.push_back(from_tensor(all.narrow(0, r * max_len, max_len), lens[r].item<int64_t>()));
  return out;
}

std::string broadcast_bytes(Group& g, const std::string& bytes, int src) {
  check_rank_arg(g, "broadcast_object", "src", src);
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  g.broadcast(len, src);
  const int64_t n = len.item<int64_t>();
  at::Tensor data = to_tensor(g.rank() == src ? bytes : std::string(), n);
  g.broadcast(data, src);
  return from_tensor(data, n);
}

std::vector<std::string> gather_bytes(Group& g, const std::string& bytes, int dst) {
  check_rank_arg(g, "gather_object", "dst", dst);
  // Lengths via all_gather so every rank knows the padded size.
  at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  at::Tensor lens = at::empty({g.size()}, at::kLong);
  g.all_gather_into(lens, len);
  const int64_t max_len = std::max<int64_t>(lens.max().item<int64_t>(), 1);
  std::vector<at::Tensor> outs;
  g.gather(to_tensor(bytes, max_len), outs, dst);
  std::vector<std::string> res;
  if (g.rank() == dst)
    for (int r = 0; r < g.size(); ++r) res.push_back(from_tensor(outs[r], lens[r].item<int64_t>()));
  return res;
}

std::string scatter_bytes(Group& g, const std::vector<std::string>& bytes, int src) {
  check_rank_arg(g, "scatter_object", "src", src);
  at::Tensor lens = at::zeros({g.size()}, at::kLong);
  if (g.rank() == src) {
    TORCH_CHECK(static_cast<int>(bytes.size()) == g.size(), "scatter_object on ", g.describe(),
                ": src passed ", bytes.size(), " values, expected ", g.size());
    for (int r = 0; r < g.size(); ++r) lens[r] = static_cast<int64_t>(bytes[r].size());
  }
  g.broadcast(lens, src);
  const int64_t max_len = std::max<int64_t>(lens.max().item<int64_t>(), 1);
  std::vector<at::Tensor> ins;
  if (g.rank() == src)
    for (auto& b : bytes) ins.push_back(to_tensor(b, max_len));
  at::Tensor out = at::empty({max_len}, at::kByte);
  g.scatter(out, ins, src);
  return from_tensor(out, lens[g.rank()].item<int64_t>());
}

}  // namespace detail
}  // namespace comm
}  // namespace dtensor
