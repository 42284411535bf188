// dtensor/debug/comm_mode_internal.h: what the DTensor layer tells CommDebugMode about why a
// collective happens (NOTE: [CommDebugMode] in comm_mode.h). Everything here costs one
// thread-local load when no mode is active on the thread.
#pragma once

#include "dtensor/nn/hooks.h"
#include "dtensor/placement/placement.h"

#include <string>
#include <vector>

namespace dtensor {
class DeviceMesh;

namespace debug {
namespace detail {

// True while a CommDebugMode is active on this thread.
bool recording();

// While alive, collectives on this thread are recorded as caused by `op` redistributing its
// argument `input_index` (-1: the tensor itself) from `from` to `to` on `mesh`. The arguments
// must outlive the scope. Scopes nest; the innermost names the cause.
class CollectiveCause {
 public:
  CollectiveCause(const std::string& op, int input_index, const std::vector<Placement>& from,
                  const std::vector<Placement>& to, const DeviceMesh& mesh);
  ~CollectiveCause();
  CollectiveCause(const CollectiveCause&) = delete;
  CollectiveCause& operator=(const CollectiveCause&) = delete;

  const std::string* op;
  int input_index;
  const std::vector<Placement>* from;
  const std::vector<Placement>* to;
  const DeviceMesh* mesh;
  const CollectiveCause* previous = nullptr;

 private:
  bool set_ = false;
};

// Called by the DTensor dispatcher before it redistributes an op's input on its own: under a
// strict mode, throws naming the op, the input and both placements.
void check_implicit_redistribution(const std::string& op, int input_index, const std::vector<Placement>& from,
                                   const std::vector<Placement>& to, const DeviceMesh& mesh);

// The module stack a gradient step should run in, taken when its forward ran (empty when no
// mode is active).
std::vector<nn::detail::ModuleFrame> module_stack_to_save();

}  // namespace detail
}  // namespace debug
}  // namespace dtensor
