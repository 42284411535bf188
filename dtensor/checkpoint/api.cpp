// dtensor/checkpoint/api.cpp: CheckpointException and wrapped per-rank errors.
#include "dtensor/checkpoint/api.h"

#include "dtensor/compat.h"

#include <c10/util/Type.h>

#include <sstream>
#include <typeinfo>

namespace dtensor {
namespace checkpoint {

void to_json(nlohmann::json& j, const WrappedException& e) { j = {{"type", e.type}, {"message", e.message}}; }
void from_json(const nlohmann::json& j, WrappedException& e) {
  j.at("type").get_to(e.type);
  j.at("message").get_to(e.message);
}

WrappedException wrap_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return {c10::demangle(typeid(err).name()), err.what_without_backtrace()};
  } catch (const std::exception& err) {
    return {c10::demangle(typeid(err).name()), err.what()};
  } catch (...) {
    return {"unknown", "an exception that is not a std::exception"};
  }
}

namespace {
std::string format(const std::string& step, const std::map<int, WrappedException>& failures) {
  std::ostringstream os;
  os << "CheckpointException ranks:[";
  bool first = true;
  for (const auto& kv : failures) {
    os << (first ? "" : ", ") << kv.first;
    first = false;
  }
  os << "] step: '" << step << "'";
  for (const auto& [rank, err] : failures) os << "\n(RANK " << rank << ") " << err.type << ": " << err.message;
  return os.str();
}
}  // namespace

CheckpointException::CheckpointException(std::string step, std::map<int, WrappedException> failures)
    : c10::Error(compat::error_without_backtrace(format(step, failures))), step_(std::move(step)), failures_(std::move(failures)) {}

}  // namespace checkpoint
}  // namespace dtensor
