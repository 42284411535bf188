// fuzz/fuzz_util.h: what the fuzz targets share (docs/fuzzing.md).
//
// Each target writes its input to files in a private directory and calls the project's reader
// inside expect_clear_errors(dir, ...). The readers' contract for a bad file: a c10::Error (a
// CheckpointException from the collective readers, whose every rank's error is a c10::Error)
// whose message names the file or the checkpoint directory. Anything else (another exception
// type, a message that does not say where, a crash, a sanitizer report, a timeout, an
// allocation past libFuzzer's -malloc_limit_mb) is a finding: the program aborts, and libFuzzer
// saves the input.
#pragma once

#include "dtensor/checkpoint/api.h"

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <typeinfo>

namespace dtensor {
namespace fuzz {

// Reports a finding and aborts (libFuzzer saves the input as crash-<sha1>).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n==== FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// A directory of its own under $TMPDIR (or /tmp) for the files of one input, removed at exit.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/dtensor-fuzz-XXXXXX";
    if (!::mkdtemp(pattern.data())) finding("cannot create a temporary directory from " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Empties the directory (the files of the previous input).
  void clear() const {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path_, ec)) std::filesystem::remove_all(e.path(), ec);
  }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.flush();
  if (!out) finding("cannot write " + path);
}

// The input bytes as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

namespace internal {
inline void check_names(const std::string& message, const std::string& where) {
  if (message.find(where) == std::string::npos)
    finding("the error does not name '" + where + "' (the file or directory read): " + message);
}
}  // namespace internal

// Runs `read` (a call of a reader on files under `where`); returns whether it succeeded.
// Aborts on anything but the readers' documented error naming `where`.
template <class F>
bool expect_clear_errors(const std::string& where, F&& read) {
  try {
    read();
    return true;
  } catch (const checkpoint::CheckpointException& e) {
    for (const auto& [rank, err] : e.failures()) {
      if (err.type.rfind("c10::", 0) != 0)
        finding("rank " + std::to_string(rank) + " failed with " + err.type + " (not a c10::Error): " + err.message);
      internal::check_names(err.message, where);
    }
  } catch (const c10::Error& e) {
    internal::check_names(e.what_without_backtrace(), where);
  } catch (const std::exception& e) {
    finding("an exception of type " + c10::demangle(typeid(e).name()) + " (not a c10::Error): " + e.what());
  } catch (...) {
    finding("an exception that is not a std::exception");
  }
  return false;
}

}  // namespace fuzz
}  // namespace dtensor
