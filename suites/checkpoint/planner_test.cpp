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

// metadata_from_json_text reads `.metadata` without a json tree when it is as to_json writes it
// (any spacing and field order), and falls back to nlohmann::json + from_json otherwise: both
// give the same Metadata, and the fallback's errors.
TEST(CheckpointPlanner, MetadataTextIsReadDirectlyOrThroughJson) {
  Metadata m;
  m.save_id = 12;
  m.world_size = 4;
  m.checksum_block_bytes = 32;
  Entry e;
  e.dtype = "bfloat16";
  e.size = {4, 10};
  e.chunks.push_back(StoredChunk{ChunkMeta{{0, 0}, {2, 10}}, "__0_12.distcp", 0, 40, {0u, 4294967295u}});
  e.chunks.push_back(StoredChunk{ChunkMeta{{2, 0}, {2, 10}}, "__1_12.distcp", 128, 40, {17u, 3u}});
  m.entries["layers.0.w"] = e;
  Entry scalar;
  scalar.dtype = "float64";
  scalar.chunks.push_back(StoredChunk{ChunkMeta{}, "__2_12.distcp", 8, 8, {5u}});
  m.entries["scale"] = scalar;
  Entry o;
  o.kind = ItemKind::Object;
  o.chunks.push_back(StoredChunk{ChunkMeta{}, "__3_12.distcp", 0, 700, {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 10u, 11u, 12u, 13u, 14u, 15u, 16u, 17u, 18u, 19u, 20u, 21u, 22u}});
  m.entries["step"] = o;
  const nlohmann::json j = m;
  for (const std::string& text : {j.dump(), j.dump(2), j.dump(1, '\t')}) {
    auto fast = detail::parse_metadata_fast(text);
    ASSERT_TRUE(fast.has_value()) << text;
    EXPECT_EQ(nlohmann::json(*fast), j);
    EXPECT_EQ(nlohmann::json(metadata_from_json_text(text)), j);
  }
  // Fields in another order (a file written by hand or by another tool).
  const std::string reordered =
      R"({"entries": {"b": {"chunks": [{"crc32": [9], "sizes": [3], "offsets": [0], "length": 12, "offset": 0,)"
      R"( "file": "__0_1.distcp"}], "size": [3], "dtype": "int32", "kind": "tensor"}},)"
      R"( "world_size": 1, "checksum_block_bytes": 1048576, "save_id": 1, "checksum": "crc32", "version": 1,)"
      R"( "format": "dtensor-cpp-dcp"})";
  auto r = detail::parse_metadata_fast(reordered);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(nlohmann::json(*r), nlohmann::json::parse(reordered).get<Metadata>());
  EXPECT_EQ(r->entries.at("b").chunks.at(0).length, 12);
  // Entries out of key order and a repeated key (save writes them sorted, once; the reader
  // appends in order and must still give what nlohmann::json gives: the last value wins).
  auto tensor_entry = [](int n) {
    return R"({"kind": "tensor", "dtype": "int32", "size": [)" + std::to_string(n) +
           R"(], "chunks": [{"offsets": [0], "sizes": [)" + std::to_string(n) + R"(], "file": "f", "offset": 0,)" +
           R"( "length": )" + std::to_string(4 * n) + R"(, "crc32": [1]}]})";
  };
  const std::string unsorted = R"({"format": "dtensor-cpp-dcp", "version": 1, "checksum": "crc32", "save_id": 1,)"
                               R"( "world_size": 1, "checksum_block_bytes": 1048576, "entries": {"c": )" +
                               tensor_entry(1) + R"(, "a": )" + tensor_entry(2) + R"(, "d": )" + tensor_entry(3) +
                               R"(, "c": )" + tensor_entry(4) + R"(, "b": )" + tensor_entry(5) + "}}";
  auto u = detail::parse_metadata_fast(unsorted);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(nlohmann::json(*u), nlohmann::json(nlohmann::json::parse(unsorted).get<Metadata>()));
  ASSERT_EQ(u->entries.size(), 4u);
  EXPECT_EQ(u->entries.at("c").size, std::vector<int64_t>{4});
  EXPECT_EQ(u->entries.at("b").size, std::vector<int64_t>{5});

  // Keys with escapes and non-ASCII bytes: read (nlohmann::json's tokenizer decodes them).
  Metadata odd = m;
  odd.entries["quote\"d\\key\n"] = e;
  odd.entries["\xd0\xb2\xd0\xb5\xd1\x81"] = e;  // UTF-8
  auto decoded = detail::parse_metadata_fast(nlohmann::json(odd).dump());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(nlohmann::json(*decoded), nlohmann::json(odd));
  EXPECT_EQ(decoded->entries.count("quote\"d\\key\n"), 1u);
  // Falls back (same result) for an unknown field.
  nlohmann::json commented = m;
  commented["comment"] = "written by hand";
  EXPECT_FALSE(detail::parse_metadata_fast(commented.dump()).has_value());
  EXPECT_EQ(nlohmann::json(metadata_from_json_text(commented.dump())), nlohmann::json(commented.get<Metadata>()));
  // Numbers it does not read itself (a fraction, a checksum out of range) go to from_json too.
  std::string frac = j.dump();
  frac.replace(frac.find("\"save_id\":12"), 12, "\"save_id\":12.0");
  EXPECT_FALSE(detail::parse_metadata_fast(frac).has_value());
  EXPECT_EQ(metadata_from_json_text(frac).save_id, 12);

  // Errors: the fallback's messages.
  nlohmann::json v2 = m;
  v2["version"] = 2;
  EXPECT_FALSE(detail::parse_metadata_fast(v2.dump()).has_value());
  EXPECT_PRED2(contains, error_of([&] { metadata_from_json_text(v2.dump()); }),
               "checkpoint format version 2, this build reads version 1");
  nlohmann::json other = m;
  other["format"] = "something-else";
  EXPECT_PRED2(contains, error_of([&] { metadata_from_json_text(other.dump()); }),
               "not a dtensor-cpp checkpoint metadata file");
  nlohmann::json no_length = m;
  no_length["entries"]["scale"]["chunks"][0].erase("length");
  EXPECT_FALSE(detail::parse_metadata_fast(no_length.dump()).has_value());
  EXPECT_THROW(metadata_from_json_text(no_length.dump()), nlohmann::json::out_of_range);
  const std::string cut = j.dump().substr(0, j.dump().size() / 2);
  EXPECT_FALSE(detail::parse_metadata_fast(cut).has_value());
  EXPECT_THROW(metadata_from_json_text(cut), nlohmann::json::parse_error);
  EXPECT_FALSE(detail::parse_metadata_fast(j.dump() + " x").has_value());
  // Values that are not the file's object: the SAX reader gives up (it read past an empty
  // context stack on a top-level string before: found by the metadata fuzz target).
  for (const std::string& text : {R"("format")", "[1, 2]", "7", R"({"entries": {}} {)", "]", "}"}) {
    EXPECT_FALSE(detail::parse_metadata_fast(text).has_value()) << text;
  }
  EXPECT_THROW(metadata_from_json_text(j.dump() + " x"), nlohmann::json::parse_error);
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
