#include "tf_ops/core/table_config.h"

#include <sstream>

namespace rec_sdk {
namespace {

template <typename T>
std::string Show(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::string Show(bool value) { return value ? "true" : "false"; }

std::string Show(const std::vector<float>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

std::string Show(const std::vector<std::string>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", '" : "'") + values[i] + "'";
  return out + "]";
}

std::string Show(RowDtype dtype) { return RowDtypeName(dtype); }

std::string Show(InitializerKind kind) {
  switch (kind) {
    case InitializerKind::kConstant:
      return "constant";
    case InitializerKind::kRandomUniform:
      return "random_uniform";
    case InitializerKind::kRandomNormal:
      return "random_normal";
    case InitializerKind::kTruncatedNormal:
      return "truncated_normal";
  }
  return "unknown";
}

template <typename T>
void Compare(const char* field, const T& existing, const T& wanted, std::vector<std::string>* out) {
  if (!(existing == wanted)) {
    out->push_back(std::string(field) + ": " + Show(existing) + " vs " + Show(wanted));
  }
}

}  // namespace

Status IndexLayoutFromName(const std::string& name, TableConfig::IndexLayout* layout) {
  for (auto l : kIndexLayouts) {
    if (name == IndexLayoutName(l)) {
      *layout = l;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("index_layout must be \"auto\", \"full\" or \"compact\", got \"" +
                                 name + "\"");
}

Status CheckIndexLayout(const TableConfig& config) {
  if (config.tiered() && config.index_layout == TableConfig::IndexLayout::kCompact) {
    return Status::InvalidArgument(
        "\"compact\" needs a table without an SSD tier: a compact index reads keys back from "
        "rows in memory, and a tiered table's cold keys have none; use \"auto\" or \"full\"");
  }
  return Status::Ok();
}

const char* IndexLayoutName(TableConfig::IndexLayout layout) {
  switch (layout) {
    case TableConfig::IndexLayout::kAuto:
      return "auto";
    case TableConfig::IndexLayout::kFull:
      return "full";
    case TableConfig::IndexLayout::kCompact:
      return "compact";
  }
  return "unknown";
}

std::vector<std::string> ConfigDifferences(const TableConfig& a, const TableConfig& b) {
  std::vector<std::string> out;
  Compare("name", a.name, b.name, &out);
  Compare("dim", a.dim, b.dim, &out);
  Compare("emb_dtype", a.emb_dtype, b.emb_dtype, &out);
  Compare("slot_dtype", a.slot_dtype, b.slot_dtype, &out);
  Compare("dynamic_expansion", a.dynamic_expansion, b.dynamic_expansion, &out);
  if (!a.dynamic_expansion && !b.dynamic_expansion) {
    Compare("capacity", a.capacity, b.capacity, &out);
  }
  const InitializerSpec& x = a.initializer;
  const InitializerSpec& y = b.initializer;
  Compare("initializer", x.kind, y.kind, &out);
  Compare("initializer value", x.value, y.value, &out);
  Compare("initializer values", x.values, y.values, &out);
  Compare("initializer minval", x.minval, y.minval, &out);
  Compare("initializer maxval", x.maxval, y.maxval, &out);
  Compare("initializer mean", x.mean, y.mean, &out);
  Compare("initializer stddev", x.stddev, y.stddev, &out);
  Compare("initializer seed", x.seed, y.seed, &out);
  Compare("init_param (initializer scale)", x.scale, y.scale, &out);
  Compare("evict_when_full", a.evict_when_full, b.evict_when_full, &out);
  Compare("track_changes", a.track_changes, b.track_changes, &out);
  Compare("track_access", a.track_access, b.track_access, &out);
  Compare("ssd_paths", a.ssd_paths, b.ssd_paths, &out);
  Compare("ssd_rows", a.ssd_rows, b.ssd_rows, &out);
  Compare("ssd_direct_io", a.ssd_direct_io, b.ssd_direct_io, &out);
  // The layout the table has ("auto" resolved): a handle asking "auto" of a compact table is
  // the same table.
  Compare("compact index (index_layout)", a.compact_index(), b.compact_index(), &out);
  return out;
}

std::vector<std::string> AdmissionDifferences(const AdmissionConfig& a, const AdmissionConfig& b) {
  std::vector<std::string> out;
  Compare("access_threshold", a.access_threshold, b.access_threshold, &out);
  Compare("eviction_threshold", a.eviction_threshold, b.eviction_threshold, &out);
  return out;
}

}  // namespace rec_sdk
