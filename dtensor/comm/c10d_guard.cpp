// dtensor/comm/c10d_guard.cpp: see c10d_guard.h.
#include "dtensor/comm/c10d_guard.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>

namespace dtensor {
namespace comm {

namespace {
std::atomic<bool> g_check_default{false};
thread_local int t_inside = 0;  // > 0 while a guard runs: calls on the group go straight through

struct Inside {
  Inside() { ++t_inside; }
  ~Inside() { --t_inside; }
};

std::string sig_of(const at::Tensor& t) {
  std::ostringstream os;
  os << t.scalar_type() << t.sizes();
  return os.str();
}

// Dtypes ProcessGroupGloo reduces and moves itself (the same list in libtorch 1.13 and 2.x).
bool gloo_native(at::ScalarType s) {
  switch (s) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kChar:
    case at::kByte:
    case at::kInt:
    case at::kLong: return true;
    default: return false;
  }
}

// The Gloo gaps are fixed where Gloo runs the call: a CPU tensor, or any tensor of a plain
// "gloo" group. NCCL handles NaN, empty tensors and these dtypes itself.
bool via_gloo(const Group& g, const at::Tensor& t) {
  const std::string b = g.backend();
  if (b == "gloo") return true;
  return b.find("gloo") != std::string::npos && t.device().is_cpu();
}

// NOTE: [Call check]
// Every rank all-gathers a fixed-size description of its call (op, dtype, shape, arguments):
// one small collective that every rank makes whatever it was about to call, so ranks that
// disagree all see it and all throw the same CollectiveError, in the format of ThreadGroup's.
constexpr int64_t kCallBytes = 192;
// The check's all-gather is not a collective the caller issued: collective observers
// (CommDebugMode) do not see it. Inside an observed collective it is hidden already; new_subgroup
// is not one (NOTE: [Collective observers]).
class HiddenFromObservers {
 public:
  HiddenFromObservers() : saved_(set_collective_observer(nullptr)) {}
  ~HiddenFromObservers() { set_collective_observer(saved_); }
  HiddenFromObservers(const HiddenFromObservers&) = delete;
  HiddenFromObservers& operator=(const HiddenFromObservers&) = delete;

 private:
  CollectiveObserver* saved_;
};

void check_call(Group& g, const std::string& op, const std::string& args) {
  if (g.size() <= 1 || !check_collectives_enabled()) return;
  const HiddenFromObservers hidden;
  const std::string mine = op + "(" + args + ")";
  at::Tensor in = at::zeros({kCallBytes}, at::kByte);
  std::memcpy(in.data_ptr<uint8_t>(), mine.data(),
              std::min<size_t>(mine.size(), static_cast<size_t>(kCallBytes - 1)));
  at::Tensor all = at::empty({kCallBytes * g.size()}, at::kByte);
  g.all_gather_into(all, in);
  const auto* p = all.data_ptr<uint8_t>();
  auto call_of = [&](int r) { return std::string(reinterpret_cast<const char*>(p + r * kCallBytes)); };
  bool same = true;
  for (int r = 1; r < g.size() && same; ++r) same = call_of(r) == call_of(0);
  if (same) return;
  std::ostringstream os;
  os << "ranks called different collectives (or the same one with mismatched arguments) on "
     << g.describe() << ":";
  for (int r = 0; r < g.size(); ++r) os << " [rank " << r << ": " << call_of(r) << "]";
  throw CollectiveError(os.str());
}

// Runs `fn` on a contiguous version of `t` and copies the result back when it was not.
template <class Fn>
void in_place(at::Tensor& t, Fn fn) {
  if (t.is_contiguous()) {
    fn(t);
  } else {
    at::Tensor c = t.contiguous();
    fn(c);
    t.copy_(c);
  }
}

// A contiguous tensor's bytes as a 1-D uint8 tensor (shares memory).
at::Tensor bytes_of(const at::Tensor& contiguous) {
  return contiguous.reshape({-1}).view(at::kByte);
}

// MAX/MIN keep NaN as on one device: the values travel with a NaN mask (1 for MAX, -1 for
// MIN, so that the same reduction finds any rank's NaN), in one call.
void all_reduce_keep_nan(Group& g, at::Tensor& t, ReduceOp op) {
  in_place(t, [&](at::Tensor& c) {
    at::Tensor flat = c.reshape({-1});
    at::Tensor mask = flat.isnan().to(c.scalar_type());
    if (op == ReduceOp::MIN) mask = mask.neg();
    at::Tensor both = at::cat({flat, mask});
    g.all_reduce(both, op);
    const int64_t n = flat.numel();
    at::Tensor any_nan = both.slice(0, n, 2 * n).ne(0);
    flat.copy_(at::where(any_nan, at::scalar_tensor(std::numeric_limits<double>::quiet_NaN(), c.options()),
                         both.slice(0, 0, n)));
  });
}

// all_reduce of a dtype Gloo lacks, or of floating MAX/MIN; false when Gloo can do it as is.
bool all_reduce_fixed(Group& g, at::Tensor& t, ReduceOp op) {
  const auto s = t.scalar_type();
  const bool maxmin = op == ReduceOp::MAX || op == ReduceOp::MIN;
  if (gloo_native(s)) {
    if (!(maxmin && at::isFloatingType(s))) return false;
    all_reduce_keep_nan(g, t, op);
    return true;
  }
  if (s == at::kBool) {
    if (op == ReduceOp::AVG) return false;  // the adapter's own error
    // As c10d's NCCL backend does: SUM is "any", PRODUCT is "all".
    const ReduceOp byte_op = op == ReduceOp::SUM ? ReduceOp::MAX
                             : op == ReduceOp::PRODUCT ? ReduceOp::MIN : op;
    in_place(t, [&](at::Tensor& c) {
      at::Tensor b = bytes_of(c);
      g.all_reduce(b, byte_op);
    });
    return true;
  }
  if (at::isComplexType(s)) {
    TORCH_CHECK(!maxmin, "all_reduce on ", g.describe(), ": ReduceOp::", to_string(op),
                " is not defined for complex tensors (", s, ")");
    in_place(t, [&](at::Tensor& c) {
      if (op == ReduceOp::PRODUCT) {  // not elementwise on (re, im): gather, multiply here
        at::Tensor all = at::empty({g.size() * c.numel()}, c.options());
        at::Tensor all_bytes = bytes_of(all);
        g.all_gather_into(all_bytes, bytes_of(c).clone());
        c.copy_(all.view({g.size(), -1}).prod(0).view(c.sizes()));
      } else {
        at::Tensor re = at::view_as_real(c);
        g.all_reduce(re, op);  // SUM and AVG act on the parts
      }
    });
    return true;
  }
  // Other dtypes (bfloat16, int16, unsigned, ...): widened, reduced, narrowed back. Integer
  // SUM/PRODUCT wrap as they would in the narrow type (arithmetic modulo 2^k).
  const at::ScalarType wide = at::isFloatingType(s) ? at::kFloat : at::kLong;
  at::Tensor w = t.to(wide);
  if (maxmin && at::isFloatingType(s)) {
    all_reduce_keep_nan(g, w, op);
  } else {
    g.all_reduce(w, op);
  }
  t.copy_(w);
  return true;
}

}  // namespace

void set_check_collectives_default(bool on) { g_check_default = on; }

bool check_collectives_enabled() {
  if (const char* v = std::getenv("DTENSOR_CHECK_COLLECTIVES")) {
    const std::string s(v);
    if (s == "1") return true;
    if (s == "0") return false;
    TORCH_CHECK(s.empty(), "DTENSOR_CHECK_COLLECTIVES='", s, "': expected 1 or 0");
  }
  return g_check_default;
}

namespace guard {

bool all_reduce(Group& g, at::Tensor& t, ReduceOp op) {
  if (t_inside) return false;
  Inside in;
  check_call(g, "all_reduce", sig_of(t) + "," + to_string(op));
  if (t.numel() == 0) return true;
  return via_gloo(g, t) && all_reduce_fixed(g, t, op);
}

bool all_gather_into(Group& g, at::Tensor& out, const at::Tensor& in) {
  if (t_inside) return false;
  Inside guard;
  check_call(g, "all_gather_into", sig_of(in));
  detail::check_all_gather_shapes(g, out, in);
  if (in.numel() == 0) return true;  // every rank's block is empty (same shapes)
  if (!via_gloo(g, in) || gloo_native(in.scalar_type())) return false;
  at::Tensor out_bytes = bytes_of(out);  // contiguous (checked above)
  g.all_gather_into(out_bytes, bytes_of(in.contiguous()));
  return true;
}

bool reduce_scatter_into(Group& g, at::Tensor& out, const at::Tensor& in, ReduceOp op) {
  if (t_inside) return false;
  Inside guard;
  check_call(g, "reduce_scatter_into", sig_of(in) + "," + to_string(op));
  detail::check_reduce_scatter_shapes(g, out, in);
  if (in.numel() == 0) return true;
  // Dtypes Gloo moves are reduce-scattered by the adapter (NOTE: [Composed reduce_scatter]).
  if (!via_gloo(g, in) || gloo_native(in.scalar_type())) return false;
  at::Tensor tmp = in.clone(at::MemoryFormat::Contiguous);
  if (!all_reduce_fixed(g, tmp, op)) g.all_reduce(tmp, op);
  out.copy_(tmp.chunk(g.size(), 0)[g.rank()]);
  return true;
}

bool all_to_all_single(Group& g, at::Tensor& out, const at::Tensor& in,
                       const std::vector<int64_t>& output_splits,
                       const std::vector<int64_t>& input_splits) {
  if (t_inside) return false;
  Inside guard;
  // Shapes may differ between ranks here (uneven splits): the dtype must not.
  check_call(g, "all_to_all_single", std::string(c10::toString(in.scalar_type())));
  if (!via_gloo(g, in) || gloo_native(in.scalar_type())) return false;
  auto splits = detail::resolve_all_to_all_splits(g, out, in, output_splits, input_splits);
  auto row_bytes = [](const at::Tensor& t) {
    return t.dim() == 0 || t.size(0) == 0 ? int64_t{0} : t.numel() / t.size(0) * t.element_size();
  };
  const int64_t rb = std::max(row_bytes(in), row_bytes(out));
  for (auto& s : splits.first) s *= rb;
  for (auto& s : splits.second) s *= rb;
  at::Tensor in_bytes = bytes_of(in.contiguous());
  in_place(out, [&](at::Tensor& c) {
    at::Tensor out_bytes = bytes_of(c);
    g.all_to_all_single(out_bytes, in_bytes, splits.first, splits.second);
  });
  return true;
}

bool broadcast(Group& g, at::Tensor& t, int src) {
  if (t_inside) return false;
  Inside guard;
  check_call(g, "broadcast", sig_of(t) + ",src=" + std::to_string(src));
  if (t.numel() == 0) return true;
  if (!via_gloo(g, t) || gloo_native(t.scalar_type())) return false;
  in_place(t, [&](at::Tensor& c) {
    at::Tensor b = bytes_of(c);
    g.broadcast(b, src);
  });
  return true;
}

bool barrier(Group& g) {
  if (t_inside) return false;
  Inside guard;
  if (g.size() <= 1 || !check_collectives_enabled()) return false;
  check_call(g, "barrier", "");
  // On Gloo the check's all_gather was the barrier: no rank completes it before every rank
  // has sent its call, i.e. entered barrier() (half the closing barrier of every test).
  // NCCL keeps its own barrier (it also synchronises the device).
  return g.backend() == "gloo";
}

bool send(Group& g, const at::Tensor& t, int dst, int tag) {
  if (t_inside) return false;
  Inside guard;
  if (t.numel() == 0) return true;
  if (!via_gloo(g, t) || gloo_native(t.scalar_type())) return false;
  g.send(bytes_of(t.contiguous()), dst, tag);
  return true;
}

bool recv(Group& g, at::Tensor& t, int src, int tag) {
  if (t_inside) return false;
  Inside guard;
  if (t.numel() == 0) return true;
  if (!via_gloo(g, t) || gloo_native(t.scalar_type())) return false;
  in_place(t, [&](at::Tensor& c) {
    at::Tensor b = bytes_of(c);
    g.recv(b, src, tag);
  });
  return true;
}

bool gather(Group& g, const at::Tensor& in, std::vector<at::Tensor>& outs, int dst) {
  if (t_inside) return false;
  Inside guard;
  check_call(g, "gather", sig_of(in) + ",dst=" + std::to_string(dst));
  const bool empty = in.numel() == 0;
  if (!empty && (!via_gloo(g, in) || gloo_native(in.scalar_type()))) return false;
  detail::check_rank_arg(g, "gather", "dst", dst);
  if (empty) {
    if (g.rank() == dst) {
      outs.clear();
      for (int r = 0; r < g.size(); ++r) outs.push_back(at::empty_like(in, at::MemoryFormat::Contiguous));
    }
    return true;
  }
  std::vector<at::Tensor> byte_outs;
  g.gather(bytes_of(in.contiguous()), byte_outs, dst);
  if (g.rank() == dst) {
    outs.clear();
    for (auto& b : byte_outs) outs.push_back(b.view(in.scalar_type()).view(in.sizes()));
  }
  return true;
}

bool scatter(Group& g, at::Tensor& out, const std::vector<at::Tensor>& ins, int src) {
  if (t_inside) return false;
  Inside guard;
  check_call(g, "scatter", sig_of(out) + ",src=" + std::to_string(src));
  if (out.numel() == 0) return true;
  if (!via_gloo(g, out) || gloo_native(out.scalar_type())) return false;
  std::vector<at::Tensor> byte_ins;
  if (g.rank() == src) {
    TORCH_CHECK(static_cast<int>(ins.size()) == g.size(), "scatter on ", g.describe(),
                ": src rank passed ", ins.size(), " tensors, expected ", g.size());
    for (auto& t : ins) {
      TORCH_CHECK(t.sizes() == out.sizes() && t.scalar_type() == out.scalar_type(), "scatter on ",
                  g.describe(), ": an input is ", t.scalar_type(), t.sizes(), " but the output is ",
                  out.scalar_type(), out.sizes());
      byte_ins.push_back(bytes_of(t.contiguous()));
    }
  }
  in_place(out, [&](at::Tensor& c) {
    at::Tensor b = bytes_of(c);
    g.scatter(b, byte_ins, src);
  });
  return true;
}

bool new_subgroup(Group& g, const std::vector<int>& ranks) {
  if (t_inside) return false;
  Inside guard;
  std::ostringstream os;
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? "," : "") << ranks[i];
  check_call(g, "new_subgroup", "[" + os.str() + "]");
  return false;
}

}  // namespace guard
}  // namespace comm
}  // namespace dtensor
