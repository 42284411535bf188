// dtensor/utils/no_destructor_internal.h: an object of static storage whose destructor never
// runs (as absl::NoDestructor), for process-wide state that must outlive exit: a background
// save may still use the staging cache when the process exits, and groups a failed test left
// with a collective pending would block in their destructors. The object is owned by its
// storage; nothing is allocated.
#pragma once

#include <new>
#include <utility>

namespace dtensor {
namespace utils {

template <typename T>
class NoDestructor {
 public:
  template <typename... Args>
  explicit NoDestructor(Args&&... args) {
    new (storage_) T(std::forward<Args>(args)...);
  }
  NoDestructor(const NoDestructor&) = delete;
  NoDestructor& operator=(const NoDestructor&) = delete;
  T& get() { return *std::launder(reinterpret_cast<T*>(storage_)); }
  T* operator->() { return &get(); }
  T& operator*() { return get(); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace utils
}  // namespace dtensor
