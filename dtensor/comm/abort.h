// dtensor/comm/abort.h: ending the waits of C10dGroup collectives from another thread.
//
// NOTE: [Aborting waits]
// Gloo cannot cancel a collective, and a rank whose peer stopped calling collectives (it
// failed, skipped, or hangs) would wait for the group's whole timeout (5 minutes by default).
// Once set_waits_abortable(true) was called, a C10dGroup collective waits in slices and, as
// soon as abort_waits(reason) has been called (by any thread), ends with
//   CollectiveError("<op> on <group> aborted: <reason>")
// and so does every collective that starts waiting until clear_aborted_waits(). The backend's
// operation stays pending: the group must not be used again (make a new one). A collective
// that completes is never slowed down (the slice ends at completion). Point-to-point send and
// recv wait whole (NOTE: [Point-to-point waits are whole] in c10d_group.cpp). The harness's external
// launcher mode uses this (harness/internal/external.cpp); nothing else does.
#pragma once

#include <optional>
#include <string>

namespace dtensor {
namespace comm {

void set_waits_abortable(bool on);
bool waits_abortable();
void abort_waits(const std::string& reason);
void clear_aborted_waits();
std::optional<std::string> waits_aborted();  // the reason, while aborted

}  // namespace comm
}  // namespace dtensor
