// dtensor/checkpoint/pickle_check.cpp: see pickle_internal.h. The zip layout is PKWARE's
// APPNOTE (what caffe2/serialize/inline_container.cc writes through miniz); the opcodes are
// Python's Lib/pickletools.py.
#include "dtensor/checkpoint/pickle_internal.h"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>

namespace dtensor {
namespace checkpoint {
namespace detail {

namespace {

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// The pickle `p[0, n)`: every opcode known, its argument inside the pickle, memo ids in order.
void check_pickle(const unsigned char* p, size_t n, const std::string& what) {
  size_t i = 0, memo = 0;
  auto need = [&](uint64_t k, const char* op) {
    TORCH_CHECK(k <= n - i, what, ": the pickle's ", op, " at byte ", i, " needs ", k, " bytes, ", n - i, " are left");
  };
  auto put = [&](uint64_t id) {
    TORCH_CHECK(id <= memo, what, ": the pickle's memo id ", id, " at byte ", i, " skips ids (the next is ", memo, ")");
    if (id == memo) ++memo;
  };
  auto line = [&] {  // a newline-terminated argument
    const void* nl = std::memchr(p + i, '\n', n - i);
    TORCH_CHECK(nl, what, ": the pickle ends inside a text argument at byte ", i);
    i = size_t(static_cast<const unsigned char*>(nl) - p) + 1;
  };
  while (i < n) {
    const unsigned char op = p[i++];
    switch (op) {
      case '.':  // STOP
        return;
      // No argument.
      case '(': case ')': case ']': case '}': case '0': case '1': case '2': case 'N': case 'R': case 'a': case 'b':
      case 'd': case 'e': case 'l': case 's': case 't': case 'u': case 'o': case 'Q': case 0x81: case 0x85: case 0x86:
      case 0x87: case 0x88: case 0x89: case 0x8f: case 0x90: case 0x91: case 0x92: case 0x93: case 0x97: case 0x98:
        break;
      case 0x94: ++memo; break;  // MEMOIZE
      // Fixed arguments.
      case 0x80: need(1, "PROTO"); i += 1; break;
      case 'K': need(1, "BININT1"); i += 1; break;
      case 'M': need(2, "BININT2"); i += 2; break;
      case 'J': need(4, "BININT"); i += 4; break;
      case 'G': need(8, "BINFLOAT"); i += 8; break;
      case 'h': need(1, "BINGET"); i += 1; break;
      case 'j': need(4, "LONG_BINGET"); i += 4; break;
      case 0x82: need(1, "EXT1"); i += 1; break;
      case 0x83: need(2, "EXT2"); i += 2; break;
      case 0x84: need(4, "EXT4"); i += 4; break;
      case 0x95: need(8, "FRAME"); i += 8; break;
      case 'q': need(1, "BINPUT"); put(p[i]); i += 1; break;
      case 'r': need(4, "LONG_BINPUT"); put(le(p + i, 4)); i += 4; break;
      // Length-prefixed arguments: the length must fit in what is left.
      case 0x8c: case 'C': case 'U': case 0x8a: {  // SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING, LONG1
        need(1, "a short string");
        const uint64_t k = p[i++];
        need(k, "a short string");
        i += size_t(k);
        break;
      }
      case 'X': case 'B': case 'T': case 0x8b: {  // BINUNICODE, BINBYTES, BINSTRING, LONG4
        need(4, "a string");
        const uint64_t k = le(p + i, 4);
        i += 4;
        need(k, "a string");
        i += size_t(k);
        break;
      }
      case 0x8d: case 0x8e: case 0x96: {  // BINUNICODE8, BINBYTES8, BYTEARRAY8
        need(8, "a long string");
        const uint64_t k = le(p + i, 8);
        i += 8;
        need(k, "a long string");
        i += size_t(k);
        break;
      }
      // Newline-terminated arguments.
      case 'c': line(); line(); break;  // GLOBAL: module, name
      case 'I': case 'L': case 'F': case 'S': case 'V': case 'g': case 'P': line(); break;
      case 'p': line(); ++memo; break;  // PUT (text id)
      default:
        TORCH_CHECK(false, what, ": the pickle has an unknown opcode ", int(op), " at byte ", i - 1);
    }
  }
  TORCH_CHECK(false, what, ": the pickle has no STOP opcode");
}

}  // namespace

void check_pickled_value(const char* data, size_t size, const std::string& what) {
  const auto* b = reinterpret_cast<const unsigned char*>(data);
  // 1. The end of central directory record (22 bytes and a comment of up to 65535).
  TORCH_CHECK(size >= 22, what, ": ", size, " bytes are not a zip archive (torch.save format)");
  size_t eocd = size - 22;
  while (le(b + eocd, 4) != 0x06054b50) {
    TORCH_CHECK(eocd > 0 && size - eocd < 22 + 65535, what, ": not a zip archive (torch.save format): no end of central directory");
    --eocd;
  }
  const uint64_t count = le(b + eocd + 10, 2), cd_size = le(b + eocd + 12, 4), cd_offset = le(b + eocd + 16, 4);
  TORCH_CHECK(cd_offset <= eocd && cd_size <= eocd - cd_offset, what, ": the zip archive's central directory [", cd_offset,
              ", ", cd_offset + cd_size, ") is not inside its ", size, " bytes");
  // 2. Every record stored (uncompressed, as PyTorch writes them) inside the archive; the pickle.
  size_t at = size_t(cd_offset), pkl = 0, pkl_size = 0;
  bool found = false;
  for (uint64_t e = 0; e < count; ++e) {
    TORCH_CHECK(eocd - at >= 46 && le(b + at, 4) == 0x02014b50, what, ": the zip archive's directory entry ", e,
                " is malformed");
    const uint64_t method = le(b + at + 10, 2), comp = le(b + at + 20, 4), uncomp = le(b + at + 24, 4);
    const uint64_t name_len = le(b + at + 28, 2), extra = le(b + at + 30, 2), comment = le(b + at + 32, 2);
    const uint64_t local = le(b + at + 42, 4);
    TORCH_CHECK(name_len + extra + comment <= eocd - at - 46, what, ": the zip archive's directory entry ", e,
                " is malformed");
    const std::string name(reinterpret_cast<const char*>(b + at + 46), size_t(name_len));
    TORCH_CHECK(method == 0 && comp == uncomp, what, ": record '", name, "' is compressed or its sizes differ (",
                comp, " stored, ", uncomp, " uncompressed): PyTorch stores records as they are");
    TORCH_CHECK(local <= size && size - local >= 30 && le(b + local, 4) == 0x04034b50, what, ": record '", name,
                "' has no local header inside the archive");
    const uint64_t start = local + 30 + le(b + local + 26, 2) + le(b + local + 28, 2);
    TORCH_CHECK(start <= size && uncomp <= size - start, what, ": record '", name, "' of ", uncomp,
                " bytes does not lie inside the archive (", size, " bytes)");
    if (name.size() >= 9 && name.compare(name.size() - 9, 9, "/data.pkl") == 0) {
      found = true;
      pkl = size_t(start);
      pkl_size = size_t(uncomp);
    }
    at += size_t(46 + name_len + extra + comment);
  }
  TORCH_CHECK(found, what, ": the zip archive has no data.pkl record (not written by torch.save / pickle_save)");
  // 3. The pickle.
  check_pickle(b + pkl, pkl_size, what);
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
