// dtensor/checkpoint/metadata.cpp
#include "dtensor/checkpoint/metadata.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/hash.h>

#include <sstream>

namespace dtensor {
namespace checkpoint {

std::size_t MetadataIndex::hash() const {
  std::size_t h = std::hash<std::string>()(fqn);
  if (offset) {
    h = c10::hash_combine(h, 1);
    for (int64_t o : *offset) h = c10::hash_combine(h, std::hash<int64_t>()(o));
  }
  return h;
}

std::string MetadataIndex::to_string() const {
  std::ostringstream os;
  os << "MetadataIndex(fqn='" << fqn << "', offset=";
  if (offset)
    os << c10::IntArrayRef(*offset);
  else
    os << "None";
  os << ", index=";
  if (index)
    os << *index;
  else
    os << "None";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const MetadataIndex& index) { return os << index.to_string(); }

}  // namespace checkpoint
}  // namespace dtensor
