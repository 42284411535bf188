// dtensor/checkpoint/api.h
//
// CheckpointException: the error every rank raises when a step of a distributed checkpoint
// failed on one or more ranks (torch.distributed.checkpoint.api). It lists each failing rank
// with the type and message of its error, so that the error seen on rank 0 explains a failure
// that happened on rank 3.
//
//   try {
//     dist.all_gather("plan", [&] { return make_plan(); });   // see dist_wrapper.h
//   } catch (const dtensor::checkpoint::CheckpointException& e) {
//     for (const auto& [rank, err] : e.failures()) std::cerr << rank << ": " << err.message;
//   }
#pragma once

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <exception>
#include <map>
#include <string>

namespace dtensor {
namespace checkpoint {

// One rank's error, in a form that travels between ranks (PyTorch: WRAPPED_EXCEPTION, an
// exception and its traceback).
struct WrappedException {
  std::string type;     // demangled C++ type, e.g. "c10::Error", "std::out_of_range"
  std::string message;  // what() (for c10::Error without the C++ backtrace)
};
void to_json(nlohmann::json& j, const WrappedException& e);
void from_json(const nlohmann::json& j, WrappedException& e);

// The exception `e` as a WrappedException; call it inside a catch block. (PyTorch: _wrap_exception.)
WrappedException wrap_exception(const std::exception_ptr& e);

// Raised on every rank; what() is
//   CheckpointException ranks:[1, 3] step: 'plan'
//   (RANK 1) c10::Error: <message>
//   (RANK 3) std::runtime_error: <message>
class CheckpointException : public c10::Error {
 public:
  CheckpointException(std::string step, std::map<int, WrappedException> failures);

  const std::string& step() const { return step_; }
  // Failing rank -> its error.
  const std::map<int, WrappedException>& failures() const { return failures_; }

 private:
  std::string step_;
  std::map<int, WrappedException> failures_;
};

}  // namespace checkpoint
}  // namespace dtensor
