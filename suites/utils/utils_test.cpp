// dtensor/utils (torch.distributed.utils): argument packing and container walks, storage
// free/alloc, and, as 4 ranks (gloo processes and threads), the cross-rank shape check and the
// bucketed sync of module states.
#include "dtensor/comm/comm.h"
#include "dtensor/utils/utils.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>
#include <ATen/core/class_type.h>
#include <ATen/core/ivalue_inl.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <string>
#include <utility>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using utils::Kwargs;

// p_assert prints the message and a backtrace to stderr before it raises (PyTorch's _p_assert):
// runs fn, returns (its error, what it printed), so the print is asserted and stays off the log.
std::pair<std::string, std::string> error_and_stderr_of(const std::function<void()>& fn) {
  ::testing::internal::CaptureStderr();
  std::string err = error_of(fn);
  return {err, ::testing::internal::GetCapturedStderr()};
}

// ---- pack / unpack -------------------------------------------------------------------------

TEST(PackKwargs, RoundTripsPositionalAndKeywordValues) {
  // PyTorch's docstring example: pack_kwargs(1, 2, a=3, b=4).
  auto [flat, keys] = utils::pack_kwargs({1, 2}, {{"a", 3}, {"b", 4}});
  ASSERT_EQ(flat.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(flat[i].toInt(), i + 1);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b"}));
  auto [args, kwargs] = utils::unpack_kwargs(flat, keys);
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args[1].toInt(), 2);
  ASSERT_EQ(kwargs.size(), 2u);
  EXPECT_EQ(kwargs[0].first, "a");
  EXPECT_EQ(kwargs[1].second.toInt(), 4);
}

TEST(PackKwargs, WithoutKeywordsEverythingIsPositional) {
  auto [flat, keys] = utils::pack_kwargs({at::ones({2}), "x"});
  EXPECT_TRUE(keys.empty());
  auto [args, kwargs] = utils::unpack_kwargs(flat, keys);
  EXPECT_EQ(args.size(), 2u);
  EXPECT_TRUE(kwargs.empty());
  EXPECT_EQ(args[1].toStringRef(), "x");
}

TEST(PackKwargs, RejectsRepeatedKeywords) {
  EXPECT_PRED2(contains, error_of([] { utils::pack_kwargs({}, {{"a", 1}, {"a", 2}}); }),
               "pack_kwargs: keyword 'a' appears twice");
  EXPECT_PRED2(contains, error_of([] { utils::unpack_kwargs({1, 2}, {"b", "b"}); }),
               "unpack_kwargs: keyword 'b' appears twice");
}

TEST(UnpackKwargs, TooManyKeys) {
  EXPECT_PRED2(contains, error_of([] { utils::unpack_kwargs({1, 2}, {"a", "b", "c"}); }), "too many keys 3 vs. 2");
}

// ---- apply_to_tensors / cast / recursive_to ------------------------------------------------

c10::IValue make_object(const at::Tensor& t, int64_t n) {
  auto type =
      c10::ClassType::create(c10::QualifiedName("dtensor_test.Point"), std::weak_ptr<torch::jit::CompilationUnit>());
  type->addAttribute("t", c10::TensorType::get());
  type->addAttribute("n", c10::IntType::get());
  auto obj = c10::ivalue::Object::create(type, 2);
  obj->setSlot(0, t);
  obj->setSlot(1, n);
  return obj;
}

// [t, (t, "s", None), NamedTuple(a=t, b=2), {"k": t}, Point(t, 7)]
c10::IValue nested(const at::Tensor& t) {
  auto named = c10::TupleType::createNamed(c10::QualifiedName("dtensor_test.Pair"), std::vector<std::string>{"a", "b"},
                                           std::vector<c10::TypePtr>{c10::TensorType::get(), c10::IntType::get()});
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  dict.insert("k", t);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(t);
  list.push_back(c10::ivalue::Tuple::create({t, std::string("s"), c10::IValue()}));
  list.push_back(c10::ivalue::Tuple::createNamed({t, 2}, named));
  list.push_back(dict);
  list.push_back(make_object(t, 7));
  return list;
}

TEST(ApplyToTensors, RebuildsEveryContainerKind) {
  at::Tensor t = at::ones({2});
  c10::IValue in = nested(t);
  c10::IValue out = utils::apply_to_tensors([](const at::Tensor& x) { return x * 3; }, in);
  auto list = out.toList();
  ASSERT_EQ(list.size(), 5u);
  auto is_three = [](const c10::IValue& v) { return at::equal(v.toTensor(), at::full({2}, 3.0)); };
  EXPECT_TRUE(is_three(list.get(0)));
  auto tuple = list.get(1).toTuple();
  EXPECT_TRUE(is_three(tuple->elements()[0]));
  EXPECT_EQ(tuple->elements()[1].toStringRef(), "s");
  EXPECT_TRUE(tuple->elements()[2].isNone());
  auto named = list.get(2).toTuple();
  ASSERT_TRUE(named->type()->name().has_value());
  EXPECT_EQ(named->type()->name()->name(), "Pair");
  EXPECT_TRUE(is_three(named->elements()[0]));
  EXPECT_EQ(named->elements()[1].toInt(), 2);
  EXPECT_TRUE(is_three(list.get(3).toGenericDict().at("k")));
  auto obj = list.get(4).toObject();
  EXPECT_TRUE(is_three(obj->getSlot(0)));
  EXPECT_EQ(obj->getSlot(1).toInt(), 7);
  // The input is untouched: new containers, new object.
  EXPECT_TRUE(at::equal(in.toList().get(4).toObject()->getSlot(0).toTensor(), t));
  EXPECT_NE(obj.get(), in.toList().get(4).toObject().get());
  // A bare tensor goes to fn; other values pass through.
  EXPECT_TRUE(is_three(utils::apply_to_tensors([](const at::Tensor& x) { return x * 3; }, c10::IValue(t))));
  EXPECT_EQ(utils::apply_to_tensors([](const at::Tensor& x) { return x; }, c10::IValue(5)).toInt(), 5);
}

TEST(CastForwardInputs, CastsFloatingTensorsAndKeepsRequiresGrad) {
  at::Tensor f = at::ones({3}, at::kFloat).requires_grad_();
  at::Tensor h = at::ones({3}, at::kHalf);
  at::Tensor i = at::ones({3}, at::kLong);
  auto [args, kwargs] = utils::cast_forward_inputs(at::kHalf, {f, i}, {{"h", h}, {"n", 1.5}});
  at::Tensor f16 = args[0].toTensor();
  EXPECT_EQ(f16.scalar_type(), at::kHalf);
  EXPECT_TRUE(f16.requires_grad());
  EXPECT_TRUE(args[1].toTensor().is_same(i));         // not floating: unchanged
  EXPECT_TRUE(kwargs[0].second.toTensor().is_same(h));  // already half: unchanged
  EXPECT_EQ(kwargs[1].second.toDouble(), 1.5);
  f16.sum().backward();
  EXPECT_TRUE(at::equal(f.grad(), at::ones({3})));
  // No dtype: returned as given.
  auto [same, same_kw] = utils::cast_forward_inputs(std::nullopt, {f});
  EXPECT_TRUE(same[0].toTensor().is_same(f));
  EXPECT_TRUE(same_kw.empty());
}

TEST(RecursiveTo, MovesNestedTensorsButNotObjectFields) {
  at::Tensor t = at::ones({2});
  auto moved = utils::recursive_to(nested(t), c10::Device(c10::kMeta), /*use_side_stream_for_tensor_copies=*/true);
  ASSERT_EQ(moved.size(), 1u);  // one entry per target device
  auto list = moved[0].toList();
  EXPECT_TRUE(list.get(0).toTensor().is_meta());
  EXPECT_TRUE(list.get(1).toTuple()->elements()[0].toTensor().is_meta());
  EXPECT_TRUE(list.get(2).toTuple()->type()->name().has_value());
  EXPECT_TRUE(list.get(3).toGenericDict().at("k").toTensor().is_meta());
  // PyTorch does not enter dataclasses here: the object comes back as it was.
  EXPECT_TRUE(list.get(4).toObject()->getSlot(0).toTensor().is_same(t));
  // Already on the target device: the same tensor.
  EXPECT_TRUE(utils::recursive_to(t, c10::Device(c10::kCPU), false)[0].toTensor().is_same(t));
}

TEST(ToKwargs, PadsInputsAndKwargsToTheSameLength) {
  const c10::Device meta(c10::kMeta);
  auto [none_in, none_kw] = utils::to_kwargs({}, std::nullopt, meta, false);
  EXPECT_TRUE(none_in.empty());
  EXPECT_TRUE(none_kw.empty());
  auto [in, kw] = utils::to_kwargs({at::ones({1}), 2}, std::nullopt, meta, false);
  ASSERT_EQ(in.size(), 1u);
  ASSERT_EQ(kw.size(), 1u);
  EXPECT_TRUE(in[0][0].toTensor().is_meta());
  EXPECT_EQ(in[0][1].toInt(), 2);
  EXPECT_TRUE(kw[0].empty());
  auto [in2, kw2] = utils::to_kwargs({}, Kwargs{{"x", at::ones({1})}}, meta, false);
  ASSERT_EQ(in2.size(), 1u);
  EXPECT_TRUE(in2[0].empty());
  ASSERT_EQ(kw2.size(), 1u);
  EXPECT_EQ(kw2[0][0].first, "x");
  EXPECT_TRUE(kw2[0][0].second.toTensor().is_meta());
}

// ---- storage ---------------------------------------------------------------------------------

TEST(FreeStorage, FreesAndAllocStorageRestores) {
  at::Tensor t = at::ones({3, 4});
  EXPECT_TRUE(utils::data_ptr_allocated(t));
  EXPECT_TRUE(utils::free_storage(t));
  EXPECT_EQ(t.storage().nbytes(), 0u);
  EXPECT_FALSE(utils::data_ptr_allocated(t));
  EXPECT_EQ(t.sizes(), c10::IntArrayRef({3, 4}));  // the tensor keeps its shape
  EXPECT_FALSE(utils::free_storage(t));            // already freed
  utils::alloc_storage(t, {3, 4});
  EXPECT_EQ(t.storage().nbytes(), 12 * sizeof(float));
  EXPECT_TRUE(utils::data_ptr_allocated(t));
  t.fill_(2);
  const void* ptr = t.data_ptr();
  utils::alloc_storage(t, {12});  // already that many elements: nothing changes
  EXPECT_EQ(t.data_ptr(), ptr);
  EXPECT_EQ(t.sum().item<float>(), 24);
}

TEST(AllocStorage, RefusesAStorageThatWasNotFreed) {
  at::Tensor t = at::ones({3, 4});
  auto [err, printed] = error_and_stderr_of([&] { utils::alloc_storage(t, {20}); });
  EXPECT_PRED2(contains, err, "Tensor storage should have been resized to be 0 but got 12");
  EXPECT_PRED2(contains, printed, "Tensor storage should have been resized to be 0 but got 12\n");
}

TEST(FreeStorage, RefusesATensorThatIsNotTheSoleOccupant) {
  at::Tensor base = at::ones({8});
  at::Tensor view = base.narrow(0, 4, 4);
  auto [err, printed] = error_and_stderr_of([&] { utils::free_storage(view); });
  EXPECT_PRED2(contains, err, "Freeing a tensor's storage is unsafe when it is not the sole occupant");
  EXPECT_PRED2(contains, printed, "storage offset: 4\nstorage size: 8\ntensor shape: [4]\n");
  EXPECT_PRED2(contains, err, "storage offset: 4\nstorage size: 8\ntensor shape: [4]");
  EXPECT_TRUE(utils::data_ptr_allocated(base));
}

TEST(FreeStorage, RefusesStorageItCannotResize) {
  float data[4] = {1, 2, 3, 4};
  at::Tensor blob = at::from_blob(data, {4});
  EXPECT_PRED2(contains, error_of([&] { utils::free_storage(blob); }),
               "free_storage: the tensor's storage is not resizable");
  at::Tensor sparse = at::ones({2}).to_sparse();
  EXPECT_PRED2(contains, error_of([&] { utils::alloc_storage(sparse, {2}); }),
               "alloc_storage: the tensor has no storage");
  EXPECT_FALSE(utils::data_ptr_allocated(sparse));
}

TEST(PAssert, ThrowsOnlyWhenAskedTo) {
  auto [err, printed] = error_and_stderr_of([] { utils::p_assert(false, "the hook saw bad state"); });
  EXPECT_EQ(err, "the hook saw bad state");
  EXPECT_EQ(printed.rfind("the hook saw bad state\n", 0), 0u) << printed;  // the message, then
  EXPECT_PRED2(contains, printed, "frame #0");                               // the backtrace
  auto [err2, printed2] = error_and_stderr_of(
      [] { utils::p_assert(false, "printed only", /*raise_assertion_error=*/false); });
  EXPECT_EQ(err2, "<no error>");
  EXPECT_EQ(printed2.rfind("printed only\n", 0), 0u) << printed2;
  auto [err3, printed3] = error_and_stderr_of([] { utils::p_assert(true, "never shown"); });
  EXPECT_EQ(err3, "<no error>");
  EXPECT_EQ(printed3, "");
}

// ---- replace_by_prefix -----------------------------------------------------------------------

TEST(ReplaceByPrefix, RenamesMatchingKeysInPlace) {
  torch::OrderedDict<std::string, at::Tensor> sd;
  sd.insert("module.a", at::full({1}, 1.0));
  sd.insert("other", at::full({1}, 2.0));
  sd.insert("module.b", at::full({1}, 3.0));
  sd.insert("b", at::full({1}, 4.0));
  utils::replace_by_prefix(sd, "module.", "");
  // Renamed entries go to the end, or replace an existing entry of the new name in its place.
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"other", "b", "a"}));
  EXPECT_EQ(sd["b"].item<float>(), 3.0);
  EXPECT_EQ(sd["a"].item<float>(), 1.0);

  std::map<std::string, int> m{{"fc.w", 1}, {"fc.b", 2}, {"norm", 3}};
  utils::replace_by_prefix(m, "fc.", "layers.0.fc.");
  EXPECT_EQ(m, (std::map<std::string, int>{{"layers.0.fc.w", 1}, {"layers.0.fc.b", 2}, {"norm", 3}}));
}

TEST(ReplaceByPrefix, RejectsEqualPrefixes) {
  torch::OrderedDict<std::string, at::Tensor> sd;
  EXPECT_PRED2(contains, error_of([&] { utils::replace_by_prefix(sd, "a.", "a."); }),
               "old_prefix and new_prefix must be distinct");
  std::map<std::string, int> m;
  EXPECT_PRED2(contains, error_of([&] { utils::replace_by_prefix(m, "", ""); }), "must be distinct");
}

// ---- across ranks ------------------------------------------------------------------------------

DTENSOR_RANK_FIXTURES(UtilsGloo, UtilsThreads);

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, VerifyParamShapeAcceptsEqualShapes) {
  utils::verify_param_shape_across_processes(t.group(), {at::zeros({4, 3}), at::zeros({3})}, {"w", "b"});
  utils::verify_param_shape_across_processes(t.group(), {});
}

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, VerifyParamShapeNamesFirstMismatch) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // ranks that differ from rank 0
  const int r = t.rank();
  const int last = t.ranks() - 1;
  // Count: the last rank has one more tensor. Every rank raises the same error.
  std::vector<at::Tensor> ps{at::zeros({4, 3}), at::zeros({3})};
  if (r == last) ps.push_back(at::zeros({1}));
  EXPECT_PRED2(contains, error_of([&] { utils::verify_param_shape_across_processes(t.group(), ps); }),
               "DDP expects same model across all ranks, but rank " + std::to_string(last) +
                   " has 3 params, while rank 0 has inconsistent 2 params");
  // Sizes: rank 1 and the last rank differ; rank 1 is the first.
  at::Tensor w = (r == 1 || r == last) ? at::zeros({3, 4}) : at::zeros({4, 3});
  EXPECT_PRED2(contains, error_of([&] {
                 utils::verify_param_shape_across_processes(t.group(), {at::zeros({3}), w}, {"b", "w"});
               }),
               "params[1] ('w') on rank 1 has sizes [3, 4], strides [4, 1], dtype Float, which do not match sizes "
               "[4, 3], strides [3, 1], dtype Float of the same param on rank 0");
  // Strides (a transposed view) and dtypes count too.
  at::Tensor s = r == last ? at::zeros({3, 4}).t() : at::zeros({4, 3});
  EXPECT_PRED2(contains, error_of([&] { utils::verify_param_shape_across_processes(t.group(), {s}); }),
               "params[0] on rank " + std::to_string(last) + " has sizes [4, 3], strides [1, 4], dtype Float");
  at::Tensor d = at::zeros({2}, r == last ? at::kDouble : at::kFloat);
  EXPECT_PRED2(contains, error_of([&] { utils::verify_param_shape_across_processes(t.group(), {d}); }),
               "dtype Double, which do not match sizes [2], strides [1], dtype Float");
  EXPECT_PRED2(contains, error_of([&] { utils::verify_param_shape_across_processes(t.group(), {d}, {"a", "b"}); }),
               "got 2 names for 1 tensors");
}

// A module with parameters, float buffers and an int64 buffer (BatchNorm's
// num_batches_tracked), every value derived from `seed`.
struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  explicit Net(double seed, int64_t out = 3) {
    fc = register_module("fc", torch::nn::Linear(4, out));
    bn = register_module("bn", torch::nn::BatchNorm1d(out));
    at::NoGradGuard g;
    double v = seed;
    for (auto& p : parameters()) p.copy_(at::arange(p.numel(), at::kFloat).view(p.sizes()) + (v += 100));
    for (auto& b : buffers()) b.fill_(static_cast<int64_t>(seed) + 7);
  }
};

::testing::AssertionResult same_states(torch::nn::Module& a, torch::nn::Module& b) {
  auto sa = a.named_parameters(), sb = b.named_parameters();
  for (const auto& kv : a.named_buffers()) sa.insert(kv.key(), kv.value());
  for (const auto& kv : b.named_buffers()) sb.insert(kv.key(), kv.value());
  for (const auto& kv : sa)
    if (!at::equal(kv.value(), sb[kv.key()])) return ::testing::AssertionFailure() << kv.key() << " differs";
  return ::testing::AssertionSuccess();
}

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, SyncModuleStatesCopiesSourceRank) {
  // From the last rank (not rank 0, the default). Buckets of 16 bytes: several buckets,
  // single-tensor ones included; and one bucket for all.
  const int src = t.ranks() - 1;
  for (int64_t bucket : {int64_t{16}, utils::kDefaultBroadcastBucketSize}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    Net net(t.rank());
    Net expected(src);
    utils::SyncModuleStatesOptions o;
    o.broadcast_bucket_size = bucket;
    o.src = src;
    utils::sync_module_states(net, t.group(), o);
    EXPECT_TRUE(same_states(net, expected));
    EXPECT_TRUE(net.fc->weight.requires_grad());
    EXPECT_EQ(net.bn->num_batches_tracked.scalar_type(), at::kLong);
  }
}

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, SyncModuleStatesIgnoresNamedStatesAndBuffers) {
  Net net(t.rank());
  utils::SyncModuleStatesOptions o;
  o.params_and_buffers_to_ignore = {"fc.bias"};
  o.broadcast_buffers = false;
  utils::sync_module_states(net, t.group(), o);
  Net mine(t.rank()), rank0(0);
  EXPECT_TRUE(at::equal(net.fc->weight, rank0.fc->weight));
  EXPECT_TRUE(at::equal(net.bn->weight, rank0.bn->weight));
  EXPECT_TRUE(at::equal(net.fc->bias, mine.fc->bias));
  EXPECT_TRUE(at::equal(net.bn->running_mean, mine.bn->running_mean));
}

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, SyncModuleStatesRefusesDifferentModelsBeforeBroadcasting) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // a rank whose model differs from rank 0's
  const int last = t.ranks() - 1;
  Net net(t.rank(), t.rank() == last ? 5 : 3);
  Net before(t.rank(), t.rank() == last ? 5 : 3);
  EXPECT_PRED2(contains, error_of([&] { utils::sync_module_states(net, t.group()); }),
               "params[0] ('fc.weight') on rank " + std::to_string(last) + " has sizes [5, 4]");
  EXPECT_TRUE(same_states(net, before));  // nothing moved
}

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, BroadcastCoalescedNonContiguousAndMixedDtypes) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // src 1
  const int r = t.rank();
  const int src3 = t.ranks() - 1;  // the source of the second broadcast: the last rank
  at::Tensor base = at::full({3, 2}, r, at::kFloat);
  at::Tensor strided = base.t();  // non-contiguous, alone in its bucket and with others
  at::Tensor ints = at::full({5}, r, at::kInt);
  at::Tensor more = at::full({2}, r * 10, at::kFloat);
  for (int64_t bucket : {int64_t{1}, int64_t{1} << 20}) {
    base.fill_(r);
    ints.fill_(r);
    more.fill_(r * 10);
    utils::broadcast_coalesced(t.group(), {strided, ints, more}, bucket, 1);
    EXPECT_TRUE(at::equal(base, at::full({3, 2}, 1, at::kFloat)));
    EXPECT_TRUE(at::equal(ints, at::full({5}, 1, at::kInt)));
    EXPECT_TRUE(at::equal(more, at::full({2}, 10, at::kFloat)));
  }
  // Several multi-tensor buckets of one dtype share one staging buffer: [a, b, c] (20 bytes),
  // then [d, e].
  std::vector<at::Tensor> small;
  for (int64_t n : {1, 1, 3, 1, 2}) small.push_back(at::full({n}, r * 10 + n, at::kFloat));
  utils::broadcast_coalesced(t.group(), small, 16, src3);
  for (const auto& s : small) EXPECT_TRUE(at::equal(s, at::full_like(s, src3 * 10 + s.numel()))) << s;
  utils::sync_params_and_buffers(t.group(), {}, 16, 0);  // nothing to do, no collective
}

DTENSOR_TEST_BOTH(UtilsGloo, UtilsThreads, BroadcastCoalescedArgumentErrors) {
  at::Tensor x = at::zeros({2});
  EXPECT_PRED2(contains, error_of([&] { utils::broadcast_coalesced(t.group(), {x}, 16, t.ranks()); }),
               "src=" + std::to_string(t.ranks()) + " is not a rank");
  EXPECT_PRED2(contains, error_of([&] { utils::broadcast_coalesced(t.group(), {x}, 0, 0); }),
               "buffer_size must be positive, got 0");
  EXPECT_PRED2(contains, error_of([&] { utils::broadcast_coalesced(t.group(), {x, x.to_sparse()}, 16, 0); }),
               "tensor 1 is not a dense tensor with storage");
  Net net(0);
  utils::SyncModuleStatesOptions o;
  o.src = -1;
  EXPECT_PRED2(contains, error_of([&] { utils::sync_module_states(net, t.group(), o); }), "src=-1 is not a rank");
}

}  // namespace
}  // namespace dtensor
