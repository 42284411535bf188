// dtensor/checkpoint/dcp_writer.cpp: DCP's `.metadata` written as PyTorch's pickle of its
// metadata classes (torch/distributed/checkpoint/metadata.py), and the offset of a tensor's bytes
// in a torch.save stream (see dcp_internal.h).
#include "dtensor/checkpoint/dcp_internal.h"

#include "dtensor/checkpoint/python_pickle_internal.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace detail {

namespace {

// A pickle (protocol 2) of DCP's metadata classes, written forwards: no memo (Python's
// unpickler needs none), so a shared value is written again where it recurs.
class Pickler {
 public:
  Pickler() { out_ += "\x80\x02"; }
  std::string finish() {
    out_ += '.';
    return std::move(out_);
  }
  void op(char c) { out_ += c; }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  void str(const std::string& s) {
    out_ += 'X';
    le(uint64_t(s.size()), 4);
    out_ += s;
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out_ += 'K';
      le(uint64_t(v), 1);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      le(uint64_t(uint32_t(int32_t(v))), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes, two's complement
      le(uint64_t(v), 8);
    }
  }
  void none() { out_ += 'N'; }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }
  // torch.Size(v)
  void size(const std::vector<int64_t>& v) {
    global("torch", "Size");
    out_ += "((";
    for (int64_t x : v) integer(x);
    out_ += "ttR";
  }
  // An instance of `module.name` made as pickle makes a dataclass (cls.__new__(cls)); its
  // state follows, then build().
  void object(const std::string& module, const std::string& name) {
    global(module, name);
    out_ += ")\x81";
  }
  void build() { out_ += 'b'; }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_ += char((v >> (8 * i)) & 0xff);
  }
  std::string out_;
};

const std::string kMetaModule = "torch.distributed.checkpoint.metadata";

void write_tensor_metadata(Pickler& p, const Entry& e) {
  p.object(kMetaModule, "TensorStorageMetadata");
  p.op('}');
  p.op('(');
  p.str("properties");
  // TensorProperties' state: (dtype, layout, requires_grad, memory_format, pin_memory), the
  // form every PyTorch version's __setstate__ takes.
  p.object(kMetaModule, "TensorProperties");
  p.op('(');
  p.global("torch", e.dtype);
  p.global("torch.serialization", "_get_layout");
  p.op('(');
  p.str("torch.strided");
  p.op('t');
  p.op('R');
  p.boolean(false);
  p.global(kMetaModule, "_MEM_FORMAT_ENCODING");
  p.op('(');
  p.integer(0);  // TORCH_CONTIGUOUS_FORMAT
  p.op('t');
  p.op('R');
  p.boolean(false);
  p.op('t');
  p.build();
  p.str("size");
  p.size(e.size);
  p.str("chunks");
  p.op(']');
  p.op('(');
  for (const auto& c : e.chunks) {
    p.object(kMetaModule, "ChunkStorageMetadata");
    p.op('}');
    p.op('(');
    p.str("offsets");
    p.size(c.chunk.offsets);
    p.str("sizes");
    p.size(c.chunk.sizes);
    p.op('u');
    p.build();
  }
  p.op('e');
  p.op('u');
  p.build();
}

void write_storage_info(Pickler& p, const std::string& fqn, const std::vector<int64_t>* offsets, const std::string& file,
                        int64_t offset, int64_t length) {
  p.object(kMetaModule, "MetadataIndex");
  p.op('}');
  p.op('(');
  p.str("fqn");
  p.str(fqn);
  p.str("offset");
  if (offsets) {
    p.size(*offsets);
  } else {
    p.none();
  }
  p.str("index");
  p.none();
  p.op('u');
  p.build();
  p.object("torch.distributed.checkpoint.filesystem", "_StorageInfo");
  p.op('}');
  p.op('(');
  p.str("relative_path");
  p.str(file);
  p.str("offset");
  p.integer(offset);
  p.str("length");
  p.integer(length);
  p.op('u');
  p.build();
}

uint64_t le_at(const char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

uint64_t tensor_bytes_offset(const std::vector<char>& stream) {
  const size_t n = stream.size();
  const char* b = stream.data();
  TORCH_CHECK(n >= 22, "pickle_save wrote ", n, " bytes, not a zip archive");
  size_t eocd = n - 22;
  while (le_at(b + eocd, 4) != 0x06054b50) {
    TORCH_CHECK(eocd > 0, "pickle_save's output has no zip directory");
    --eocd;
  }
  const uint64_t count = le_at(b + eocd + 10, 2);
  size_t at = size_t(le_at(b + eocd + 16, 4));
  for (uint64_t e = 0; e < count && at + 46 <= eocd; ++e) {
    const uint64_t name_len = le_at(b + at + 28, 2), extra = le_at(b + at + 30, 2), comment = le_at(b + at + 32, 2);
    const std::string name(b + at + 46, size_t(name_len));
    const uint64_t local = le_at(b + at + 42, 4);
    if (name.size() >= 7 && name.compare(name.size() - 7, 7, "/data/0") == 0) {
      TORCH_CHECK(local + 30 <= n, "pickle_save's record ", name, " lies outside its output");
      return local + 30 + le_at(b + local + 26, 2) + le_at(b + local + 28, 2);
    }
    at += size_t(46 + name_len + extra + comment);
  }
  TORCH_CHECK(false, "pickle_save wrote no data/0 record for a tensor");
}

std::string dcp_metadata_pickle(const Metadata& m) {
  Pickler p;
  p.object(kMetaModule, "Metadata");
  p.op('}');
  p.op('(');
  p.str("state_dict_metadata");
  p.op('}');
  p.op('(');
  for (const auto& [fqn, e] : m.entries) {
    p.str(fqn);
    if (e.kind == ItemKind::Object) {
      p.object(kMetaModule, "BytesStorageMetadata");
    } else {
      write_tensor_metadata(p, e);
    }
  }
  p.op('u');
  // planner_data: each key's path in the nested state dict (DCP's flatten_state_dict mapping),
  // read only by loads without a destination; a key is its own one-element path here.
  p.str("planner_data");
  p.op('}');
  p.op('(');
  for (const auto& entry : m.entries) {
    p.str(entry.first);
    p.op('(');
    p.str(entry.first);
    p.op('t');
  }
  p.op('u');
  p.str("storage_data");
  p.op('}');
  p.op('(');
  for (const auto& [fqn, e] : m.entries) {
    for (const auto& c : e.chunks) {
      if (e.kind == ItemKind::Object) {
        write_storage_info(p, fqn, nullptr, c.file, c.offset, c.length);
      } else {
        TORCH_CHECK(c.stream_offset >= 0, "key '", fqn, "' has a chunk without its torch.save stream");
        write_storage_info(p, fqn, &c.chunk.offsets, c.file, c.stream_offset, c.stream_length);
      }
    }
  }
  p.op('u');
  p.str("storage_meta");
  p.none();
  p.str("version");
  p.str("1.0.0");
  p.op('u');
  p.build();
  return p.finish();
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
