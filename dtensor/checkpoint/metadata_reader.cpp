// dtensor/checkpoint/metadata_reader.cpp: `.metadata` parsed from its text.
#include "dtensor/checkpoint/planner.h"

#include "dtensor/checkpoint/json_internal.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtensor {
namespace checkpoint {

// NOTE: [Reading .metadata fast]
// Every rank of every load reads the whole `.metadata` (1,040 chunks in the benchmark's
// checkpoint: 1.1 ms to parse into a nlohmann::json, 0.4 ms to free it, 0.25 ms to convert).
// This reader takes nlohmann::json's SAX events (its tokenizer, without the tree) straight into
// a Metadata, for the JSON that to_json(Metadata) writes, in any spacing and field order. On
// anything else (a fraction, a number out of range, a field it does not know or lacks, another
// format or version, bad syntax) it gives up and metadata_from_json_text parses into a
// nlohmann::json and uses from_json, which accept exactly what they accepted before and raise
// their messages.

namespace {

class MetadataSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  Metadata metadata;
  // Every field of the file seen (read as to_json writes them).
  bool complete() const { return root_seen_ == kAllRootFields; }

  bool null() override { return false; }
  bool boolean(bool) override { return false; }
  bool number_float(number_float_t, const string_t&) override { return false; }
  bool binary(binary_t&) override { return false; }
  bool number_integer(number_integer_t v) override { return integer(int64_t(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return v <= uint64_t(std::numeric_limits<int64_t>::max()) && integer(int64_t(v));
  }
  bool string(string_t& v) override {
    switch (top()) {
      case Ctx::Root:
        if (key_ == "format") return seen(1, v == kFormatName);
        if (key_ == "checksum") return seen(4, v == "crc32");
        return false;
      case Ctx::Entry:
        if (key_ == "kind") {
          entry_.kind = v == "tensor" ? ItemKind::Tensor : ItemKind::Object;
          entry_seen_ |= 1;
          return v == "tensor" || v == "object";
        }
        if (key_ == "dtype") {
          entry_.dtype = v;
          entry_seen_ |= 2;
          return true;
        }
        return false;
      case Ctx::Chunk:
        if (key_ != "file") return false;
        chunk_.file = v;
        chunk_seen_ |= 4;
        return true;
      default:
        return false;
    }
  }
  bool start_object(std::size_t) override {
    if (ctx_.empty()) return root_seen_ == 0 && !started_ && (started_ = true) && push(Ctx::Root);
    switch (top()) {
      case Ctx::Root:
        if (key_ != "entries") return false;
        metadata.entries.clear();
        root_seen_ |= 64;
        return push(Ctx::Entries);
      case Ctx::Entries:
        fqn_ = key_;
        entry_ = Entry{};
        entry_seen_ = 0;
        return push(Ctx::Entry);
      case Ctx::Chunks:
        chunk_ = StoredChunk{};
        chunk_seen_ = 0;
        return push(Ctx::Chunk);
      default:
        return false;
    }
  }
  bool key(string_t& k) override {
    key_ = k;
    return true;
  }
  bool end_object() override {
    const Ctx c = top();
    if (c == Ctx::None) return false;
    ctx_.pop_back();
    if (c == Ctx::Chunk) {
      if (chunk_seen_ != 63) return false;
      entry_.chunks.push_back(std::move(chunk_));
    } else if (c == Ctx::Entry) {
      if (!(entry_seen_ & 1) || !(entry_seen_ & 8)) return false;
      if (entry_.kind == ItemKind::Tensor && (!(entry_seen_ & 2) || !(entry_seen_ & 4))) return false;
      if (entry_.kind == ItemKind::Object) {  // from_json ignores these for objects
        entry_.dtype.clear();
        entry_.size.clear();
      }
      // to_json writes the keys sorted (a std::map): each goes at the end, without a search.
      auto& entries = metadata.entries;
      if (entries.empty() || std::prev(entries.end())->first < fqn_) {
        entries.emplace_hint(entries.end(), fqn_, std::move(entry_));
      } else {
        entries[fqn_] = std::move(entry_);  // out of order, or repeated: the last one wins
      }
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (top() == Ctx::Entry && key_ == "size") return ints(&entry_.size, nullptr, 4);
    if (top() == Ctx::Entry && key_ == "chunks") {
      entry_.chunks.clear();
      entry_seen_ |= 8;
      return push(Ctx::Chunks);
    }
    if (top() == Ctx::Chunk && key_ == "offsets") return ints(&chunk_.chunk.offsets, nullptr, 1);
    if (top() == Ctx::Chunk && key_ == "sizes") return ints(&chunk_.chunk.sizes, nullptr, 2);
    if (top() == Ctx::Chunk && key_ == "crc32") return ints(nullptr, &chunk_.crc32, 32);
    return false;
  }
  bool end_array() override {
    if (ctx_.empty()) return false;
    ctx_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  enum class Ctx { None, Root, Entries, Entry, Chunks, Chunk, Ints };
  static constexpr int kAllRootFields = 127;

  // None: outside the file's object (a value that is not an object, or after it).
  Ctx top() const { return ctx_.empty() ? Ctx::None : ctx_.back(); }
  bool push(Ctx c) {
    ctx_.push_back(c);
    return true;
  }
  bool seen(int bit, bool ok) {
    root_seen_ |= bit;
    return ok;
  }
  // An array of integers into `i64` or (checked to fit) `u32`; `bit` marks the field seen.
  bool ints(std::vector<int64_t>* i64, std::vector<uint32_t>* u32, int bit) {
    i64_ = i64;
    u32_ = u32;
    if (i64) i64->clear();
    if (u32) u32->clear();
    if (top() == Ctx::Entry) {
      entry_seen_ |= bit;
    } else {
      chunk_seen_ |= bit;
    }
    return push(Ctx::Ints);
  }
  bool integer(int64_t v) {
    switch (top()) {
      case Ctx::Ints:
        if (i64_) {
          i64_->push_back(v);
          return true;
        }
        if (v < 0 || v > int64_t(std::numeric_limits<uint32_t>::max())) return false;
        u32_->push_back(uint32_t(v));
        return true;
      case Ctx::Root: {
        const bool fits_int = v >= std::numeric_limits<int>::min() && v <= std::numeric_limits<int>::max();
        if (key_ == "version") {
          metadata.version = int(v);
          return seen(2, fits_int && v == kFormatVersion);
        }
        if (key_ == "world_size") {
          metadata.world_size = int(v);
          return seen(16, fits_int);
        }
        if (key_ == "save_id") {
          metadata.save_id = v;
          return seen(8, true);
        }
        if (key_ == "checksum_block_bytes") {
          metadata.checksum_block_bytes = v;
          return seen(32, true);
        }
        return false;
      }
      case Ctx::Chunk:
        if (key_ == "offset") {
          chunk_.offset = v;
          chunk_seen_ |= 8;
          return true;
        }
        if (key_ == "length") {
          chunk_.length = v;
          chunk_seen_ |= 16;
          return true;
        }
        return false;
      default:
        return false;
    }
  }

  std::vector<Ctx> ctx_;
  std::string key_, fqn_;
  Entry entry_;
  StoredChunk chunk_;
  int root_seen_ = 0, entry_seen_ = 0, chunk_seen_ = 0;
  bool started_ = false;
  std::vector<int64_t>* i64_ = nullptr;
  std::vector<uint32_t>* u32_ = nullptr;
};

}  // namespace

std::optional<Metadata> detail::parse_metadata_fast(std::string_view text) {
  MetadataSax sax;
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &sax) || !sax.complete()) return std::nullopt;
  return std::move(sax.metadata);
}

Metadata metadata_from_json_text(std::string_view text) {
  if (auto m = detail::parse_metadata_fast(text)) return std::move(*m);
  return nlohmann::json::parse(text.begin(), text.end()).get<Metadata>();
}

}  // namespace checkpoint
}  // namespace dtensor
