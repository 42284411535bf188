// dtensor/checkpoint/dcp_format.cpp: see dcp_internal.h. The classes and fields are those of
// PyTorch's torch/distributed/checkpoint/metadata.py and filesystem.py (_StorageInfo); the
// torch.save stream is what torch/serialization.py writes (records "<archive>/data.pkl",
// "<archive>/data/<key>", "<archive>/byteorder", stored uncompressed).
#include "dtensor/checkpoint/dcp_internal.h"

#include "dtensor/checkpoint/python_pickle_internal.h"

#include <c10/util/Exception.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

namespace dtensor {
namespace checkpoint {
namespace detail {

namespace {

namespace fs = std::filesystem;
using K = PyValue::Kind;

const std::string kMeta = "torch.distributed.checkpoint.metadata.";

// (torch's storage class, our dtype name): what torch.save names a tensor's storage by.
const std::map<std::string, std::string>& storage_dtypes() {
  static const std::map<std::string, std::string> m = {
      {"torch.FloatStorage", "float32"},   {"torch.DoubleStorage", "float64"},
      {"torch.HalfStorage", "float16"},    {"torch.BFloat16Storage", "bfloat16"},
      {"torch.LongStorage", "int64"},      {"torch.IntStorage", "int32"},
      {"torch.ShortStorage", "int16"},     {"torch.CharStorage", "int8"},
      {"torch.ByteStorage", "uint8"},      {"torch.BoolStorage", "bool"},
      {"torch.ComplexFloatStorage", "complex64"}, {"torch.ComplexDoubleStorage", "complex128"},
  };
  return m;
}

const char* const kDtypes[] = {"float32", "float64", "float16", "bfloat16", "int64",     "int32",
                               "int16",   "int8",    "uint8",   "bool",     "complex64", "complex128"};

// The globals a DCP `.metadata` names.
const std::set<std::string>& metadata_globals() {
  static const std::set<std::string> s = [] {
    std::set<std::string> g = {
        kMeta + "Metadata", kMeta + "TensorStorageMetadata", kMeta + "ChunkStorageMetadata",
        kMeta + "BytesStorageMetadata", kMeta + "TensorProperties", kMeta + "MetadataIndex",
        kMeta + "StorageMeta", kMeta + "_MEM_FORMAT_ENCODING",
        "torch.distributed.checkpoint.filesystem._StorageInfo", "torch.Size", "torch.serialization._get_layout",
        "collections.OrderedDict", "pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib.WindowsPath",
        "pathlib.PureWindowsPath",
        // Python 3.13 moved pathlib's classes into pathlib._local, and pickles them by that name.
        "pathlib._local.PosixPath", "pathlib._local.PurePosixPath", "pathlib._local.WindowsPath",
        "pathlib._local.PureWindowsPath"};
    for (const char* d : kDtypes) g.insert(std::string("torch.") + d);
    return g;
  }();
  return s;
}

// The globals a torch.save stream of one tensor names.
const std::set<std::string>& tensor_globals() {
  static const std::set<std::string> s = [] {
    std::set<std::string> g = {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict"};
    for (const auto& sd : storage_dtypes()) g.insert(sd.first);
    return g;
  }();
  return s;
}

std::string join(const std::vector<int64_t>& v) { return int_list_string(v); }

// The fields of a dataclass instance (NEWOBJ, then BUILD with its __dict__, or with
// (__dict__, slots) for classes with __slots__); nullptr when it has no field `name`.
const PyValue* field(const PyValue* o, const std::string& name) {
  if (!o->state) return nullptr;
  if (o->state->is(K::Dict)) return o->state->get(name);
  if (o->state->is(K::Tuple) && o->state->items.size() == 2) {
    for (const PyValue* part : o->state->items) {
      if (const PyValue* v = part->get(name)) return v;
    }
  }
  return nullptr;
}

class Translator {
 public:
  explicit Translator(const std::string& dir) : dir_(dir) {}
  ~Translator() {
    for (auto& f : files_) ::close(f.second.fd);
  }

  Metadata run(const std::string& bytes) {
    const Unpickled u = unpickle_strict(bytes.data(), bytes.size(), metadata_globals(), "PyTorch DCP metadata");
    const PyValue* root = u.root;
    check(root->is(K::Object) && root->s == kMeta + "Metadata", "holds " + root->describe() + ", not a Metadata");
    const PyValue* sdm = need_field(root, "state_dict_metadata", "the Metadata");
    const PyValue* storage = need_field(root, "storage_data", "the Metadata");
    check(sdm->is(K::Dict), "state_dict_metadata is " + sdm->describe() + ", not a dict");
    check(storage->is(K::Dict), "storage_data is " + storage->describe() + ", not a dict");
    index_storage(storage);

    Metadata m;
    m.checksummed = false;
    for (size_t k = 0; k + 1 < sdm->items.size(); k += 2) {
      const PyValue* key = sdm->items[k];
      const PyValue* value = sdm->items[k + 1];
      check(key->is(K::Str), "state_dict_metadata has " + key->describe() + " as a key, not a str");
      const std::string& fqn = key->s;
      check(!m.entries.count(fqn), "state_dict_metadata has key '" + fqn + "' twice");
      check(value->is(K::Object), "key '" + fqn + "' is described by " + value->describe());
      if (value->s == kMeta + "BytesStorageMetadata") {
        m.entries[fqn] = object_entry(fqn);
      } else if (value->s == kMeta + "TensorStorageMetadata") {
        m.entries[fqn] = tensor_entry(fqn, value);
      } else {
        check(false, "key '" + fqn + "' is described by " + value->describe());
      }
    }
    return m;
  }

 private:
  void check(bool ok, const std::string& why) const {
    TORCH_CHECK(ok, "PyTorch DCP metadata: ", why);
  }
  const PyValue* need_field(const PyValue* o, const std::string& name, const std::string& of) const {
    const PyValue* v = field(o, name);
    check(v != nullptr, of + " has no field '" + name + "'");
    return v;
  }
  // A torch.Size, tuple or list of ints.
  std::vector<int64_t> ints(const PyValue* v, const std::string& what) const {
    if (v->is(K::Object) && v->s == "torch.Size" && v->items.size() == 1) v = v->items[0];
    check(v->is(K::Tuple) || v->is(K::List), what + " is " + v->describe() + ", not a size");
    std::vector<int64_t> out;
    for (const PyValue* x : v->items) {
      check(x->is(K::Int) && x->i >= 0, what + " holds " + x->describe() + ", not a size");
      out.push_back(x->i);
    }
    return out;
  }
  // (key, chunk offsets; none for an object): what storage_data is keyed by (MetadataIndex's
  // identity: its index is a hint).
  using StorageKey = std::pair<std::string, std::optional<std::vector<int64_t>>>;

  struct Info {
    std::string file;
    int64_t offset = 0, length = 0;
  };

  // storage_data: MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length[, transform_descriptors]).
  void index_storage(const PyValue* storage) {
    for (size_t k = 0; k + 1 < storage->items.size(); k += 2) {
      const PyValue* idx = storage->items[k];
      const PyValue* info = storage->items[k + 1];
      check(idx->is(K::Object) && idx->s == kMeta + "MetadataIndex",
            "storage_data has " + idx->describe() + " as a key, not a MetadataIndex");
      const PyValue* fqn = need_field(idx, "fqn", "a MetadataIndex");
      check(fqn->is(K::Str), "a MetadataIndex's fqn is " + fqn->describe());
      const PyValue* off = field(idx, "offset");
      std::optional<std::vector<int64_t>> offsets;
      if (off && !off->is(K::None)) offsets = ints(off, "the offset of key '" + fqn->s + "'");
      check(info->is(K::Object) && info->s == "torch.distributed.checkpoint.filesystem._StorageInfo",
            "key '" + fqn->s + "' is stored as " + info->describe() + ", not a _StorageInfo");
      const PyValue* rel = need_field(info, "relative_path", "the _StorageInfo of key '" + fqn->s + "'");
      const PyValue* o = need_field(info, "offset", "the _StorageInfo of key '" + fqn->s + "'");
      const PyValue* n = need_field(info, "length", "the _StorageInfo of key '" + fqn->s + "'");
      check(rel->is(K::Str) && o->is(K::Int) && n->is(K::Int) && o->i >= 0 && n->i >= 0,
            "the _StorageInfo of key '" + fqn->s + "' is not (relative_path: str, offset: int, length: int)");
      const PyValue* transforms = field(info, "transform_descriptors");
      check(!transforms || transforms->is(K::None) || transforms->items.empty(),
            "key '" + fqn->s + "' is stored through transforms (transform_descriptors, such as compression), "
            "which this reader does not apply");
      StorageKey key{fqn->s, offsets};
      check(!storage_.count(key), "storage_data names key '" + fqn->s + "' (offset " +
                                      (offsets ? join(*offsets) : std::string("None")) + ") twice");
      storage_[std::move(key)] = Info{rel->s, o->i, n->i};
    }
  }

  const Info& info_of(const std::string& fqn, const std::optional<std::vector<int64_t>>& offsets) const {
    auto it = storage_.find(StorageKey{fqn, offsets});
    check(it != storage_.end(), "storage_data has no entry for key '" + fqn + "'" +
                                    (offsets ? " chunk at offsets " + join(*offsets) : std::string()));
    return it->second;
  }

  Entry object_entry(const std::string& fqn) {
    const Info& info = info_of(fqn, std::nullopt);
    Entry e;
    e.kind = ItemKind::Object;
    StoredChunk sc;
    sc.file = info.file;
    sc.offset = info.offset;
    sc.length = info.length;
    e.chunks.push_back(std::move(sc));
    return e;
  }

  Entry tensor_entry(const std::string& fqn, const PyValue* tsm) {
    const std::string of = "the TensorStorageMetadata of key '" + fqn + "'";
    Entry e;
    e.kind = ItemKind::Tensor;
    const PyValue* props = need_field(tsm, "properties", of);
    check(props->is(K::Object) && props->s == kMeta + "TensorProperties", of + " has properties " + props->describe());
    // TensorProperties pickles its state as a tuple (dtype, layout, requires_grad,
    // memory_format, pin_memory[, strides]); older versions as a dict.
    const PyValue* dtype = nullptr;
    if (props->state && props->state->is(K::Tuple) && !props->state->items.empty()) {
      dtype = props->state->items[0];
    } else {
      dtype = field(props, "dtype");
    }
    check(dtype && dtype->is(K::Global) && dtype->s.compare(0, 6, "torch.") == 0 &&
              std::find(std::begin(kDtypes), std::end(kDtypes), dtype->s.substr(6)) != std::end(kDtypes),
          of + " has dtype " + (dtype ? dtype->describe() : std::string("None")) + ", not one this reader takes");
    e.dtype = dtype->s.substr(6);
    e.size = ints(need_field(tsm, "size", of), "the size of key '" + fqn + "'");
    const PyValue* chunks = need_field(tsm, "chunks", of);
    check(chunks->is(K::List), of + " has chunks " + chunks->describe());
    for (const PyValue* c : chunks->items) {
      check(c->is(K::Object) && c->s == kMeta + "ChunkStorageMetadata", of + " has a chunk " + c->describe());
      ChunkMeta box{ints(need_field(c, "offsets", "a chunk of key '" + fqn + "'"), "a chunk offset of key '" + fqn + "'"),
                    ints(need_field(c, "sizes", "a chunk of key '" + fqn + "'"), "a chunk size of key '" + fqn + "'")};
      check(box.offsets.size() == e.size.size() && box.sizes.size() == e.size.size(),
            "key '" + fqn + "' of size " + join(e.size) + " has a chunk " + box.to_string());
      // Sizes from the file: bounded before any product of them is taken (validate_metadata
      // checks the chunks against the key's size afterwards).
      uint64_t numel = 1;
      for (int64_t s : box.sizes) {
        check(s < (int64_t(1) << 48) && (s == 0 || numel <= (uint64_t(1) << 48) / uint64_t(s)),
              "key '" + fqn + "' has a chunk of more than 2^48 elements: " + box.to_string());
        numel *= uint64_t(s);
      }
      const Info& info = info_of(fqn, box.offsets);
      e.chunks.push_back(locate_chunk(fqn, e.dtype, std::move(box), info));
    }
    return e;
  }

  // ---- the torch.save stream of one chunk ----

  struct OpenFile {
    int fd;
    int64_t size;
  };
  const OpenFile& open(const std::string& name, const std::string& fqn) {
    auto it = files_.find(name);
    if (it != files_.end()) return it->second;
    check(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
              name.find('\0') == std::string::npos,
          "key '" + fqn + "' is stored in '" + name + "', which is not a file name of the checkpoint directory");
    const std::string p = (fs::path(dir_) / name).string();
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    TORCH_CHECK(fd >= 0, "cannot open data file '", p, "' (key '", fqn, "'): ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      TORCH_CHECK(false, "cannot read data file '", p, "' (key '", fqn, "'): not a regular file");
    }
    return files_.emplace(name, OpenFile{fd, int64_t(st.st_size)}).first->second;
  }
  // Bytes [at, at + n) of the stream at `info` (n bytes, inside the stream and the file).
  std::string read(const OpenFile& f, const Info& info, const std::string& fqn, uint64_t at, uint64_t n) {
    const std::string where = "the torch.save stream of key '" + fqn + "' in '" + info.file + "' (bytes [" +
                              std::to_string(info.offset) + ", " + std::to_string(info.offset + info.length) + "))";
    TORCH_CHECK(at <= uint64_t(info.length) && n <= uint64_t(info.length) - at, where, " is malformed: it points at bytes [",
                at, ", ", at + n, ") of its ", info.length);
    TORCH_CHECK(info.offset + int64_t(at + n) <= f.size, where, " is truncated: the file ends at ", f.size);
    std::string out(size_t(n), '\0');
    size_t got = 0;
    while (got < n) {
      ssize_t r = ::pread(f.fd, &out[got], n - got, off_t(info.offset + int64_t(at + got)));
      if (r < 0 && errno == EINTR) continue;
      TORCH_CHECK(r > 0, "cannot read ", where, ": ", r < 0 ? std::strerror(errno) : "the file ended");
      got += size_t(r);
    }
    return out;
  }

  static uint64_t le(const std::string& s, size_t at, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(s[at + size_t(i)]);
    return v;
  }

  struct Record {
    uint64_t local = 0, size = 0;
  };

  // The records of the zip archive (the torch.save stream) at `info`, by name without the
  // archive's folder ("data.pkl", "data/0", "byteorder").
  std::map<std::string, Record> records(const OpenFile& f, const Info& info, const std::string& fqn) {
    const std::string where = "the torch.save stream of key '" + fqn + "' in '" + info.file + "'";
    const uint64_t len = uint64_t(info.length);
    TORCH_CHECK(len >= 22, where, " has ", len, " bytes: not a zip archive (torch.save format)");
    // The end of central directory record ends the stream (torch.save writes no comment): the
    // last 4 KiB hold it and, for a tensor, the whole directory. Only a stream whose record is
    // not there is searched further, as far as a comment can reach.
    std::string tail;
    size_t eocd = 0;
    for (uint64_t want : {uint64_t(4096), uint64_t(22 + 65535)}) {
      const uint64_t tail_n = std::min<uint64_t>(len, want);
      tail = read(f, info, fqn, len - tail_n, tail_n);
      eocd = tail.size() - 22;
      while (eocd > 0 && le(tail, eocd, 4) != 0x06054b50) --eocd;
      if (le(tail, eocd, 4) == 0x06054b50 || tail_n == len) break;
    }
    TORCH_CHECK(le(tail, eocd, 4) == 0x06054b50, where,
                " is not a zip archive (torch.save format): no end of central directory");
    const uint64_t count = le(tail, eocd + 10, 2), cd_size = le(tail, eocd + 12, 4), cd_offset = le(tail, eocd + 16, 4);
    TORCH_CHECK(count != 0xffff && cd_size != 0xffffffff && cd_offset != 0xffffffff, where,
                " is a zip64 archive (a chunk of 4 GiB or more), which this reader does not take yet");
    const std::string cd = read(f, info, fqn, cd_offset, cd_size);
    std::map<std::string, Record> out;
    size_t at = 0;
    for (uint64_t e = 0; e < count; ++e) {
      TORCH_CHECK(cd.size() - at >= 46 && le(cd, at, 4) == 0x02014b50, where, ": its zip directory entry ", e,
                  " is malformed");
      const uint64_t method = le(cd, at + 10, 2), comp = le(cd, at + 20, 4), uncomp = le(cd, at + 24, 4);
      const uint64_t name_len = le(cd, at + 28, 2), extra = le(cd, at + 30, 2), comment = le(cd, at + 32, 2);
      TORCH_CHECK(name_len + extra + comment <= cd.size() - at - 46, where, ": its zip directory entry ", e,
                  " is malformed");
      std::string name = cd.substr(at + 46, size_t(name_len));
      TORCH_CHECK(method == 0 && comp == uncomp, where, ": record '", name,
                  "' is compressed (torch.save stores records as they are)");
      const size_t slash = name.find('/');
      if (slash != std::string::npos) name = name.substr(slash + 1);
      out[name] = Record{le(cd, at + 42, 4), uncomp};
      at += size_t(46 + name_len + extra + comment);
    }
    return out;
  }
  // Where a record's bytes start in the stream (after its local header).
  uint64_t record_start(const OpenFile& f, const Info& info, const std::string& fqn, const std::string& name,
                        const Record& r) {
    const std::string h = read(f, info, fqn, r.local, 30);
    TORCH_CHECK(le(h, 0, 4) == 0x04034b50, "the torch.save stream of key '", fqn, "' in '", info.file, "': record '",
                name, "' has no local header");
    const uint64_t start = r.local + 30 + le(h, 26, 2) + le(h, 28, 2);
    TORCH_CHECK(start <= uint64_t(info.length) && r.size <= uint64_t(info.length) - start, "the torch.save stream of key '",
                fqn, "' in '", info.file, "': record '", name, "' of ", r.size, " bytes does not lie inside the stream (",
                info.length, " bytes)");
    return start;
  }

  // The raw bytes of chunk `box` of key `fqn` (dtype `dtype`) inside the torch.save stream at `info`.
  StoredChunk locate_chunk(const std::string& fqn, const std::string& dtype, ChunkMeta box, const Info& info) {
    const OpenFile& f = open(info.file, fqn);
    const std::string where = "the torch.save stream of key '" + fqn + "' (chunk " + box.to_string() + ") in '" +
                              info.file + "'";
    auto recs = records(f, info, fqn);
    auto pkl = recs.find("data.pkl");
    TORCH_CHECK(pkl != recs.end(), where, " has no data.pkl record");
    TORCH_CHECK(pkl->second.size <= (uint64_t(1) << 20), where, ": its data.pkl has ", pkl->second.size,
                " bytes, more than a tensor's description takes");
    const uint64_t pkl_start = record_start(f, info, fqn, "data.pkl", pkl->second);
    auto bo = recs.find("byteorder");
    if (bo != recs.end()) {
      const std::string order = read(f, info, fqn, record_start(f, info, fqn, "byteorder", bo->second), bo->second.size);
      TORCH_CHECK(order == "little", where, " was saved on a '", order, "'-endian machine; this reader takes little-endian");
    }
    const std::string pickle = read(f, info, fqn, pkl_start, pkl->second.size);
    const Unpickled u = unpickle_strict(pickle.data(), pickle.size(), tensor_globals(), where + ", data.pkl");
    // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
    const PyValue* t = u.root;
    TORCH_CHECK(t->is(K::Object) && t->s == "torch._utils._rebuild_tensor_v2" && t->items.size() >= 4, where,
                " holds ", t->describe(), ", not a tensor");
    const PyValue* pid = t->items[0];
    TORCH_CHECK(pid->is(K::Object) && pid->s == "persistent_id" && pid->items[0]->is(K::Tuple) &&
                    pid->items[0]->items.size() == 5,
                where, ": the tensor's storage is ", pid->describe(), ", not a storage record");
    const auto& sid = pid->items[0]->items;  // ('storage', type, key, location, numel)
    TORCH_CHECK(sid[0]->is(K::Str) && sid[0]->s == "storage" && sid[1]->is(K::Global) && sid[2]->is(K::Str) &&
                    sid[4]->is(K::Int),
                where, ": the tensor's storage is not ('storage', type, key, location, numel)");
    auto st = storage_dtypes().find(sid[1]->s);
    TORCH_CHECK(st != storage_dtypes().end(), where, ": the tensor's storage type is ", sid[1]->s);
    const std::string& stored_dtype = st->second;
    TORCH_CHECK(stored_dtype == dtype, where, " holds ", stored_dtype, " values; the metadata says ", dtype);
    const PyValue* off = t->items[1];
    TORCH_CHECK(off->is(K::Int) && off->i >= 0, where, ": the storage offset is ", off->describe());
    const std::vector<int64_t> size = ints(t->items[2], where + ": the size");
    const std::vector<int64_t> stride = ints(t->items[3], where + ": the stride");
    TORCH_CHECK(size == box.sizes, where, " holds a tensor of size ", join(size), "; the metadata says ",
                join(box.sizes));
    TORCH_CHECK(stride.size() == size.size(), where, ": its stride ", join(stride), " does not match its size");
    int64_t expect = 1;
    for (size_t d = size.size(); d-- > 0;) {
      TORCH_CHECK(size[d] == 1 || stride[d] == expect, where, " holds a tensor of size ", join(size), " with strides ",
                  join(stride), ", not row-major: this reader takes row-major (contiguous) chunks");
      expect *= size[d];  // size == box.sizes, whose product is below 2^48
    }
    const int64_t esize = element_size(dtype);
    const int64_t numel = box.numel();
    auto data = recs.find("data/" + sid[2]->s);
    TORCH_CHECK(data != recs.end(), where, " has no record data/", sid[2]->s, " for its storage");
    // The chunk's bytes lie inside the storage record.
    const uint64_t first = uint64_t(off->i) * uint64_t(esize), nbytes = uint64_t(numel) * uint64_t(esize);
    TORCH_CHECK(off->i < (int64_t(1) << 48) && numel < (int64_t(1) << 48) && first <= data->second.size &&
                    nbytes <= data->second.size - first,
                where, ": its storage record has ", data->second.size, " bytes; the tensor needs [", first, ", ",
                first + nbytes, ")");
    const uint64_t start = record_start(f, info, fqn, "data/" + sid[2]->s, data->second);
    StoredChunk sc;
    sc.chunk = std::move(box);
    sc.file = info.file;
    sc.offset = info.offset + int64_t(start + first);
    sc.length = int64_t(nbytes);
    sc.stream_offset = info.offset;
    sc.stream_length = info.length;
    return sc;
  }

  std::string dir_;
  std::map<StorageKey, Info> storage_;
  std::map<std::string, OpenFile> files_;
};

}  // namespace

bool is_dcp_metadata(const std::string& bytes) { return !bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80; }

Metadata read_dcp_metadata(const std::string& dir, const std::string& bytes) {
  return Translator(dir).run(bytes);
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
