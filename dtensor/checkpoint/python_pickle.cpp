// dtensor/checkpoint/python_pickle.cpp: see python_pickle_internal.h. The opcodes are those of
// Python's Lib/pickletools.py (protocols 0 to 5, less the text forms PyTorch never writes).
#include "dtensor/checkpoint/python_pickle_internal.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace dtensor {
namespace checkpoint {
namespace detail {

const PyValue* PyValue::get(const std::string& key) const {
  if (kind != Kind::Dict) return nullptr;
  for (size_t k = 0; k + 1 < items.size(); k += 2) {
    if (items[k]->kind == Kind::Str && items[k]->s == key) return items[k + 1];
  }
  return nullptr;
}

std::string PyValue::describe() const {
  switch (kind) {
    case Kind::None: return "None";
    case Kind::Bool: return i ? "True" : "False";
    case Kind::Int: return "the int " + std::to_string(i);
    case Kind::Float: return "a float";
    case Kind::Str: {
      std::string out = "the str '";
      out.append(s, 0, std::min<size_t>(s.size(), 40));
      if (s.size() > 40) out += "...";
      return out + "'";
    }
    case Kind::Bytes: return "bytes";
    case Kind::Tuple: return "a tuple of " + std::to_string(items.size());
    case Kind::List: return "a list of " + std::to_string(items.size());
    case Kind::Dict: return "a dict of " + std::to_string(items.size() / 2);
    case Kind::Global: return "the global " + s;
    case Kind::Object: return "a " + s + "(...)";
  }
  return "?";
}

namespace {

uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

class Reader {
 public:
  Reader(const char* data, size_t size, const std::set<std::string>& allowed, const std::string& what)
      : p_(reinterpret_cast<const unsigned char*>(data)), n_(size), allowed_(allowed), what_(what) {}

  Unpickled run() {
    while (true) {
      need(1, "an opcode");
      const size_t at = i_;
      const unsigned char op = p_[i_++];
      if (op == '.') {
        TORCH_CHECK(!stack_.empty() && marks_.empty(), what_, ": the pickle's STOP at byte ", at,
                    " finds ", stack_.empty() ? "an empty stack" : "an open MARK");
        out_.root = stack_.back();
        return std::move(out_);
      }
      step(op, at);
    }
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& why) {
    TORCH_CHECK(false, what_, ": the pickle ", why, " (byte ", at, ")");
  }
  void need(uint64_t k, const char* arg) {
    if (k > n_ - i_) fail(i_, "ends inside " + std::string(arg) + ": " + std::to_string(k) + " bytes needed, " +
                                   std::to_string(n_ - i_) + " left");
  }
  uint64_t fixed(int k, const char* arg) {
    need(uint64_t(k), arg);
    const uint64_t v = le(p_ + i_, k);
    i_ += size_t(k);
    return v;
  }
  std::string bytes(uint64_t k, const char* arg) {
    need(k, arg);
    std::string s(reinterpret_cast<const char*>(p_ + i_), size_t(k));
    i_ += size_t(k);
    return s;
  }
  std::string line(const char* arg) {
    const void* nl = i_ < n_ ? std::memchr(p_ + i_, '\n', n_ - i_) : nullptr;
    if (!nl) fail(i_, "ends inside " + std::string(arg));
    const size_t end = size_t(static_cast<const unsigned char*>(nl) - p_);
    std::string s(reinterpret_cast<const char*>(p_ + i_), end - i_);
    i_ = end + 1;
    return s;
  }

  PyValue* make(PyValue::Kind k) {
    out_.arena.push_back(std::make_unique<PyValue>());
    out_.arena.back()->kind = k;
    return out_.arena.back().get();
  }
  void push(PyValue* v) { stack_.push_back(v); }
  PyValue* pop(size_t at, const char* op) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      fail(at, std::string("has ") + op + " with nothing to take from the stack");
    }
    PyValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PyValue* top(size_t at, const char* op) {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) {
      fail(at, std::string("has ") + op + " with nothing on the stack");
    }
    return stack_.back();
  }
  // The values above the last MARK, which is removed.
  std::vector<PyValue*> pop_mark(size_t at, const char* op) {
    if (marks_.empty()) fail(at, std::string("has ") + op + " without a MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<PyValue*> v(stack_.begin() + std::ptrdiff_t(m), stack_.end());
    stack_.resize(m);
    return v;
  }
  void memo_put(uint64_t id, size_t at) {
    if (id > memo_.size()) fail(at, "stores memo id " + std::to_string(id) + ", skipping ids (the next is " +
                                        std::to_string(memo_.size()) + ")");
    PyValue* v = top(at, "a memo store");
    if (id == memo_.size()) {
      memo_.push_back(v);
    } else {
      memo_[size_t(id)] = v;
    }
  }
  void memo_get(uint64_t id, size_t at) {
    if (id >= memo_.size()) fail(at, "reads memo id " + std::to_string(id) + ", which was never stored");
    push(memo_[size_t(id)]);
  }
  PyValue* global(const std::string& module, const std::string& name, size_t at) {
    const std::string full = module + "." + name;
    TORCH_CHECK(allowed_.count(full), what_, ": the pickle names the global '", full,
                "', which this file never holds; it is refused, since loading a checkpoint must not run code (byte ",
                at, ")");
    PyValue* g = make(PyValue::Kind::Global);
    g->s = full;
    return g;
  }
  PyValue* str(PyValue::Kind k, std::string s) {
    PyValue* v = make(k);
    v->s = std::move(s);
    return v;
  }
  PyValue* integer(int64_t x) {
    PyValue* v = make(PyValue::Kind::Int);
    v->i = x;
    return v;
  }
  // LONG1 / LONG4: little-endian two's complement of `k` bytes, at most 8.
  PyValue* long_int(uint64_t k, size_t at) {
    if (k > 8) fail(at, "holds an integer of " + std::to_string(k) + " bytes, more than 64 bits");
    need(k, "an integer");
    uint64_t v = 0;
    for (uint64_t b = k; b-- > 0;) v = v << 8 | p_[i_ + b];
    if (k > 0 && k < 8 && (p_[i_ + k - 1] & 0x80)) v |= ~uint64_t(0) << (8 * k);  // sign-extend
    i_ += size_t(k);
    return integer(int64_t(v));
  }
  // Object of a callable (Global) with its arguments.
  PyValue* call(PyValue* callable, PyValue* args, size_t at, const char* op) {
    if (callable->kind != PyValue::Kind::Global) fail(at, std::string("has ") + op + " on " + callable->describe());
    if (args->kind != PyValue::Kind::Tuple) fail(at, std::string("has ") + op + " with " + args->describe() + " as its arguments");
    PyValue* o = make(PyValue::Kind::Object);
    o->s = callable->s;
    o->items = args->items;
    return o;
  }

  // The stack's structure: protocol, frames, marks, tuples, lists and dicts.
  // False when `op` is not one of them.
  bool step_structure(unsigned char op, size_t at) {
    using K = PyValue::Kind;
    switch (op) {
      case 0x80: {  // PROTO
        const uint64_t v = fixed(1, "PROTO");
        if (v > 5) fail(at, "has protocol " + std::to_string(v) + ", newer than 5");
        return true;
      }
      case 0x95: fixed(8, "FRAME"); return true;  // FRAME: a hint, the bytes follow inline
      case '(': marks_.push_back(stack_.size()); return true;
      case ')': push(make(K::Tuple)); return true;
      case ']': push(make(K::List)); return true;
      case '}': push(make(K::Dict)); return true;
      case 0x8f: push(make(K::List)); return true;  // EMPTY_SET, read as a list
      case 't': case 'l': case 0x91: {  // TUPLE, LIST, FROZENSET
        PyValue* v = make(op == 't' || op == 0x91 ? K::Tuple : K::List);
        for (PyValue* x : pop_mark(at, "TUPLE")) v->items.push_back(x);
        push(v);
        return true;
      }
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        const size_t k = size_t(op - 0x84);
        PyValue* v = make(K::Tuple);
        v->items.resize(k);
        for (size_t j = k; j-- > 0;) v->items[j] = pop(at, "TUPLE1/2/3");
        push(v);
        return true;
      }
      case 'd': {  // DICT
        auto kv = pop_mark(at, "DICT");
        if (kv.size() % 2) fail(at, "has DICT with an odd number of items");
        PyValue* v = make(K::Dict);
        v->items.assign(kv.begin(), kv.end());
        push(v);
        return true;
      }
      case 'a': {  // APPEND
        PyValue* x = pop(at, "APPEND");
        PyValue* l = top(at, "APPEND");
        if (l->kind != K::List) fail(at, "appends to " + l->describe());
        l->items.push_back(x);
        return true;
      }
      case 'e': case 0x90: {  // APPENDS, ADDITEMS
        auto xs = pop_mark(at, "APPENDS");
        PyValue* l = top(at, "APPENDS");
        if (l->kind != K::List) fail(at, "appends to " + l->describe());
        l->items.insert(l->items.end(), xs.begin(), xs.end());
        return true;
      }
      case 's': {  // SETITEM
        PyValue* v = pop(at, "SETITEM");
        PyValue* k = pop(at, "SETITEM");
        PyValue* d = top(at, "SETITEM");
        if (d->kind != K::Dict) fail(at, "sets an item of " + d->describe());
        d->items.push_back(k);
        d->items.push_back(v);
        return true;
      }
      case 'u': {  // SETITEMS
        auto kv = pop_mark(at, "SETITEMS");
        if (kv.size() % 2) fail(at, "has SETITEMS with an odd number of items");
        PyValue* d = top(at, "SETITEMS");
        if (d->kind != K::Dict) fail(at, "sets items of " + d->describe());
        d->items.insert(d->items.end(), kv.begin(), kv.end());
        return true;
      }
      default: return false;
    }
  }

  // Literals: None, booleans, integers, floats, strings and bytes.
  // False when `op` is not one of them.
  bool step_literal(unsigned char op, size_t at) {
    using K = PyValue::Kind;
    switch (op) {
      case 'N': push(make(K::None)); return true;
      case 0x88: case 0x89: {  // NEWTRUE, NEWFALSE
        PyValue* v = make(K::Bool);
        v->i = op == 0x88;
        push(v);
        return true;
      }
      case 'K': push(integer(int64_t(fixed(1, "BININT1")))); return true;
      case 'M': push(integer(int64_t(fixed(2, "BININT2")))); return true;
      case 'J': push(integer(int64_t(int32_t(uint32_t(fixed(4, "BININT")))))); return true;
      case 0x8a: push(long_int(fixed(1, "LONG1"), at)); return true;
      case 0x8b: push(long_int(fixed(4, "LONG4"), at)); return true;
      case 'G': {  // BINFLOAT: big-endian IEEE double
        need(8, "BINFLOAT");
        uint64_t b = 0;
        for (int k = 0; k < 8; ++k) b = b << 8 | p_[i_ + size_t(k)];
        i_ += 8;
        PyValue* v = make(K::Float);
        std::memcpy(&v->f, &b, 8);
        push(v);
        return true;
      }
      case 0x8c: push(str(K::Str, bytes(fixed(1, "SHORT_BINUNICODE"), "a string"))); return true;
      case 'X': push(str(K::Str, bytes(fixed(4, "BINUNICODE"), "a string"))); return true;
      case 0x8d: push(str(K::Str, bytes(fixed(8, "BINUNICODE8"), "a string"))); return true;
      case 'U': push(str(K::Str, bytes(fixed(1, "SHORT_BINSTRING"), "a string"))); return true;
      case 'T': push(str(K::Str, bytes(fixed(4, "BINSTRING"), "a string"))); return true;
      case 'C': push(str(K::Bytes, bytes(fixed(1, "SHORT_BINBYTES"), "bytes"))); return true;
      case 'B': push(str(K::Bytes, bytes(fixed(4, "BINBYTES"), "bytes"))); return true;
      case 0x8e: push(str(K::Bytes, bytes(fixed(8, "BINBYTES8"), "bytes"))); return true;
      default: return false;
    }
  }

  // Globals, calls, objects' state, persistent ids, the memo, and POP / DUP.
  // False when `op` is not one of them.
  bool step_object(unsigned char op, size_t at) {
    using K = PyValue::Kind;
    switch (op) {
      case 'c': {  // GLOBAL
        std::string module = line("GLOBAL's module");
        std::string name = line("GLOBAL's name");
        push(global(module, name, at));
        return true;
      }
      case 0x93: {  // STACK_GLOBAL
        PyValue* name = pop(at, "STACK_GLOBAL");
        PyValue* module = pop(at, "STACK_GLOBAL");
        if (module->kind != K::Str || name->kind != K::Str) fail(at, "has STACK_GLOBAL without two strings");
        push(global(module->s, name->s, at));
        return true;
      }
      case 'R': {  // REDUCE
        PyValue* args = pop(at, "REDUCE");
        PyValue* f = pop(at, "REDUCE");
        push(call(f, args, at, "REDUCE"));
        return true;
      }
      case 0x81: {  // NEWOBJ
        PyValue* args = pop(at, "NEWOBJ");
        PyValue* cls = pop(at, "NEWOBJ");
        push(call(cls, args, at, "NEWOBJ"));
        return true;
      }
      case 0x92: {  // NEWOBJ_EX: cls, args, kwargs
        PyValue* kwargs = pop(at, "NEWOBJ_EX");
        PyValue* args = pop(at, "NEWOBJ_EX");
        PyValue* cls = pop(at, "NEWOBJ_EX");
        if (kwargs->kind != K::Dict || !kwargs->items.empty()) fail(at, "has NEWOBJ_EX with keyword arguments");
        push(call(cls, args, at, "NEWOBJ_EX"));
        return true;
      }
      case 'b': {  // BUILD
        PyValue* state = pop(at, "BUILD");
        PyValue* o = top(at, "BUILD");
        if (o->kind != K::Object) fail(at, "builds " + o->describe());
        if (o->state) fail(at, "builds " + o->describe() + " twice");
        o->state = state;
        return true;
      }
      case 'Q': {  // BINPERSID
        PyValue* pid = pop(at, "BINPERSID");
        PyValue* o = make(K::Object);
        o->s = "persistent_id";
        o->items.push_back(pid);
        push(o);
        return true;
      }
      case 0x94: memo_put(memo_.size(), at); return true;  // MEMOIZE
      case 'q': memo_put(fixed(1, "BINPUT"), at); return true;
      case 'r': memo_put(fixed(4, "LONG_BINPUT"), at); return true;
      case 'h': memo_get(fixed(1, "BINGET"), at); return true;
      case 'j': memo_get(fixed(4, "LONG_BINGET"), at); return true;
      case '0': pop(at, "POP"); return true;
      case '1': pop_mark(at, "POP_MARK"); return true;
      case '2': push(top(at, "DUP")); return true;
      default: return false;
    }
  }

  void step(unsigned char op, size_t at) {
    if (step_structure(op, at) || step_literal(op, at) || step_object(op, at)) return;
    std::ostringstream os;
    os << "has opcode 0x" << std::hex << int(op) << ", which this reader does not take";
    fail(at, os.str());
  }

  const unsigned char* p_;
  size_t n_;
  size_t i_ = 0;
  const std::set<std::string>& allowed_;
  const std::string& what_;
  std::vector<PyValue*> stack_;
  std::vector<size_t> marks_;
  std::vector<PyValue*> memo_;
  Unpickled out_;
};

}  // namespace

Unpickled unpickle_strict(const char* data, size_t size, const std::set<std::string>& allowed, const std::string& what) {
  return Reader(data, size, allowed, what).run();
}

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
