// dtensor/checkpoint/file_view.cpp
#include "dtensor/checkpoint/file_view.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace dtensor {
namespace checkpoint {

namespace {
constexpr int64_t kViewBufferBytes = 64 * 1024;

// Owns the ReaderView of the istream built on it (the buffer must exist before the istream).
struct ViewHolder {
  ReaderView view;
};
class FileView : private ViewHolder, public std::istream {
 public:
  FileView(std::istream& base, int64_t offset, int64_t length)
      : ViewHolder{ReaderView(base, offset, length)}, std::istream(&view) {}
};
}  // namespace

ReaderView::ReaderView(std::istream& base, int64_t offset, int64_t length)
    : base_(base), offset_(offset), length_(length) {
  TORCH_CHECK(offset >= 0 && length >= 0, "create_file_view: offset and length must be >= 0, got offset ", offset,
              ", length ", length);
  setg(nullptr, nullptr, nullptr);
}

int64_t ReaderView::position() const { return buffer_start_ + (gptr() - eback()); }

ReaderView::int_type ReaderView::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  const int64_t next = position();
  if (next >= length_) return traits_type::eof();
  buffer_.resize(static_cast<size_t>(std::min(kViewBufferBytes, length_ - next)));
  base_.clear();
  base_.seekg(offset_ + next);
  base_.read(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
  const std::streamsize got = base_.gcount();
  if (got <= 0) return traits_type::eof();  // the file ends before the range does
  buffer_start_ = next;
  setg(buffer_.data(), buffer_.data(), buffer_.data() + got);
  return traits_type::to_int_type(*gptr());
}

ReaderView::pos_type ReaderView::seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode which) {
  if (!(which & std::ios_base::in)) return pos_type(off_type(-1));
  int64_t target = off;
  if (dir == std::ios_base::cur)
    target += position();
  else if (dir == std::ios_base::end)
    target += length_;
  if (target < 0 || target > length_) return pos_type(off_type(-1));
  if (target == position()) return pos_type(target);  // tellg(): keep the buffer
  buffer_start_ = target;
  setg(nullptr, nullptr, nullptr);
  return pos_type(target);
}

ReaderView::pos_type ReaderView::seekpos(pos_type pos, std::ios_base::openmode which) {
  return seekoff(off_type(pos), std::ios_base::beg, which);
}

std::streamsize ReaderView::showmanyc() { return std::max<int64_t>(length_ - position(), 0); }

std::unique_ptr<std::istream> create_file_view(std::istream& file, int64_t offset, int64_t length) {
  return std::make_unique<FileView>(file, offset, length);
}

}  // namespace checkpoint
}  // namespace dtensor
