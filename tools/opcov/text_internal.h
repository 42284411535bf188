// tools/opcov/text_internal.h: text helpers of the op-coverage report's writers.
#pragma once

#include <iomanip>
#include <map>
#include <sstream>
#include <string>

namespace dtensor {
namespace opcov {
namespace text {

inline bool not_passing(const std::string& status) { return status != "pass" && status != "skip"; }

inline std::string name_of(const std::string& op) {
  const auto sep = op.find("::");
  const auto dot = op.find('.', sep == std::string::npos ? 0 : sep + 2);
  return dot == std::string::npos ? op : op.substr(0, dot);
}

// "aten::add_" -> "aten::add"; dunder names ("aten::__lshift__") stay.
inline std::string base_name(const std::string& name) {
  if (name.size() > 2 && name.back() == '_' && name[name.size() - 2] != '_') return name.substr(0, name.size() - 1);
  return name;
}

inline std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

inline std::string md_escape(std::string s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '|' || s[i] == '\n') s[i] = s[i] == '|' ? '/' : ' ';
  return s;
}

inline std::string first_line(const std::string& s, size_t max = 300) {
  std::string l = s.substr(0, s.find('\n'));
  return l.size() > max ? l.substr(0, max) + "..." : l;
}

inline int count_of(const std::map<std::string, int>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

inline std::string pct(int n, int d) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << (d ? 100.0 * n / d : 0.0) << "%";
  return os.str();
}

}  // namespace text
}  // namespace opcov
}  // namespace dtensor
