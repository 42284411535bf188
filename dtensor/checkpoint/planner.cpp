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
#include <tuple>

namespace dtensor {
namespace checkpoint {

namespace {

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

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
  for (size_t i = 0; i < nonempty.size(); ++i) {
    for (size_t j = i + 1; j < nonempty.size(); ++j) {
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

std::vector<SavePlan> create_global_save_plan(const std::vector<SavePlan>& local_plans) {
  // 1. Every rank's view of each key must agree.
  struct KeyInfo {
    ItemKind kind;
    std::string dtype;
    std::vector<int64_t> size;
    int rank;
  };
  std::map<std::string, KeyInfo> keys;
  for (int r = 0; r < int(local_plans.size()); ++r) {
    for (const auto& item : local_plans[r].items) {
      auto it = keys.find(item.fqn);
      if (it == keys.end()) {
        keys.emplace(item.fqn, KeyInfo{item.kind, item.dtype, item.global_size, r});
        continue;
      }
      const KeyInfo& k = it->second;
      TORCH_CHECK(k.kind == item.kind, "key '", item.fqn, "' is a ", kind_name(k.kind), " on rank ", k.rank,
                  " but a ", kind_name(item.kind), " on rank ", r);
      if (item.kind == ItemKind::Tensor) {
        TORCH_CHECK(k.dtype == item.dtype, "key '", item.fqn, "' has dtype ", k.dtype, " on rank ", k.rank, " but ",
                    item.dtype, " on rank ", r);
        TORCH_CHECK(k.size == item.global_size, "key '", item.fqn, "' has global size ", join(k.size), " on rank ",
                    k.rank, " but ", join(item.global_size), " on rank ", r);
      }
    }
  }

  // 2. Dedup: one writer per (key, box), the least-loaded rank holding it, largest first.
  using ItemKey = std::tuple<std::string, std::vector<int64_t>, std::vector<int64_t>>;
  std::map<ItemKey, std::vector<int>> holders;
  std::map<ItemKey, const WriteItem*> first_item;
  for (int r = 0; r < int(local_plans.size()); ++r) {
    for (const auto& item : local_plans[r].items) {
      ItemKey key{item.fqn, item.chunk.offsets, item.chunk.sizes};
      auto& hs = holders[key];
      if (hs.empty() || hs.back() != r) hs.push_back(r);
      first_item.emplace(key, &item);
    }
  }
  std::vector<std::pair<ItemKey, const WriteItem*>> order(first_item.begin(), first_item.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second->nbytes > b.second->nbytes; });
  std::vector<int64_t> load(local_plans.size(), 0);
  std::vector<SavePlan> out(local_plans.size());
  for (const auto& [key, item] : order) {
    const auto& hs = holders[key];
    int best = hs.front();
    for (int r : hs) {
      if (load[r] < load[best]) best = r;
    }
    load[best] += std::max<int64_t>(item->nbytes, 1);
    out[best].items.push_back(*item);
  }
  // Deterministic order within each rank's file: by key, then box.
  for (auto& p : out) {
    std::sort(p.items.begin(), p.items.end(), [](const WriteItem& a, const WriteItem& b) {
      return std::tie(a.fqn, a.chunk) < std::tie(b.fqn, b.chunk);
    });
  }

  // 3. Validate every tensor's chunks.
  std::map<std::string, std::vector<ChunkMeta>> chunks;
  for (const auto& p : out) {
    for (const auto& item : p.items) {
      if (item.kind == ItemKind::Tensor) chunks[item.fqn].push_back(item.chunk);
    }
  }
  for (const auto& key_chunks : chunks) {
    const std::string& fqn = key_chunks.first;  // named: C++17 lambdas cannot capture bindings
    const std::vector<ChunkMeta>& cs = key_chunks.second;
    const KeyInfo& k = keys.at(fqn);
    std::vector<int> ranks;
    for (int r = 0; r < int(local_plans.size()); ++r) {
      for (const auto& item : local_plans[r].items) {
        if (item.fqn == fqn) {
          ranks.push_back(r);
          break;
        }
      }
    }
    std::vector<const ChunkMeta*> ptrs;
    for (const auto& c : cs) ptrs.push_back(&c);
    try {
      validate_chunks([&] { return "key '" + fqn + "'"; }, k.size, ptrs);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, e.msg(), " (chunks offered by ranks ", join_ranks(ranks), ")");
    }
  }
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

// ---- reading `.metadata` fast -----------------------------------------------------------
//
// Every rank of every load reads the whole `.metadata` (1,040 chunks in the benchmark's
// checkpoint: 1.1 ms to parse into a nlohmann::json, 0.4 ms to free it, 0.25 ms to convert,
// against 0.3 ms here). This reader takes the JSON that to_json(Metadata) writes, in any
// spacing and field order, straight into a Metadata. On anything else (a string with escapes or
// non-ASCII bytes, a fraction, a field it does not know or lacks, another format or version,
// bad syntax) it gives up and metadata_from_json_text parses with nlohmann::json and from_json,
// which accept exactly what they accepted before and raise their messages.

namespace {

struct GiveUp {};

class FastMetadataReader {
 public:
  explicit FastMetadataReader(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  Metadata read() {
    Metadata m;
    bool format = false, version = false, checksum = false, save_id = false, world = false, block = false,
         entries = false;
    object([&](std::string_view key) {
      if (key == "format") {
        if (str_view() != kFormatName) throw GiveUp{};
        format = true;
      } else if (key == "version") {
        m.version = int(integer(std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
        if (m.version != kFormatVersion) throw GiveUp{};
        version = true;
      } else if (key == "checksum") {
        if (str_view() != "crc32") throw GiveUp{};
        checksum = true;
      } else if (key == "save_id") {
        m.save_id = integer();
        save_id = true;
      } else if (key == "world_size") {
        m.world_size = int(integer(std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
        world = true;
      } else if (key == "checksum_block_bytes") {
        m.checksum_block_bytes = integer();
        block = true;
      } else if (key == "entries") {
        m.entries.clear();
        // to_json writes the keys sorted (a std::map): each goes at the end, without a search.
        object([&](std::string_view fqn) {
          Entry e = entry();
          if (m.entries.empty() || std::prev(m.entries.end())->first < fqn) {
            m.entries.emplace_hint(m.entries.end(), std::string(fqn), std::move(e));
          } else {
            m.entries[std::string(fqn)] = std::move(e);  // out of order, or repeated: the last one wins
          }
        });
        entries = true;
      } else {
        throw GiveUp{};
      }
    });
    ws();
    if (p_ != end_ || !(format && version && checksum && save_id && world && block && entries)) throw GiveUp{};
    return m;
  }

 private:
  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  void expect(char c) {
    ws();
    if (p_ >= end_ || *p_ != c) throw GiveUp{};
    ++p_;
  }
  // true and past `c` when the next character is `c`.
  bool accept(char c) {
    ws();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  // Plain ASCII strings only (no escapes, no control or non-ASCII bytes); a view of the text.
  std::string_view str_view() {
    expect('"');
    const char* s = p_;
    while (p_ < end_ && *p_ != '"') {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '\\' || c < 0x20 || c >= 0x80) throw GiveUp{};
      ++p_;
    }
    if (p_ >= end_) throw GiveUp{};
    return std::string_view(s, size_t(p_++ - s));
  }
  std::string str() { return std::string(str_view()); }
  int64_t integer(int64_t lo = std::numeric_limits<int64_t>::min(), int64_t hi = std::numeric_limits<int64_t>::max()) {
    ws();
    bool neg = p_ < end_ && *p_ == '-';
    if (neg) ++p_;
    const char* s = p_;
    uint64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') v = v * 10 + uint64_t(*p_++ - '0');
    const size_t digits = size_t(p_ - s);
    // No fractions or exponents, no leading zeros, at most 18 digits (no overflow).
    if (digits == 0 || digits > 18 || (digits > 1 && *s == '0')) throw GiveUp{};
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) throw GiveUp{};
    const int64_t x = neg ? -int64_t(v) : int64_t(v);
    if (x < lo || x > hi) throw GiveUp{};
    return x;
  }
  // Parsed into scratch_ first, so that `out` is allocated once, at its size.
  template <class T>
  void int_array(std::vector<T>& out, int64_t lo, int64_t hi) {
    scratch_.clear();
    expect('[');
    if (!accept(']')) {
      do {
        scratch_.push_back(integer(lo, hi));
      } while (accept(','));
      expect(']');
    }
    out.assign(scratch_.begin(), scratch_.end());
  }
  std::vector<int64_t> dims() {
    std::vector<int64_t> v;
    int_array(v, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
    return v;
  }
  // {"key": value, ...}; on_key parses the value.
  template <class F>
  void object(F&& on_key) {
    expect('{');
    if (accept('}')) return;
    do {
      const std::string_view key = str_view();
      expect(':');
      on_key(key);
    } while (accept(','));
    expect('}');
  }
  template <class F>
  void array(F&& on_item) {
    expect('[');
    if (accept(']')) return;
    do {
      on_item();
    } while (accept(','));
    expect(']');
  }
  StoredChunk chunk() {
    StoredChunk c;
    int seen = 0;
    object([&](std::string_view key) {
      if (key == "offsets") {
        c.chunk.offsets = dims();
        seen |= 1;
      } else if (key == "sizes") {
        c.chunk.sizes = dims();
        seen |= 2;
      } else if (key == "file") {
        c.file = str();
        seen |= 4;
      } else if (key == "offset") {
        c.offset = integer();
        seen |= 8;
      } else if (key == "length") {
        c.length = integer();
        seen |= 16;
      } else if (key == "crc32") {
        int_array(c.crc32, 0, int64_t(std::numeric_limits<uint32_t>::max()));
        seen |= 32;
      } else {
        throw GiveUp{};
      }
    });
    if (seen != 63) throw GiveUp{};
    return c;
  }
  Entry entry() {
    Entry e;
    bool kind = false, dtype = false, size = false, chunks = false;
    object([&](std::string_view key) {
      if (key == "kind") {
        const std::string_view k = str_view();
        if (k != "tensor" && k != "object") throw GiveUp{};
        e.kind = k == "tensor" ? ItemKind::Tensor : ItemKind::Object;
        kind = true;
      } else if (key == "dtype") {
        e.dtype = str();
        dtype = true;
      } else if (key == "size") {
        e.size = dims();
        size = true;
      } else if (key == "chunks") {
        e.chunks.clear();
        array([&] { e.chunks.push_back(chunk()); });
        chunks = true;
      } else {
        throw GiveUp{};
      }
    });
    if (!kind || !chunks) throw GiveUp{};
    if (e.kind == ItemKind::Tensor) {
      if (!dtype || !size) throw GiveUp{};
    } else {
      // from_json ignores these for objects.
      e.dtype.clear();
      e.size.clear();
    }
    return e;
  }

  const char* p_;
  const char* end_;
  std::vector<int64_t> scratch_;
};

}  // namespace

std::optional<Metadata> detail::parse_metadata_fast(std::string_view text) {
  try {
    return FastMetadataReader(text).read();
  } catch (const GiveUp&) {
    return std::nullopt;
  }
}

Metadata metadata_from_json_text(std::string_view text) {
  if (auto m = detail::parse_metadata_fast(text)) return std::move(*m);
  return nlohmann::json::parse(text.begin(), text.end()).get<Metadata>();
}

}  // namespace checkpoint
}  // namespace dtensor
