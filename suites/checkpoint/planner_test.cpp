// dtensor/checkpoint/planner.h: chunk overlap, the coordinator's global save plan (dedup of
// replicated chunks, validation), metadata JSON and validation, CRC-32. No ranks.
#include "dtensor/checkpoint/planner.h"
#include "suites/testing/errors.h"

#include <gtest/gtest.h>

namespace dtensor {
namespace checkpoint {
namespace {

using testing::contains;
using testing::error_of;

WriteItem chunk_item(const std::string& fqn, std::vector<int64_t> size, std::vector<int64_t> off,
                     std::vector<int64_t> sizes, const std::string& dtype = "float32") {
  WriteItem w;
  w.fqn = fqn;
  w.dtype = dtype;
  w.global_size = std::move(size);
  w.chunk = ChunkMeta{std::move(off), std::move(sizes)};
  w.nbytes = w.chunk.numel() * element_size(dtype);
  return w;
}

WriteItem object_item(const std::string& fqn) {
  WriteItem w;
  w.fqn = fqn;
  w.kind = ItemKind::Object;
  return w;
}

TEST(CheckpointPlanner, ChunkOverlap) {
  ChunkMeta a{{0, 0}, {4, 2}}, b{{2, 1}, {4, 4}}, c{{0, 2}, {4, 2}};
  auto ov = chunk_overlap(a, b);
  ASSERT_TRUE(ov);
  EXPECT_EQ(ov->offsets, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(ov->sizes, (std::vector<int64_t>{2, 1}));
  EXPECT_FALSE(chunk_overlap(a, c));  // touching is not overlapping
  EXPECT_TRUE(chunk_overlap(ChunkMeta{}, ChunkMeta{}));  // 0-dim tensors: the one element
}

TEST(CheckpointPlanner, ReplicatedChunksAreWrittenOnceByTheLeastLoadedRank) {
  // A [8, 4] tensor replicated on 4 ranks, another [8] one, and an object every rank offers.
  std::vector<SavePlan> local(4);
  for (int r = 0; r < 4; ++r) {
    local[r].items.push_back(chunk_item("big", {8, 4}, {0, 0}, {8, 4}));
    local[r].items.push_back(chunk_item("small", {8}, {0}, {8}));
    local[r].items.push_back(object_item("step"));
  }
  // Sharded rows of "rows" (rank r holds rows 2r, 2r+1).
  for (int r = 0; r < 4; ++r) local[r].items.push_back(chunk_item("rows", {8, 4}, {2 * r, 0}, {2, 4}));
  auto global = create_global_save_plan(local);
  ASSERT_EQ(global.size(), 4u);
  std::map<std::string, std::vector<int>> writers;
  for (int r = 0; r < 4; ++r) {
    for (const auto& it : global[r].items) writers[it.fqn].push_back(r);
  }
  EXPECT_EQ(writers["big"].size(), 1u);
  EXPECT_EQ(writers["small"].size(), 1u);
  EXPECT_EQ(writers["step"].size(), 1u);
  EXPECT_EQ(writers["rows"], (std::vector<int>{0, 1, 2, 3}));
  // Largest first: "big" (128 B) goes to rank 0; then the rows (32 B each) to every rank; the
  // small tensor and the object to ranks other than 0.
  EXPECT_EQ(writers["big"][0], 0);
  EXPECT_NE(writers["small"][0], 0);
  EXPECT_NE(writers["step"][0], 0);
  EXPECT_NE(writers["small"][0], writers["step"][0]);
}

TEST(CheckpointPlanner, RejectsBadPlansNamingKeysAndRanks) {
  std::vector<SavePlan> local(2);
  local[0].items.push_back(chunk_item("w", {4, 4}, {0, 0}, {2, 4}));
  local[1].items.push_back(chunk_item("w", {4, 4}, {2, 0}, {2, 4}, "float64"));
  EXPECT_PRED2(contains, error_of([&] { create_global_save_plan(local); }),
               "key 'w' has dtype float32 on rank 0 but float64 on rank 1");

  local[1].items[0] = chunk_item("w", {4, 5}, {2, 0}, {2, 4});
  EXPECT_PRED2(contains, error_of([&] { create_global_save_plan(local); }),
               "key 'w' has global size [4, 4] on rank 0 but [4, 5] on rank 1");

  local[1].items[0] = chunk_item("w", {4, 4}, {1, 0}, {2, 4});
  EXPECT_PRED2(contains, error_of([&] { create_global_save_plan(local); }),
               "key 'w': chunks offsets=[0, 0] sizes=[2, 4] and offsets=[1, 0] sizes=[2, 4] overlap (chunks offered "
               "by ranks [0, 1])");

  local[1].items[0] = chunk_item("w", {4, 4}, {3, 0}, {1, 4});
  EXPECT_PRED2(contains, error_of([&] { create_global_save_plan(local); }),
               "key 'w': the chunks cover 12 of the 16 elements of size [4, 4]");

  local[1].items[0] = chunk_item("w", {4, 4}, {3, 0}, {2, 4});
  EXPECT_PRED2(contains, error_of([&] { create_global_save_plan(local); }),
               "key 'w': chunk offsets=[3, 0] sizes=[2, 4] is out of bounds of size [4, 4]");

  local[1].items[0] = object_item("w");
  EXPECT_PRED2(contains, error_of([&] { create_global_save_plan(local); }),
               "key 'w' is a tensor on rank 0 but a object on rank 1");
}

TEST(CheckpointPlanner, MetadataRoundTripsAndIsValidated) {
  Metadata m;
  m.save_id = 3;
  m.world_size = 2;
  m.checksum_block_bytes = 16;
  Entry e;
  e.dtype = "float32";
  e.size = {2, 3};
  e.chunks.push_back(StoredChunk{ChunkMeta{{0, 0}, {2, 3}}, "__0_3.distcp", 0, 24, {1u, 2u}});
  m.entries["w"] = e;
  Entry o;
  o.kind = ItemKind::Object;
  o.chunks.push_back(StoredChunk{ChunkMeta{}, "__1_3.distcp", 0, 10, {7u}});
  m.entries["step"] = o;
  validate_metadata(m);
  nlohmann::json j = m;
  EXPECT_EQ(j.at("format"), "dtensor-cpp-dcp");
  EXPECT_EQ(j.at("version"), 1);
  Metadata back = j.get<Metadata>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(back.files(), (std::vector<std::string>{"__0_3.distcp", "__1_3.distcp"}));
  EXPECT_EQ(back.total_bytes(), 34);

  j["version"] = 2;
  EXPECT_PRED2(contains, error_of([&] { j.get<Metadata>(); }), "checkpoint format version 2, this build reads version 1");
  m.entries["w"].chunks[0].length = 20;
  EXPECT_PRED2(contains, error_of([&] { validate_metadata(m); }),
               "key 'w' chunk offsets=[0, 0] sizes=[2, 3] has 20 bytes, expected 24");
  m.entries["w"].chunks[0].length = 24;
  m.entries["w"].chunks[0].crc32 = {1u};
  EXPECT_PRED2(contains, error_of([&] { validate_metadata(m); }), "has 1 checksums for 2 blocks");
}

TEST(CheckpointPlanner, Crc32IsZlibs) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32(s.data(), s.size()), 0xCBF43926u);
  EXPECT_EQ(crc32(s.data() + 4, 5, crc32(s.data(), 4)), 0xCBF43926u);
  std::string big(1000, 'x');
  uint32_t whole = crc32(big.data(), big.size());
  EXPECT_EQ(crc32(big.data() + 3, 997, crc32(big.data(), 3)), whole);
  EXPECT_EQ(whole, 0x3b41c9e6u);  // Python: zlib.crc32(b'x' * 1000)
  std::string bytes(4099, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char((i * 131 + 7) % 251);
  EXPECT_EQ(crc32(bytes.data(), bytes.size()), 0x81bb950fu);  // zlib.crc32(bytes(...))
}

// libdeflate's folding paths give a bit-by-bit reference's value for every length around their
// 16-, 64- and 256-byte steps, any alignment, and when continued from a previous value.
TEST(CheckpointPlanner, Crc32MatchesTheBitwiseReference) {
  auto bitwise = [](const unsigned char* p, size_t n, uint32_t crc) {
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) {
      crc ^= p[i];
      for (int k = 0; k < 8; ++k) crc = (crc & 1) ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
  };
  std::vector<unsigned char> buf(5000);
  uint32_t x = 12345;
  for (auto& b : buf) {
    x = x * 1103515245u + 12345u;
    b = static_cast<unsigned char>(x >> 16);
  }
  for (size_t start : {size_t(0), size_t(1), size_t(7), size_t(13)}) {
    for (size_t n = 0; n < 700; ++n) {
      const unsigned char* p = buf.data() + start;
      const uint32_t want = bitwise(p, n, 0);
      ASSERT_EQ(crc32(p, n), want) << "start " << start << " length " << n;
      ASSERT_EQ(crc32(p + n / 3, n - n / 3, crc32(p, n / 3)), want) << "start " << start << " length " << n;
    }
  }
  for (size_t n : {size_t(1024), size_t(4096) + 17, size_t(4999)}) {
    EXPECT_EQ(crc32(buf.data() + 1, n - 1), bitwise(buf.data() + 1, n - 1, 0)) << n;
  }
}

}  // namespace
}  // namespace checkpoint
}  // namespace dtensor
