// dtensor/checkpoint/python_pickle_internal.h: a strict reader of Python pickles, for the
// files PyTorch's distributed checkpoint writes (`.metadata`: pickle.dump of its Metadata; each
// tensor's torch.save stream: data.pkl). Internal: not part of the API.
//
// Unlike Python's pickle.load, it never calls anything: a class or function the pickle names
// (GLOBAL, STACK_GLOBAL) must be one of the caller's allowed globals, and REDUCE, NEWOBJ and
// BUILD only record what they would have called with what. Anything else raises a c10::Error
// naming the global, so a checkpoint file cannot run code. The bytes are untrusted: every
// length is checked against what is left, memo ids must count up from 0, and values live in an
// arena (no recursion when they are freed, however deep the nesting).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {
namespace detail {

struct PyValue {
  enum class Kind { None, Bool, Int, Float, Str, Bytes, Tuple, List, Dict, Global, Object };
  Kind kind = Kind::None;
  int64_t i = 0;  // Bool, Int
  double f = 0;   // Float
  // Str, Bytes; Global: "module.name"; Object: the global it was made from.
  std::string s;
  // Tuple, List: the items. Dict: keys and values alternating. Object: the arguments of the
  // call (REDUCE) or of __new__ (NEWOBJ); a persistent id (BINPERSID) is an Object whose `s`
  // is "persistent_id" with the id as its one argument.
  std::vector<const PyValue*> items;
  // Object: what BUILD gave it (nullptr: none).
  const PyValue* state = nullptr;

  bool is(Kind k) const { return kind == k; }
  // The value of `key` in a Dict (a Str key); nullptr when absent.
  const PyValue* get(const std::string& key) const;
  // "an int", "a str 'abc'", "a tuple of 3", "a torch.Size(...)": for messages.
  std::string describe() const;
};

// The values of one pickle; `root` is what STOP returned.
struct Unpickled {
  std::vector<std::unique_ptr<PyValue>> arena;
  const PyValue* root = nullptr;
};

// Reads `data[0, size)`. `allowed`: the globals ("module.name") the pickle may name. Errors are
// c10::Errors, "<what>: <why>".
Unpickled unpickle_strict(const char* data, size_t size, const std::set<std::string>& allowed, const std::string& what);

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
