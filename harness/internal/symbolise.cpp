// harness/internal/symbolise.cpp
//
// NOTE: [Symbolised user frames] (rank_process.cpp): the frames of the last "[dtensor] frames:"
// line of a rank's output, symbolised with addr2line -i: a return address inside code that
// was inlined becomes one frame per inlined function, innermost first (the user's function
// around an inlined std::future::wait is a frame of its own). With line tables (-g, -g1:
// CMAKE_BUILD_TYPE=Debug or RelWithDebInfo) each frame has its file:line; without them (our
// Release build) a frame is its function and the offset in it, and the failure is filed at the
// test's DTENSOR_TEST_F line. Function names come from the symbol table (nm), qualified.
#include "harness/internal/symbolise.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>

namespace dtensor {
namespace testing {
namespace internal {

namespace {

std::string read_command(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  ::pclose(p);
  return out;
}

// The functions of `module` from its symbol table (nm -n: sorted by address; -C: demangled),
// for the qualified name of the function holding an address (addr2line -i names it by its
// DWARF name alone, "wait_forever") and for offsets in it.
std::vector<std::pair<unsigned long, std::string>> functions_of(const std::string& module) {
  std::vector<std::pair<unsigned long, std::string>> fns;
  std::istringstream is(read_command("nm -n -C --defined-only '" + module + "' 2>/dev/null"));
  for (std::string line; std::getline(is, line);) {
    // <address> <type> <name, which may contain spaces>
    const auto s1 = line.find(' ');
    if (s1 == std::string::npos || s1 + 3 > line.size() || line[s1 + 2] != ' ') continue;
    if (std::string("tTwWi").find(line[s1 + 1]) == std::string::npos) continue;
    std::string name = line.substr(s1 + 3);
    const auto clone = name.find(" [clone ");
    if (clone != std::string::npos) name.erase(clone);
    try {
      fns.emplace_back(std::stoul(line.substr(0, s1), nullptr, 16), std::move(name));
    } catch (const std::exception&) {
    }
  }
  return fns;
}

}  // namespace

std::vector<Frame> symbolise_stack(const std::string& output) {
  std::vector<Frame> frames;
  const auto at = output.rfind("[dtensor] frames:");
  if (at == std::string::npos) return frames;
  std::istringstream is(output.substr(at + 17, output.find('\n', at) - at - 17));
  std::string tok;
  std::vector<std::pair<std::string, unsigned long>> raw;
  while (is >> tok) {
    const auto plus = tok.rfind("+0x");
    if (plus == std::string::npos) continue;
    try {
      raw.emplace_back(tok.substr(0, plus), std::stoul(tok.substr(plus + 3), nullptr, 16));
    } catch (const std::exception&) {
    }
  }
  // Each return address's frames (one, or its inlined chain), in stack order.
  std::vector<std::vector<Frame>> per_address(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) per_address[i].push_back(Frame{raw[i].first});
  // One addr2line per module, its addresses in order.
  std::map<std::string, std::vector<size_t>> by_module;
  for (size_t i = 0; i < raw.size(); ++i) by_module[raw[i].first].push_back(i);
  for (auto& [module, idx] : by_module) {
    const bool system = module.find("/libc.so") != std::string::npos || module.find("libstdc++") != std::string::npos ||
                        module.find("libgcc") != std::string::npos || module.find("ld-linux") != std::string::npos ||
                        module.find("libtorch") != std::string::npos || module.find("libc10") != std::string::npos;
    if (system || ::access(module.c_str(), R_OK) != 0 || module.find('\'') != std::string::npos) continue;
    std::ostringstream cmd;
    cmd << "addr2line -C -f -i -a -e '" << module << "'";
    // The call instruction before the return address (the line of the call, not the next one).
    for (size_t i : idx) cmd << " 0x" << std::hex << (raw[i].second > 0 ? raw[i].second - 1 : 0);
    cmd << " 2>/dev/null";
    // Output per address: the address ("0x..."), then function and file:line per inlined level.
    std::istringstream lines(read_command(cmd.str()));
    size_t k = 0;  // index into idx of the current address
    bool started = false;
    std::vector<Frame>* cur = nullptr;
    for (std::string fn; std::getline(lines, fn);) {
      if (fn.rfind("0x", 0) == 0) {  // the next address
        if (started) ++k;
        started = true;
        if (k >= idx.size()) break;
        cur = &per_address[idx[k]];
        cur->clear();
        continue;
      }
      std::string loc;
      if (!cur || !std::getline(lines, loc)) break;
      Frame f;
      f.module = module;
      if (fn != "??") f.function = fn;
      const auto colon = loc.rfind(':');
      if (colon != std::string::npos && loc.substr(0, colon) != "??") {
        f.file = std::filesystem::path(loc.substr(0, colon)).lexically_normal().string();  // no "build/../"
        try {
          f.line = std::stoi(loc.substr(colon + 1));
        } catch (const std::exception&) {
          f.line = -1;  // "?": no line table
        }
      }
      if (f.line <= 0) f.file.clear();
      cur->push_back(f);
    }
    // The function holding each address (the last, outermost, frame of its chain) by its
    // symbol table name; without a line, with the return address's offset in it.
    const auto fns = functions_of(module);
    for (size_t i : idx) {
      auto& fs = per_address[i];
      if (fs.empty()) fs.push_back(Frame{module});
      auto it = std::upper_bound(fns.begin(), fns.end(), raw[i].second - 1,
                                 [](unsigned long a, const std::pair<unsigned long, std::string>& f) { return a < f.first; });
      if (it == fns.begin()) continue;
      --it;
      Frame& outer = fs.back();
      outer.function = it->second;
      if (outer.line <= 0) outer.offset = static_cast<long>(raw[i].second - it->first);
    }
  }
  for (auto& fs : per_address) frames.insert(frames.end(), fs.begin(), fs.end());
  return frames;
}

// The harness's own sources: this file's directory's parent (<src>/harness/), as built.
bool in_harness_source(const std::string& file) {
  static const std::string dir = [] {
    std::string f = __FILE__;  // <src>/harness/internal/symbolise.cpp
    const auto cut = f.rfind("/internal/");
    return cut == std::string::npos ? std::string() : f.substr(0, cut + 1);
  }();
  if (!dir.empty() && dir[0] == '/' && !file.empty() && file[0] == '/') return file.rfind(dir, 0) == 0;
  return file.find("harness/internal/") != std::string::npos || file.find("harness/multi_rank_test") != std::string::npos ||
         file.find("harness/harness_main") != std::string::npos;
}

bool harness_or_library(const Frame& f) {
  if (f.function.rfind("dtensor::testing::", 0) == 0 || f.function.rfind("testing::", 0) == 0) return true;
  if (f.function.rfind("std::", 0) == 0 || f.function.rfind("__", 0) == 0) return true;  // library templates
  return in_harness_source(f.file) || f.file.find("/gtest/") != std::string::npos ||
         f.file.find("/googletest/") != std::string::npos || f.file.rfind("/usr/include/", 0) == 0;
}

// The user's frame: the first one with a function that is not the harness's, gtest's, or in
// a system library or libtorch (those were not symbolised).
const Frame* user_frame(const std::vector<Frame>& frames) {
  for (auto& f : frames)
    if (!f.function.empty() && !harness_or_library(f)) return &f;
  return nullptr;
}
std::string frame_str(const Frame& f) {
  std::string s = f.function;
  if (f.line > 0) {
    s += " (" + f.file + ":" + std::to_string(f.line) + ")";
  } else if (f.offset >= 0) {
    std::ostringstream os;
    os << "+0x" << std::hex << f.offset;
    s += os.str();
  }
  return s;
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
