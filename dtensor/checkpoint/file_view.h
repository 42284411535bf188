// dtensor/checkpoint/file_view.h
//
// A read-only stream over a byte range of another stream: how one object stored inside a
// larger checkpoint file is read without copying it out (torch.distributed.checkpoint.utils'
// _create_file_view / _ReaderView).
//
//   std::ifstream file("__0_0.distcp", std::ios::binary);
//   auto view = dtensor::checkpoint::create_file_view(file, /*offset=*/4096, /*length=*/512);
//   std::string bytes(512, '\0');
//   view->read(bytes.data(), 512);        // bytes [4096, 4608) of the file
//
// Positions (seekg/tellg) are relative to the start of the range; seeking from the end
// (std::ios::end) counts back from the end of the range. Unlike PyTorch's view, reads stop at
// the end of the range (a read past it returns what is left and sets eof). The base stream
// must outlive the view and is repositioned by it (do not read both at once).
#pragma once

#include <cstdint>
#include <istream>
#include <memory>
#include <streambuf>
#include <vector>

namespace dtensor {
namespace checkpoint {

class ReaderView : public std::streambuf {
 public:
  ReaderView(std::istream& base, int64_t offset, int64_t length);

  int64_t offset() const { return offset_; }
  int64_t length() const { return length_; }

 protected:
  int_type underflow() override;
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode which) override;
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override;
  std::streamsize showmanyc() override;

 private:
  int64_t position() const;  // of the next character to read, in the range

  std::istream& base_;
  int64_t offset_;
  int64_t length_;
  int64_t buffer_start_ = 0;  // range position of the buffer's first byte
  std::vector<char> buffer_;
};

// An istream over bytes [offset, offset + length) of `file`. Throws when offset or length is
// negative. (PyTorch: _create_file_view.)
std::unique_ptr<std::istream> create_file_view(std::istream& file, int64_t offset, int64_t length);

}  // namespace checkpoint
}  // namespace dtensor
