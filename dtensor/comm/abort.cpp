// dtensor/comm/abort.cpp: the process's abort switch (NOTE: [Aborting waits] in abort.h).
#include "dtensor/comm/abort.h"

#include <atomic>
#include <mutex>

namespace dtensor {
namespace comm {

namespace {

// NOTE: [Aborting waits] (abort.h): one switch per process, read by every abortable wait.
class AbortSwitch {
 public:
  static AbortSwitch& instance() {
    static AbortSwitch the_switch;
    return the_switch;
  }
  void set_abortable(bool on) { abortable_ = on; }
  bool abortable() const { return abortable_.load(); }
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_.load()) reason_ = reason;
    aborted_ = true;
  }
  void clear() {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = false;
    reason_.clear();
  }
  std::optional<std::string> aborted() const {
    if (!aborted_.load()) return std::nullopt;
    std::lock_guard<std::mutex> lk(mu_);
    if (!aborted_.load()) return std::nullopt;
    return reason_;
  }

 private:
  std::atomic<bool> abortable_{false};
  std::atomic<bool> aborted_{false};
  mutable std::mutex mu_;
  std::string reason_;  // mu_
};

}  // namespace

void set_waits_abortable(bool on) { AbortSwitch::instance().set_abortable(on); }
bool waits_abortable() { return AbortSwitch::instance().abortable(); }
void abort_waits(const std::string& reason) { AbortSwitch::instance().abort(reason); }
void clear_aborted_waits() { AbortSwitch::instance().clear(); }
std::optional<std::string> waits_aborted() { return AbortSwitch::instance().aborted(); }

}  // namespace comm
}  // namespace dtensor
