// dtensor/checkpoint/staging.cpp: async_save's staging, the CPU copies a background save writes
// from: StagingBuffers reused across saves, and the process's staging cache (see save_load.h).
#include "dtensor/checkpoint/save_internal.h"
#include "dtensor/checkpoint/save_load.h"
#include "dtensor/utils/no_destructor_internal.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

namespace dtensor {
namespace checkpoint {

using detail::LocalItem;

namespace {

// `src` into `dst` (contiguous, CPU, same dtype and shape).
void copy_into(at::Tensor& dst, const at::Tensor& src) {
  if (src.device().is_cpu() && src.is_contiguous() && src.scalar_type() == dst.scalar_type()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
  } else {
    dst.copy_(src);
  }
}

// The process's staging cache (SaveOptions::cache_staging). Never destroyed: background saves
// may still hold sets when the process exits.
struct StagingCache {
  std::mutex mu;
  std::vector<std::shared_ptr<StagingBuffers>> sets;
};
StagingCache& staging_cache() {
  static dtensor::utils::NoDestructor<StagingCache> cache;
  return cache.get();
}

}  // namespace

// Every staged chunk's key, box and dtype: two state dicts with the same layout stage into the
// same buffers.
std::string detail::layout_of(const std::vector<LocalItem>& items) {
  std::ostringstream os;
  for (const auto& li : items) {
    if (li.data.defined()) os << li.item.fqn << '\0' << li.item.chunk.to_string() << li.item.dtype << '\n';
  }
  return os.str();
}

// Copies of every tensor's data on the CPU (async_save's staging), in `reuse`'s buffers when
// it has ones of the same key, chunk, dtype and shape; `reuse` (held by the caller) then holds
// this save's buffers, and only those.
std::vector<detail::LocalItem> detail::stage(std::vector<LocalItem> items, StagingBuffers::Impl* reuse) {
  std::map<std::pair<std::string, ChunkMeta>, at::Tensor> kept;
  c10::AutoGradMode no_grad(false);
  for (auto& li : items) {
    if (!li.data.defined()) continue;
    const at::Tensor src = li.data.detach();
    at::Tensor buf;
    if (reuse) {
      auto it = reuse->buffers.find({li.item.fqn, li.item.chunk});
      if (it != reuse->buffers.end() && it->second.scalar_type() == src.scalar_type() &&
          it->second.sizes() == src.sizes()) {
        buf = it->second;
      }
    }
    if (!buf.defined()) buf = at::empty(src.sizes(), src.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous));
    copy_into(buf, src);
    li.data = buf;
    if (reuse) kept[{li.item.fqn, li.item.chunk}] = buf;
  }
  if (reuse) {
    std::lock_guard<std::mutex> lk(reuse->mu);
    reuse->buffers = std::move(kept);
    reuse->layout = layout_of(items);
  }
  return items;
}

// A set of the cache, acquired (busy): a free one that staged `layout` last, else any free one,
// else a new one.
std::shared_ptr<StagingBuffers> detail::take_cached_staging(const std::string& layout) {
  StagingCache& c = staging_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  std::shared_ptr<StagingBuffers> any_free;
  for (const auto& s : c.sets) {
    StagingBuffers::Impl& im = s->impl();
    std::lock_guard<std::mutex> slk(im.mu);
    if (im.busy) continue;
    if (im.layout == layout) {
      im.busy = true;
      return s;
    }
    if (!any_free) any_free = s;
  }
  if (!any_free) {
    any_free = std::make_shared<StagingBuffers>();
    c.sets.push_back(any_free);
  }
  std::lock_guard<std::mutex> slk(any_free->impl().mu);
  any_free->impl().busy = true;
  return any_free;
}

StagingBuffers::StagingBuffers() : impl_(std::make_unique<Impl>()) {}
StagingBuffers::~StagingBuffers() = default;

int64_t StagingBuffers::nbytes() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  int64_t n = 0;
  for (const auto& [k, t] : impl_->buffers) n += int64_t(t.nbytes());
  return n;
}

int64_t staging_cache_bytes() {
  StagingCache& c = staging_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  int64_t n = 0;
  for (const auto& s : c.sets) n += s->nbytes();
  return n;
}

void release_staging_cache() {
  StagingCache& c = staging_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  // Sets in use stay alive (their save holds them) until their write ends.
  c.sets.clear();
}

}  // namespace checkpoint
}  // namespace dtensor
