// dtensor/checkpoint/save_internal.h: the machinery of save that is not part of the API: what
// a rank holds to save and where it went, the file helpers, async_save's staging
// (staging.cpp), the directory lock that keeps two jobs from saving into one directory at once,
// and the fault points at which tests stop a save (NOTE: [Crash consistency of save] in
// save_load.cpp). Internal: tests and the checkpoint sources only.
#pragma once

#include "dtensor/checkpoint/planner.h"
#include "dtensor/checkpoint/save_load.h"
#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace dtensor {
namespace checkpoint {

// The state of a StagingBuffers (async_save's staging, staging.cpp): whether a save holds it,
// its buffers by key and chunk, and the layout it staged last.
struct StagingBuffers::Impl {
  std::mutex mu;
  std::condition_variable cv;
  bool busy = false;  // an async_save stages into or writes from the buffers
  // Written only by the holder (busy); under `mu` so that nbytes() may read it meanwhile.
  std::map<std::pair<std::string, ChunkMeta>, at::Tensor> buffers;
  // The layout last staged (layout_of), read by the staging cache only while not busy.
  std::string layout;

  void acquire() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return !busy; });
    busy = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu);
      busy = false;
    }
    cv.notify_all();
  }
};

namespace detail {

// One chunk or object of this rank's state dict, with its data.
struct LocalItem {
  WriteItem item;
  at::Tensor data;    // tensors: this chunk's values (any device, any strides)
  c10::IValue object;  // objects
};

// The name of a checkpoint's metadata file in its directory (ours and PyTorch's DCP).
constexpr const char* kMetadataFile = ".metadata";

// Where save put one item: the item and its stored chunk (the "write" step's result).
struct WriteResult {
  WriteItem item;
  StoredChunk stored;
};
void to_json(nlohmann::json& j, const WriteResult& r);
void from_json(const nlohmann::json& j, WriteResult& r);

// Whether a save or load with these options runs over a group (else in one process), and
// which group.
bool resolve_use_dist(bool no_dist, const comm::GroupPtr& group);
comm::GroupPtr resolve_group(bool use_dist, const comm::GroupPtr& group);

// strerror(errno).
std::string errno_str();
// All `n` bytes at `p` to `fd` (retrying short writes); throws naming `path`.
void write_all(int fd, const char* p, int64_t n, const std::string& path);

// A file opened for writing, closed when it goes out of scope.
class NewFile {
 public:
  // Creates `path` with O_EXCL: a new file, never one already there (a committed checkpoint's
  // file, or a link leading out of the directory: O_EXCL does not follow it). `what` names it
  // in the error ("data file ").
  NewFile(const std::string& path, const std::string& what);
  ~NewFile();
  NewFile(const NewFile&) = delete;
  NewFile& operator=(const NewFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  void write(const char* p, int64_t n) { write_all(fd_, p, n, path_); }
  // fsync (with `sync`) and close, raising on failure.
  void close(bool sync);

 private:
  std::string path_;
  int fd_ = -1;
};
// fsync of a file or directory by its path; throws naming it.
void fsync_path(const std::string& path, bool directory);

// async_save's staging (staging.cpp).
// Every staged chunk's key, box and dtype: two state dicts with the same layout stage into the
// same buffers.
std::string layout_of(const std::vector<LocalItem>& items);
// Copies of every tensor's data on the CPU, in `reuse`'s buffers when it has ones of the same
// key, chunk, dtype and shape; `reuse` (held by the caller) then holds this save's buffers.
std::vector<LocalItem> stage(std::vector<LocalItem> items, StagingBuffers::Impl* reuse);
// A set of the process's staging cache, acquired (busy): a free one that staged `layout` last,
// else any free one, else a new one.
std::shared_ptr<StagingBuffers> take_cached_staging(const std::string& layout);

// The points of a save at which the fault hook is called, in the order a save reaches them.
enum class SaveFaultPoint {
  kBeforeData,      // every writing rank: the plan is agreed, its data file is not created yet
  kMidData,         // every writing rank: its data file holds its first block, not the rest
  kAfterData,       // every writing rank: its data file is complete and synced, not yet reported
  kBeforeRename,    // coordinator: `.metadata.tmp` is complete and synced, not renamed
  kAfterRename,     // coordinator: `.metadata` names the new save (committed), old files remain
};
const char* to_string(SaveFaultPoint point);

// Called at each fault point with the point and the saving rank (the rank in the save's
// group). A test hook kills the process there (raise(SIGKILL)) or throws, as a failing disk
// would. Empty (the default): nothing is called. Process-wide; set it before the save starts
// and clear it after (not while a save runs).
using SaveFaultHook = std::function<void(SaveFaultPoint point, int rank)>;
void set_save_fault_hook(SaveFaultHook hook);
// Calls the hook, if one is set.
void save_fault_point(SaveFaultPoint point, int rank);

// Whether the identity a lock file holds ("pid 1234 on host node7 ...") names a process of
// this host that no longer exists (a lock left by a job that died, on a file system without
// flock). A holder on another host, or one that cannot be parsed, is not known to be gone.
bool lock_holder_is_gone(const std::string& holder);

// The exclusive right to save into a checkpoint directory, held by the coordinator of one save
// from its plan step until its commit is done or failed (NOTE: [Crash consistency of save]).
// An flock(2) on `<dir>/.lock`, which holds the holder's identity (pid, host, start time) so
// that a refused save can name the job that holds it. The kernel drops the lock of a process
// that dies, so a lock file left by a killed job never blocks: the next save takes it over.
// On a file system without flock the file's content is the lock: it is taken over when empty
// or when lock_holder_is_gone. The destructor removes the file and releases the lock.
class DirectoryLock {
 public:
  // Takes the lock of `dir` (which exists) without waiting; throws, naming the job that holds
  // it, when another save (of this or another process) holds it. `who`: how the holder
  // describes itself besides pid, host and time ("coordinator rank 0 of 4").
  DirectoryLock(const std::string& dir, const std::string& who);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  static constexpr const char* kFileName = ".lock";

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace detail
}  // namespace checkpoint
}  // namespace dtensor
