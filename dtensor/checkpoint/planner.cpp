// dtensor/checkpoint/planner.cpp: chunks, save planning (merge, dedup, validate), metadata.
#include "dtensor/checkpoint/planner.h"

#include "dtensor/checkpoint/json_internal.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <string_view>
#include <tuple>
#include <unordered_map>

namespace dtensor {
namespace checkpoint {

std::string detail::int_list_string(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

namespace {

std::string join(const std::vector<int64_t>& v) { return detail::int_list_string(v); }

std::string join_ranks(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

const char* kind_name(ItemKind k) { return k == ItemKind::Tensor ? "tensor" : "object"; }

ItemKind kind_from_name(const std::string& s) {
  if (s == "tensor") return ItemKind::Tensor;
  if (s == "object") return ItemKind::Object;
  TORCH_CHECK(false, "checkpoint metadata: unknown entry kind '", s, "'");
}

int64_t numel_of(const std::vector<int64_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t(1), std::multiplies<int64_t>());
}

// Whether boxes `a` and `b` (of the same tensor: as many dims) share an element.
bool boxes_overlap(const ChunkMeta& a, const ChunkMeta& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]) <= std::max(a.offsets[d], b.offsets[d]))
      return false;
  }
  return true;
}

// Chunks of one tensor of `size`: each in bounds, none overlapping, all covering it. `what()`
// names the tensor in errors (built only for one: this runs for every key of every load).
// NOTE: [Sizes from files]: the sizes and offsets may come from a file (`.metadata`): every sum
// and product is checked so that none overflows, and a chunk in bounds has no more elements
// than its tensor.
template <class What>
void validate_chunks(const What& what, const std::vector<int64_t>& size, const std::vector<const ChunkMeta*>& chunks) {
  int64_t numel = 1;
  for (int64_t s : size) {
    TORCH_CHECK(s >= 0 && !__builtin_mul_overflow(numel, s, &numel), what(), ": size ", join(size),
                " is negative or has more than 2^63 elements");
  }
  c10::SmallVector<const ChunkMeta*, 8> nonempty;
  for (const ChunkMeta* cp : chunks) {
    const ChunkMeta& c = *cp;
    TORCH_CHECK(c.offsets.size() == size.size() && c.sizes.size() == size.size(), what(), ": chunk ", c.to_string(),
                " has ", c.sizes.size(), " dims, the tensor ", size.size(), " (size ", join(size), ")");
    for (size_t d = 0; d < size.size(); ++d) {
      TORCH_CHECK(c.offsets[d] >= 0 && c.sizes[d] >= 0 && c.offsets[d] <= size[d] && c.sizes[d] <= size[d] - c.offsets[d],
                  what(), ": chunk ", c.to_string(), " is out of bounds of size ", join(size));
    }
    if (c.numel() > 0) nonempty.push_back(&c);
  }
  // A sweep along dim 0: sorted by their offset there, a chunk can overlap only the chunks
  // after it that start before it ends in that dim. Linear for chunks split along dim 0 (FSDP's
  // thousands of shards of a key), where checking every pair would be quadratic.
  const bool sweep = !size.empty();
  if (sweep) {
    std::stable_sort(nonempty.begin(), nonempty.end(),
                     [](const ChunkMeta* a, const ChunkMeta* b) { return a->offsets[0] < b->offsets[0]; });
  }
  for (size_t i = 0; i < nonempty.size(); ++i) {
    for (size_t j = i + 1; j < nonempty.size(); ++j) {
      if (sweep && nonempty[j]->offsets[0] >= nonempty[i]->offsets[0] + nonempty[i]->sizes[0]) break;
      TORCH_CHECK(!boxes_overlap(*nonempty[i], *nonempty[j]), what(), ": chunks ", nonempty[i]->to_string(), " and ",
                  nonempty[j]->to_string(), " overlap");
    }
  }
  // Disjoint boxes in bounds: their sum is at most numel.
  int64_t covered = 0;
  for (const ChunkMeta* c : nonempty) covered += c->numel();
  TORCH_CHECK(covered == numel, what(), ": the chunks cover ", covered, " of the ", numel, " elements of size ",
              join(size));
}

}  // namespace

int64_t ChunkMeta::numel() const { return numel_of(sizes); }

std::string ChunkMeta::to_string() const { return "offsets=" + join(offsets) + " sizes=" + join(sizes); }

std::optional<ChunkMeta> chunk_overlap(const ChunkMeta& a, const ChunkMeta& b) {
  if (a.offsets.size() != b.offsets.size()) return std::nullopt;
  ChunkMeta out;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.sizes.push_back(hi - lo);
  }
  return out;
}

namespace {
const std::vector<std::pair<at::ScalarType, const char*>>& dtype_table() {
  static const std::vector<std::pair<at::ScalarType, const char*>> t = {
      {at::kFloat, "float32"},    {at::kDouble, "float64"},         {at::kHalf, "float16"},
      {at::kBFloat16, "bfloat16"}, {at::kLong, "int64"},            {at::kInt, "int32"},
      {at::kShort, "int16"},      {at::kChar, "int8"},              {at::kByte, "uint8"},
      {at::kBool, "bool"},        {at::kComplexFloat, "complex64"}, {at::kComplexDouble, "complex128"},
  };
  return t;
}
}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& [st, name] : dtype_table()) {
    if (st == t) return name;
  }
  TORCH_CHECK(false, "checkpoint: dtype ", t, " is not supported");
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& [st, n] : dtype_table()) {
    if (name == n) return st;
  }
  TORCH_CHECK(false, "checkpoint: unknown dtype '", name, "'");
}

int64_t element_size(const std::string& dtype) { return int64_t(c10::elementSize(dtype_from_name(dtype))); }

namespace {

// One key as the first rank that holds it sees it.
struct KeyInfo {
  ItemKind kind;
  std::string_view dtype;
  const std::vector<int64_t>* size;
  int rank;
};

// Keys and boxes are looked up once per item of every rank's plan (millions on a large world:
// NOTE: [Checkpoint plans] in save_load.cpp), so the tables below hash views of the plans'
// strings and vectors instead of copying them into ordered maps.
size_t hash_ints(size_t h, const std::vector<int64_t>& v) {
  for (int64_t x : v) h = h * 1000003u ^ std::hash<int64_t>()(x);
  return h;
}

// Every rank's view of each key, checked to agree.
std::unordered_map<std::string_view, KeyInfo> agreed_keys(const std::vector<SavePlan>& local_plans) {
  std::unordered_map<std::string_view, KeyInfo> keys;
  for (int r = 0; r < int(local_plans.size()); ++r) {
    for (const auto& item : local_plans[r].items) {
      auto [it, inserted] = keys.try_emplace(item.fqn, KeyInfo{item.kind, item.dtype, &item.global_size, r});
      if (inserted) continue;
      const KeyInfo& k = it->second;
      TORCH_CHECK(k.kind == item.kind, "key '", item.fqn, "' is a ", kind_name(k.kind), " on rank ", k.rank,
                  " but a ", kind_name(item.kind), " on rank ", r);
      if (item.kind == ItemKind::Tensor) {
        TORCH_CHECK(k.dtype == item.dtype, "key '", item.fqn, "' has dtype ", k.dtype, " on rank ", k.rank, " but ",
                    item.dtype, " on rank ", r);
        TORCH_CHECK(*k.size == item.global_size, "key '", item.fqn, "' has global size ", join(*k.size), " on rank ",
                    k.rank, " but ", join(item.global_size), " on rank ", r);
      }
    }
  }
  return keys;
}

// (key, box) of an item, by reference into the plans.
struct ItemRef {
  const WriteItem* item;
  bool operator==(const ItemRef& o) const {
    return item->fqn == o.item->fqn && item->chunk.offsets == o.item->chunk.offsets &&
           item->chunk.sizes == o.item->chunk.sizes;
  }
  bool operator<(const ItemRef& o) const {
    return std::tie(item->fqn, item->chunk.offsets, item->chunk.sizes) <
           std::tie(o.item->fqn, o.item->chunk.offsets, o.item->chunk.sizes);
  }
};
struct ItemRefHash {
  size_t operator()(const ItemRef& r) const {
    return hash_ints(hash_ints(std::hash<std::string_view>()(r.item->fqn), r.item->chunk.offsets), r.item->chunk.sizes);
  }
};

// Dedup: one writer per (key, box), the least-loaded rank holding it, largest first (ties: by
// key, then box); each rank's items in a deterministic order (by key, then box).
std::vector<SavePlan> assign_writers(const std::vector<SavePlan>& local_plans) {
  std::unordered_map<ItemRef, std::vector<int>, ItemRefHash> holders;
  for (int r = 0; r < int(local_plans.size()); ++r) {
    for (const auto& item : local_plans[r].items) {
      auto& hs = holders[ItemRef{&item}];
      if (hs.empty() || hs.back() != r) hs.push_back(r);
    }
  }
  std::vector<std::pair<ItemRef, const std::vector<int>*>> order;
  order.reserve(holders.size());
  for (const auto& [ref, hs] : holders) order.emplace_back(ref, &hs);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.first.item->nbytes != b.first.item->nbytes) return a.first.item->nbytes > b.first.item->nbytes;
    return a.first < b.first;
  });
  std::vector<int64_t> load(local_plans.size(), 0);
  std::vector<SavePlan> out(local_plans.size());
  for (const auto& [ref, hs] : order) {
    int best = hs->front();
    for (int r : *hs) {
      if (load[r] < load[best]) best = r;
    }
    load[best] += std::max<int64_t>(ref.item->nbytes, 1);
    out[best].items.push_back(*ref.item);
  }
  for (auto& p : out) {
    std::sort(p.items.begin(), p.items.end(), [](const WriteItem& a, const WriteItem& b) {
      return std::tie(a.fqn, a.chunk) < std::tie(b.fqn, b.chunk);
    });
  }
  return out;
}

// Every tensor's chunks tile it exactly once; an error names the ranks that offered them.
void validate_plan(const std::vector<SavePlan>& local_plans, const std::vector<SavePlan>& out,
                   const std::unordered_map<std::string_view, KeyInfo>& keys) {
  std::map<std::string_view, std::vector<const ChunkMeta*>> chunks;  // ordered: the first bad key is reported
  for (const auto& p : out) {
    for (const auto& item : p.items) {
      if (item.kind == ItemKind::Tensor) chunks[item.fqn].push_back(&item.chunk);
    }
  }
  for (const auto& key_chunks : chunks) {
    const std::string_view fqn = key_chunks.first;  // named: C++17 lambdas cannot capture bindings
    try {
      validate_chunks([&] { return "key '" + std::string(fqn) + "'"; }, *keys.at(fqn).size, key_chunks.second);
    } catch (const c10::Error& e) {
      std::vector<int> ranks;
      for (int r = 0; r < int(local_plans.size()); ++r) {
        const auto& items = local_plans[r].items;
        if (std::any_of(items.begin(), items.end(), [&](const WriteItem& i) { return i.fqn == fqn; })) ranks.push_back(r);
      }
      TORCH_CHECK(false, e.msg(), " (chunks offered by ranks ", join_ranks(ranks), ")");
    }
  }
}

}  // namespace

std::vector<SavePlan> create_global_save_plan(const std::vector<SavePlan>& local_plans) {
  const std::unordered_map<std::string_view, KeyInfo> keys = agreed_keys(local_plans);
  std::vector<SavePlan> out = assign_writers(local_plans);
  validate_plan(local_plans, out, keys);
  return out;
}

// ---- Metadata -------------------------------------------------------------------------------

std::vector<std::string> Metadata::files() const {
  std::set<std::string> fs;
  for (const auto& [fqn, e] : entries) {
    for (const auto& c : e.chunks) fs.insert(c.file);
  }
  return {fs.begin(), fs.end()};
}

int64_t Metadata::total_bytes() const {
  int64_t n = 0;
  for (const auto& [fqn, e] : entries) {
    for (const auto& c : e.chunks) n += c.length;
  }
  return n;
}

namespace {
// A data file name from `.metadata`: a file of the checkpoint directory (save writes
// "__<rank>_<save_id>.distcp"), never a path that leads out of it.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}
}  // namespace

void validate_metadata(const Metadata& m) {
  TORCH_CHECK(m.checksum_block_bytes > 0 && m.checksum_block_bytes % 16 == 0 &&
                  m.checksum_block_bytes <= kMaxChecksumBlockBytes,
              "checkpoint metadata: checksum_block_bytes ", m.checksum_block_bytes,
              " is not a positive multiple of 16 of at most ", kMaxChecksumBlockBytes);
  std::vector<const ChunkMeta*> cs;
  for (const auto& entry : m.entries) {
    const std::string& fqn = entry.first;  // named: C++17 lambdas cannot capture bindings
    const Entry& e = entry.second;
    for (const auto& c : e.chunks) {
      TORCH_CHECK(plain_file_name(c.file), "checkpoint metadata: key '", fqn, "' is stored in '", c.file,
                  "', which is not a file name of the checkpoint directory");
      // NOTE: [Sizes from files]
      TORCH_CHECK(c.offset >= 0 && c.length >= 0 && c.offset <= std::numeric_limits<int64_t>::max() - c.length,
                  "checkpoint metadata: key '", fqn, "' has an invalid byte range (offset ", c.offset, ", length ",
                  c.length, ")");
      const int64_t blocks =
          m.checksummed ? c.length / m.checksum_block_bytes + (c.length % m.checksum_block_bytes != 0) : 0;
      TORCH_CHECK(int64_t(c.crc32.size()) == blocks, "checkpoint metadata: key '", fqn, "' chunk ", c.chunk.to_string(),
                  " has ", c.crc32.size(), " checksums for ", blocks, " blocks");
    }
    if (e.kind == ItemKind::Object) {
      TORCH_CHECK(e.chunks.size() == 1, "checkpoint metadata: object '", fqn, "' has ", e.chunks.size(),
                  " stored copies, expected 1");
      continue;
    }
    const int64_t esize = element_size(e.dtype);
    cs.clear();
    for (const auto& c : e.chunks) cs.push_back(&c.chunk);
    validate_chunks([&] { return "checkpoint metadata: key '" + fqn + "'"; }, e.size, cs);
    int64_t nbytes = 0;
    TORCH_CHECK(!__builtin_mul_overflow(numel_of(e.size), esize, &nbytes), "checkpoint metadata: key '", fqn,
                "' of size ", join(e.size), " has more than 2^63 bytes");
    // In bounds (validated above): every chunk's byte count is at most nbytes.
    for (const auto& c : e.chunks) {
      TORCH_CHECK(c.length == c.chunk.numel() * esize, "checkpoint metadata: key '", fqn, "' chunk ",
                  c.chunk.to_string(), " has ", c.length, " bytes, expected ", c.chunk.numel() * esize);
    }
  }
}

void to_json(nlohmann::json& j, const ChunkMeta& c) { j = {{"offsets", c.offsets}, {"sizes", c.sizes}}; }
// Numbers through detail::json_integer(s): these from_json read `.metadata`, a file.
void from_json(const nlohmann::json& j, ChunkMeta& c) {
  c.offsets = detail::json_integers<int64_t>(j.at("offsets"), "checkpoint metadata: chunk offsets");
  c.sizes = detail::json_integers<int64_t>(j.at("sizes"), "checkpoint metadata: chunk sizes");
}

void to_json(nlohmann::json& j, const WriteItem& w) {
  j = {{"fqn", w.fqn},   {"kind", kind_name(w.kind)}, {"dtype", w.dtype}, {"global_size", w.global_size},
       {"chunk", w.chunk}, {"nbytes", w.nbytes}};
}
void from_json(const nlohmann::json& j, WriteItem& w) {
  j.at("fqn").get_to(w.fqn);
  w.kind = kind_from_name(j.at("kind").get<std::string>());
  j.at("dtype").get_to(w.dtype);
  j.at("global_size").get_to(w.global_size);
  j.at("chunk").get_to(w.chunk);
  j.at("nbytes").get_to(w.nbytes);
}
void to_json(nlohmann::json& j, const SavePlan& p) { j = {{"items", p.items}}; }
void from_json(const nlohmann::json& j, SavePlan& p) { j.at("items").get_to(p.items); }

void to_json(nlohmann::json& j, const StoredChunk& c) {
  j = {{"file", c.file}, {"offset", c.offset}, {"length", c.length}, {"crc32", c.crc32}};
  if (!c.chunk.sizes.empty() || !c.chunk.offsets.empty()) {
    j["offsets"] = c.chunk.offsets;
    j["sizes"] = c.chunk.sizes;
  } else {
    j["offsets"] = nlohmann::json::array();
    j["sizes"] = nlohmann::json::array();
  }
}
void from_json(const nlohmann::json& j, StoredChunk& c) {
  from_json(j, c.chunk);
  j.at("file").get_to(c.file);
  c.offset = detail::json_integer<int64_t>(j.at("offset"), "checkpoint metadata: chunk offset");
  c.length = detail::json_integer<int64_t>(j.at("length"), "checkpoint metadata: chunk length");
  c.crc32 = detail::json_integers<uint32_t>(j.at("crc32"), "checkpoint metadata: crc32");
}

void to_json(nlohmann::json& j, const Entry& e) {
  j = {{"kind", kind_name(e.kind)}, {"chunks", e.chunks}};
  if (e.kind == ItemKind::Tensor) {
    j["dtype"] = e.dtype;
    j["size"] = e.size;
  }
}
void from_json(const nlohmann::json& j, Entry& e) {
  e.kind = kind_from_name(j.at("kind").get<std::string>());
  if (e.kind == ItemKind::Tensor) {
    j.at("dtype").get_to(e.dtype);
    e.size = detail::json_integers<int64_t>(j.at("size"), "checkpoint metadata: size");
  }
  j.at("chunks").get_to(e.chunks);
}

void to_json(nlohmann::json& j, const Metadata& m) {
  j = {{"format", kFormatName},
       {"version", m.version},
       {"save_id", m.save_id},
       {"world_size", m.world_size},
       {"checksum", "crc32"},
       {"checksum_block_bytes", m.checksum_block_bytes},
       {"entries", m.entries}};
}
void from_json(const nlohmann::json& j, Metadata& m) {
  TORCH_CHECK(j.is_object() && j.value("format", std::string()) == kFormatName,
              "not a dtensor-cpp checkpoint metadata file (no \"format\": \"", kFormatName, "\")");
  m.version = detail::json_integer<int>(j.at("version"), "checkpoint metadata: version");
  TORCH_CHECK(m.version == kFormatVersion, "checkpoint format version ", m.version, ", this build reads version ",
              kFormatVersion);
  TORCH_CHECK(j.value("checksum", std::string()) == "crc32", "checkpoint: unknown checksum '",
              j.value("checksum", std::string()), "'");
  m.save_id = detail::json_integer<int64_t>(j.at("save_id"), "checkpoint metadata: save_id");
  m.world_size = detail::json_integer<int>(j.at("world_size"), "checkpoint metadata: world_size");
  m.checksum_block_bytes =
      detail::json_integer<int64_t>(j.at("checksum_block_bytes"), "checkpoint metadata: checksum_block_bytes");
  j.at("entries").get_to(m.entries);
}

}  // namespace checkpoint
}  // namespace dtensor
