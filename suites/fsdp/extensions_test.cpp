// dtensor/fsdp/extensions.h (PyTorch: tensor/parallel/fsdp.py): each helper as PyTorch has it, on thread ranks
// (the 2-D _chunk_dtensor case on Gloo processes too), at any even world size (2-D meshes are
// mesh_shape_2d()): _chunk_dtensor's two errors and its 2-D / 3-D layouts, _all_gather_dtensor, boxes of
// uneven shards, the scapegoat metadata, _chunk_tensor's nested ShardedTensors (TP by
// DTensor and by ShardedTensor) and _pre_load_state_dict, flatten / unflatten with the
// gradient layout hook, _rewrite_spec_if_needed, _is_nested_tensor, and the ext_* defaults.
#include "dtensor/fsdp/extensions.h"
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using Shape = std::vector<int64_t>;
using Box = std::pair<Shape, Shape>;
namespace sh = dtensor::sharded;
using namespace dtensor::fsdp;
// Tensors are distributed on sub-meshes with src_data_rank = nullopt (every rank holds the
// same global tensor): distribute_tensor's broadcast runs over the mesh's world group, which a
// sub-mesh shares with the other sub-meshes.

class FsdpExtensionsThreads : public testing::MultiThreadedTest {};
class FsdpExtensionsGloo : public testing::MultiProcessTest {};

at::Tensor global_input(const Shape& shape, const std::string& device = "cpu") {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * 0.37).sin().reshape(shape).to(at::kFloat).to(c10::Device(device));
}

// torch.chunk's boxes (offsets, sizes) of a [rows, cols] tensor sharded on dim 0 over n ranks:
// box i holds chunk i of at::arange(rows).chunk(n), and is empty at offset `rows` past the last
// chunk (torch.chunk gives fewer chunks than ranks when the rows run out). On 4 ranks 10 rows
// give (0, 3) (3, 3) (6, 3) (9, 1) and 5 rows (0, 2) (2, 2) (4, 1) (5, 0).
std::vector<Box> chunk_boxes(int64_t rows, int64_t cols, int64_t n) {
  const std::vector<at::Tensor> chunks = at::arange(rows, at::kLong).chunk(n, 0);
  std::vector<Box> boxes;
  for (int64_t i = 0; i < n; ++i) {
    if (i < static_cast<int64_t>(chunks.size())) {
      const at::Tensor& c = chunks[static_cast<size_t>(i)];
      boxes.push_back({{c[0].item<int64_t>(), 0}, {c.size(0), cols}});
    } else {
      boxes.push_back({{rows, 0}, {0, cols}});
    }
  }
  return boxes;
}

// Chunk i of torch.chunk(t, n), empty past the last chunk.
at::Tensor chunk_or_empty(const at::Tensor& t, int64_t n, int64_t i) {
  const std::vector<at::Tensor> chunks = t.chunk(n, 0);
  return i < static_cast<int64_t>(chunks.size()) ? chunks[static_cast<size_t>(i)] : t.narrow(0, t.size(0), 0);
}

DTENSOR_TEST_F(FsdpExtensionsThreads, ChunkDTensorRaisesWithoutA2DParent) {
  auto mesh = init_device_mesh(device_type(), {ranks()}, {"dp"});
  const at::Tensor g = global_input({8, 2});
  DTensorExtensions ext;
  // A mesh that was not sliced from another.
  EXPECT_PRED2(contains, error_of([&] { ext.chunk_dtensor(g, 0, mesh); }),
               "No parent device_mesh is found for FSDP device_mesh.");
  // A 1-D parent (slicing never makes one: passed explicitly, as PyTorch's _mesh_resources could).
  EXPECT_PRED2(contains, error_of([&] { _chunk_dtensor(g, 0, mesh, mesh); }),
               "Found parent device_mesh of ndim=1, but meshes must be at least 2D.");
}

void check_chunk_dtensor_2d(const testing::MultiRankTest& t) {
  auto mesh = init_device_mesh(t.device_type(), t.mesh_shape_2d(), {"dp", "tp"});
  DTensorExtensions ext;
  for (const Shape& shape : {Shape{8, 4}, Shape{7, 5}}) {
    SCOPED_TRACE(c10::str(c10::IntArrayRef(shape)));
    const at::Tensor g = global_input(shape, t.device_type());
    // Not tensor parallel: (Shard(0), Replicate()).
    at::Tensor p = ext.chunk_dtensor(g, 0, mesh["dp"]);
    EXPECT_TRUE(get_spec(p).mesh == mesh);
    EXPECT_EQ(get_spec(p).placements, (std::vector<Placement>{Shard{0}, Replicate{}}));
    EXPECT_TRUE(at::equal(full_tensor(p), g));
    // Colwise and rowwise TP parameters: (Shard(0), tp_placement).
    for (const Placement& tp : {Placement(Shard{0}), Placement(Shard{1})}) {
      SCOPED_TRACE(to_string(tp));
      at::Tensor tp_param = distribute_tensor(g, mesh["tp"], {tp}, std::nullopt);
      at::Tensor p2 = ext.chunk_dtensor(tp_param, 0, mesh["dp"]);
      EXPECT_EQ(get_spec(p2).placements, (std::vector<Placement>{Shard{0}, tp}));
      EXPECT_TRUE(at::equal(full_tensor(p2), g));
      // _all_gather_dtensor: the FSDP dim gathered, this rank's TP shard back.
      EXPECT_TRUE(at::equal(ext.all_gather_dtensor(p2, mesh), local_tensor(tp_param)));
      EXPECT_PRED2(contains, error_of([&] { ext.all_gather_dtensor(p2, mesh["dp"]); }),
                   "_all_gather_dtensor: parent_mesh DeviceMesh('" + t.device_type() + "', [");
      // The plain-FSDP default gathers the last mesh dim only.
      at::Tensor last = ext_all_gather_dtensor(p2, mesh, nullptr);
      EXPECT_TRUE(at::equal(last, local_tensor(redistribute(p2, mesh, {Shard{0}, Replicate{}}))));
    }
  }
}

DTENSOR_TEST_F(FsdpExtensionsThreads, ChunkDTensorShardsOverFsdpAndAllGatherDTensorUndoesIt) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  check_chunk_dtensor_2d(*this);
}
DTENSOR_TEST_F(FsdpExtensionsGloo, ChunkDTensorShardsOverFsdpAndAllGatherDTensorUndoesIt) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  check_chunk_dtensor_2d(*this);
}

DTENSOR_TEST_F(FsdpExtensionsThreads, ChunkDTensorOnAnHsdpMesh) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // tp = 2
  // (replicate, shard, tp) = (ranks / 2, 1, 2): HSDP x TP gives (Replicate(), Shard(0), tp_placement).
  auto mesh = init_device_mesh(device_type(), {ranks() / 2, 1, 2}, {"rep", "shard", "tp"});
  DTensorExtensions ext;
  const at::Tensor g = global_input({6, 3});
  at::Tensor tp_param = distribute_tensor(g, mesh["tp"], {Shard{0}}, std::nullopt);
  at::Tensor p = ext.chunk_dtensor(tp_param, 0, mesh["shard"]);
  EXPECT_EQ(get_spec(p).placements, (std::vector<Placement>{Replicate{}, Shard{0}, Shard{0}}));
  EXPECT_TRUE(at::equal(full_tensor(p), g));
  EXPECT_TRUE(at::equal(ext.all_gather_dtensor(p, mesh), local_tensor(tp_param)));
  // Plain FSDP's default: Shard(0) on the last mesh dim.
  at::Tensor q = ext_chunk_dtensor(g, 0, mesh, nullptr);
  EXPECT_EQ(get_spec(q).placements, (std::vector<Placement>{Replicate{}, Replicate{}, Shard{0}}));
  EXPECT_TRUE(at::equal(full_tensor(q), g));
}

// Row counts even and uneven at 2, 4 and 8 ranks, with empty boxes at 4 and 8 (5 and 10 rows).
DTENSOR_TEST_F(FsdpExtensionsThreads, BoxesAreTheTorchChunkBoxesOfUnevenShards) {
  const int64_t n = ranks();
  auto mesh = init_device_mesh(device_type(), {n});
  const int64_t me = mesh.get_local_rank(0);
  for (const Shape& shape : {Shape{8, 3}, Shape{10, 3}, Shape{5, 2}, Shape{13, 2}}) {
    SCOPED_TRACE(c10::str(c10::IntArrayRef(shape)));
    const std::vector<Box> boxes = chunk_boxes(shape[0], shape[1], n);
    at::Tensor dt = distribute_tensor(global_input(shape), mesh, {Shard{0}});
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(_get_box_for(dt, i), boxes[static_cast<size_t>(i)]) << "shard " << i;
    EXPECT_EQ(_get_local_box(dt), boxes[static_cast<size_t>(me)]);
    // _get_box: the offset of the shard dim is the chunk size (ceil(rows / n)).
    EXPECT_EQ(_get_box(dt), Box(Shape{(shape[0] + n - 1) / n, 0}, boxes[static_cast<size_t>(me)].second));
    const sh::ShardMetadata md = _create_shard_md_from_dt(dt, 7);
    EXPECT_EQ(md.shard_offsets(), boxes[static_cast<size_t>(me)].first);
    EXPECT_EQ(md.shard_sizes(), boxes[static_cast<size_t>(me)].second);
    EXPECT_EQ(md.placement()->to_string(), "rank:7/" + device_type());
  }
  at::Tensor rep = distribute_tensor(global_input({5, 2}), mesh, {Replicate{}});
  EXPECT_EQ(_get_local_box(rep), Box({0, 0}, {5, 2}));
  EXPECT_PRED2(contains, error_of([&] { _get_box_for(rep, 1); }), "has one box, index 0, not 1");
  auto mesh2 = init_device_mesh(device_type(), {1, n});
  at::Tensor two_d = distribute_tensor(global_input({4, 2}), mesh2, {Shard{0}, Replicate{}});
  EXPECT_PRED2(contains, error_of([&] { _get_box(two_d); }), "Only 1D DeviceMeshes currently handled");
}

// NOTE: [Scapegoat rank]
DTENSOR_TEST_F(FsdpExtensionsThreads, ShardedTensorMetadataPlacesOnlyThisRanksBoxOnIt) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  const DeviceMesh tp = mesh["tp"];
  const std::vector<int> tp_ranks = tp.get_group(0)->global_ranks();  // {0, 1} or {2, 3}
  const int me = tp.get_group(0)->rank();
  const int scapegoat = tp_ranks[me > 0 ? 0 : 1];
  at::Tensor dt = distribute_tensor(global_input({7, 3}), tp, {Shard{0}}, std::nullopt);
  ASSERT_EQ(_get_dt_pg(dt), tp.get_group(0));
  sh::ShardedTensorMetadata md = _create_sharded_tensor_md_from_dt(dt, _get_dt_pg(dt));
  ASSERT_EQ(md.shards_metadata.size(), 2u);
  EXPECT_EQ(md.size, (Shape{7, 3}));
  EXPECT_EQ(md.shards_metadata[0].shard_offsets(), (Shape{0, 0}));
  EXPECT_EQ(md.shards_metadata[0].shard_sizes(), (Shape{4, 3}));
  EXPECT_EQ(md.shards_metadata[1].shard_offsets(), (Shape{4, 0}));
  EXPECT_EQ(md.shards_metadata[1].shard_sizes(), (Shape{3, 3}));
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(*md.shards_metadata[static_cast<size_t>(i)].placement()->rank(), i == me ? tp_ranks[me] : scapegoat)
        << "box " << i;
  // On the ranks of a 1-D mesh every box but this rank's is on the scapegoat; 5 rows leave the
  // last boxes empty from 4 ranks on.
  const int n = ranks();
  auto line = init_device_mesh(device_type(), {n});
  at::Tensor dtn = distribute_tensor(global_input({5, 2}), line, {Shard{0}});
  sh::ShardedTensorMetadata mdn = _create_sharded_tensor_md_from_dt(dtn, _get_dt_pg(dtn));
  ASSERT_EQ(mdn.shards_metadata.size(), static_cast<size_t>(n));
  const int me_n = line.get_rank();
  const std::vector<Box> boxes = chunk_boxes(5, 2, n);
  for (int i = 0; i < n; ++i) {
    const sh::ShardMetadata& box = mdn.shards_metadata[static_cast<size_t>(i)];
    EXPECT_EQ(*box.placement()->rank(), i == me_n ? me_n : (me_n > 0 ? 0 : 1)) << "box " << i;
    EXPECT_EQ(Box(box.shard_offsets(), box.shard_sizes()), boxes[static_cast<size_t>(i)]) << "box " << i;
  }
  // Replicate: one box, the whole tensor, on this rank.
  at::Tensor rep = distribute_tensor(global_input({7, 3}), tp, {Replicate{}}, std::nullopt);
  sh::ShardedTensorMetadata rmd = _create_sharded_tensor_md_from_dt(rep, _get_dt_pg(rep));
  ASSERT_EQ(rmd.shards_metadata.size(), 1u);
  EXPECT_EQ(rmd.shards_metadata[0].shard_sizes(), (Shape{7, 3}));
  EXPECT_EQ(*rmd.shards_metadata[0].placement()->rank(), tp_ranks[me]);
}

// NOTE: [Nested ShardedTensors]
DTENSOR_TEST_F(FsdpExtensionsThreads, ChunkTensorNestsTheTensorParallelShard) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  const comm::GroupPtr dp = mesh["dp"].get_group(0);
  const int dp_rank = dp->rank();
  const int dp_size = dp->size();
  // 15 rows: tp pieces of 8 and 7 rows, each chunked over dp (up to 4 ranks: every dp rank
  // holds rows; uneven from 2 on).
  const at::Tensor g = global_input({15, 3});
  DTensorExtensions ext;
  at::Tensor tp_param = distribute_tensor(g, mesh["tp"], {Shard{0}}, std::nullopt);
  sh::ShardedTensor st = ext.chunk_tensor(tp_param, dp_rank, dp_size, 0, dp);
  ASSERT_EQ(st.local_shards().size(), 1u);
  ASSERT_TRUE(st.local_shards()[0].is_nested());
  EXPECT_TRUE(_is_nested_tensor(st));
  sh::ShardedTensorMetadata expected = _create_sharded_tensor_md_from_dt(tp_param, _get_dt_pg(tp_param));
  expected.tensor_properties.requires_grad = false;
  EXPECT_TRUE(st.metadata() == expected);
  const sh::ShardedTensor& inner = *st.local_shards()[0].nested;
  EXPECT_EQ(inner.size(), local_tensor(tp_param).sizes().vec());
  EXPECT_EQ(inner.process_group(), dp);
  const at::Tensor my_chunk = chunk_or_empty(local_tensor(tp_param), dp_size, dp_rank);
  EXPECT_TRUE(at::equal(inner.local_tensor(), my_chunk));
  // _pre_load_state_dict unwraps it.
  auto [unwrapped, shards] = ext.pre_load_state_dict_transform(st);
  EXPECT_EQ(unwrapped.size(), inner.size());
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_TRUE(at::equal(shards[0].tensor, my_chunk));
  // What needs the data refuses the outer tensor, on every rank.
  EXPECT_PRED2(contains, error_of([&] { st.local_tensor(); }), "is a nested ShardedTensor (FSDP x TP)");
  EXPECT_PRED2(contains, error_of([&] { st.gather(0); }), "ShardedTensor.gather: the local shard at offsets");

  // TP by ShardedTensor (shard_module): the same metadata, its local shard chunked over dp.
  std::vector<sh::RemoteDevice> placements;
  for (int r : mesh["tp"].get_group(0)->global_ranks()) placements.emplace_back(r, c10::Device(device_type()));
  sh::ShardedTensor tp_st = sh::ChunkShardingSpec(0, placements).shard(g, 0, mesh["tp"].get_group(0));
  sh::ShardedTensor st2 = ext.chunk_tensor(tp_st, dp_rank, dp_size, 0, dp);
  ASSERT_TRUE(_is_nested_tensor(st2));
  sh::ShardedTensorMetadata expected2 = tp_st.metadata();
  expected2.tensor_properties.requires_grad = false;
  EXPECT_TRUE(st2.metadata() == expected2);
  auto [inner2, shards2] = _pre_load_state_dict(st2);
  ASSERT_EQ(shards2.size(), 1u);
  EXPECT_TRUE(at::equal(shards2[0].tensor, my_chunk));

  // A plain parameter: FSDP's own chunk, not nested; _pre_load_state_dict keeps it.
  sh::ShardedTensor plain = ext.chunk_tensor(g, dp_rank, dp_size, 0, dp);
  EXPECT_FALSE(_is_nested_tensor(plain));
  EXPECT_TRUE(at::equal(plain.local_tensor(), chunk_or_empty(g, dp_size, dp_rank)));
  auto [same, same_shards] = _pre_load_state_dict(plain);
  EXPECT_TRUE(at::equal(same_shards[0].tensor, plain.local_tensor()));
  // torch.chunk gives fewer chunks than ranks: the ranks after the first hold nothing.
  sh::ShardedTensor one_row = _create_chunk_sharded_tensor(g.narrow(0, 0, 1), dp_rank, dp_size, 0, dp);
  EXPECT_EQ(one_row.metadata().shards_metadata.size(), 1u);
  EXPECT_EQ(one_row.local_shards().size(), dp_rank == 0 ? 1u : 0u);
}

DTENSOR_TEST_F(FsdpExtensionsThreads, FlattenUnflattenKeepsTheSpecAndTheGradientLayout) {
  auto mesh = init_device_mesh(device_type(), {ranks()});
  DTensorExtensions ext;
  const at::Tensor g = global_input({6, 2});
  at::Tensor param = distribute_tensor(g, mesh, {Shard{0}});
  auto [flat, extension] = ext.pre_flatten_transform(param);
  ASSERT_TRUE(extension.has_value());
  EXPECT_EQ(*extension, get_spec(param));
  EXPECT_TRUE(flat.is_same(local_tensor(param)));
  at::Tensor back = ext_post_unflatten_transform(flat, extension, &ext);
  EXPECT_EQ(get_spec(back), get_spec(param));
  EXPECT_TRUE(at::equal(full_tensor(back), g));
  // The gradient reaches the parameter in its own layout (PyTorch's grad_layout_hook): the
  // gradient of a sum is Replicate, the hook makes it Shard(0).
  std::vector<Placement> seen;
  back.register_hook([&seen](const at::Tensor& grad) {
    seen = get_spec(grad).placements;
    return grad;
  });
  back.sum().backward();
  EXPECT_EQ(seen, (std::vector<Placement>{Shard{0}}));
  EXPECT_TRUE(at::equal(flat.grad(), at::ones_like(flat)));
  // Plain tensors pass through the ext_* functions unchanged.
  const at::Tensor plain = at::ones({3});
  auto [same, none] = ext_pre_flatten_transform(plain, &ext);
  EXPECT_TRUE(same.is_same(plain));
  EXPECT_FALSE(none.has_value());
  EXPECT_TRUE(ext_post_unflatten_transform(plain, none, &ext).is_same(plain));
  EXPECT_FALSE(ext_pre_flatten_transform(param, nullptr).second.has_value());
}

DTENSOR_TEST_F(FsdpExtensionsThreads, RewriteSpecAndNestedChecks) {
  DTENSOR_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // one placement of several is rewritten
  auto mesh = init_device_mesh(device_type(), {ranks()});
  std::vector<sh::RemoteDevice> cpu_placements;  // the spec of a tensor on the CPU
  for (int r = 0; r < ranks(); ++r) cpu_placements.emplace_back("rank:" + std::to_string(r) + "/cpu");
  auto spec = std::make_shared<const sh::ChunkShardingSpec>(0, cpu_placements);
  const at::Tensor on_cpu = at::zeros({2});
  const at::Tensor on_meta = at::empty({2}, at::TensorOptions().device(at::kMeta));
  // Nothing to rewrite: the same spec.
  EXPECT_EQ(_rewrite_spec_if_needed(spec, on_cpu, 1), spec);
  auto rewritten = std::dynamic_pointer_cast<const sh::ChunkShardingSpec>(_rewrite_spec_if_needed(spec, on_meta, 1));
  ASSERT_NE(rewritten, nullptr);
  EXPECT_EQ(rewritten->placements()[1].to_string(), "rank:1/meta");
  EXPECT_EQ(rewritten->placements()[0].to_string(), "rank:0/cpu");
  EXPECT_EQ(spec->placements()[1].to_string(), "rank:1/cpu");  // the original is untouched
  EXPECT_EQ(_rewrite_spec_if_needed(nullptr, on_meta, 1), nullptr);
  // A DTensor is not nested; a ShardedTensor whose shard is a DTensor cannot be handled.
  at::Tensor row = distribute_tensor(at::ones({1, 3}), mesh, {Replicate{}});
  EXPECT_FALSE(_is_nested_tensor(row));
  sh::ShardedTensorMetadata md;
  for (int r = 0; r < ranks(); ++r)
    md.shards_metadata.emplace_back(Shape{r, 0}, Shape{1, 3}, sh::RemoteDevice(r, c10::Device(device_type())));
  md.size = {ranks(), 3};
  const int me = static_cast<int>(mesh.get_rank());
  std::vector<sh::Shard> local;
  local.emplace_back(row, md.shards_metadata[static_cast<size_t>(me)]);
  // (The construction asks the DTensor is_pinned, which has no sharding rule.)
  std::optional<sh::ShardedTensor> holder;
  {
    ops::ReplicateFallbackGuard fallback;
    holder = sh::ShardedTensor::init_from_local_shards_and_global_metadata(local, md, group_ptr());
  }
  const sh::ShardedTensor& st = *holder;
  EXPECT_PRED2(contains, error_of([&] { _is_nested_tensor(st); }), "Cannot handle DTensor nested insided ShardedTensor");
}

}  // namespace
}  // namespace dtensor
