// Manifest parsing and validation, rule for rule as tiled/runtime/manifest.py.
#include "tiled/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>

#include "tiled/errors.h"

namespace tiled {
namespace {

using json = nlohmann::json;

const std::vector<DType>& dtype_table() {
  static const std::vector<DType> table = {
      {"bool", 8, 'b'},      {"int8", 8, 'i'},      {"int16", 16, 'i'},
      {"int32", 32, 'i'},    {"int64", 64, 'i'},    {"uint8", 8, 'u'},
      {"uint16", 16, 'u'},   {"uint32", 32, 'u'},   {"uint64", 64, 'u'},
      {"float16", 16, 'f'},  {"bfloat16", 16, 'f'}, {"float32", 32, 'f'},
      {"float64", 64, 'f'},  {"float8_e4m3", 8, 'f'}, {"float8_e5m2", 8, 'f'},
  };
  return table;
}

const char* const kOps[] = {"add", "sub", "mul", "floordiv", "floormod", "ceildiv", "min", "max"};

ManifestError fail(const std::string& where, const std::string& problem) {
  return ManifestError("manifest " + where + ": " + problem);
}

std::string show(const json& v) { return v.dump(); }

bool is_int(const json& v) { return v.is_number_integer(); }  // bools are not numbers here

bool is_ident(const std::string& s) {
  static const std::regex ident("[A-Za-z_][A-Za-z0-9_]*");
  return std::regex_match(s, ident);
}

bool is_hex64(const json& v) {
  static const std::regex hex("[0-9a-f]{64}");
  return v.is_string() && std::regex_match(v.get<std::string>(), hex);
}

std::string ident(const json& v, const std::string& where) {
  if (!v.is_string() || !is_ident(v.get<std::string>()))
    throw fail(where, "expected an identifier, got " + show(v));
  return v.get<std::string>();
}

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string dtype_of(const json& v, const std::string& where) {
  if (v.is_string()) {
    for (const DType& d : dtype_table())
      if (d.name == v.get<std::string>()) return d.name;
  }
  std::vector<std::string> known;
  for (const DType& d : dtype_table()) known.push_back(d.name);
  throw fail(where, "unknown dtype " + show(v) + "; known: " + join(known));
}

Expr parse_expr(const json& v, const std::string& where, int depth = 0) {
  Expr e;
  if (depth > 64) throw fail(where, "expression nested more than 64 deep");
  if (is_int(v)) {
    e.kind = Expr::Kind::Int;
    e.value = v.get<int64_t>();
    return e;
  }
  if (v.is_string()) {
    e.kind = Expr::Kind::Name;
    e.name = ident(v, where);
    return e;
  }
  if (v.is_array() && v.size() == 3) {
    bool known = v[0].is_string() &&
                 std::find(std::begin(kOps), std::end(kOps), v[0].get<std::string>()) !=
                     std::end(kOps);
    if (!known)
      throw fail(where, "unknown operator " + show(v[0]) +
                            "; known: add, sub, mul, floordiv, floormod, ceildiv, min, max");
    e.kind = Expr::Kind::Op;
    e.name = v[0].get<std::string>();
    e.args = {parse_expr(v[1], where, depth + 1), parse_expr(v[2], where, depth + 1)};
    return e;
  }
  throw fail(where, "expected an int, a dim name or [op, a, b], got " + show(v));
}

// Python's // and % (toward negative infinity).
int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

Param parse_param(const json& d, const std::string& where) {
  if (!d.is_object()) throw fail(where, "expected an object, got " + show(d));
  Param p;
  json kind = d.contains("kind") ? d["kind"] : json();
  std::set<std::string> allowed;
  if (kind == "tensor") allowed = {"name", "kind", "dtype", "shape", "align"};
  else if (kind == "scalar") allowed = {"name", "kind", "dtype"};
  else throw fail(where + ".kind", "expected 'tensor' or 'scalar', got " + show(kind));
  std::vector<std::string> extra;
  for (auto it = d.begin(); it != d.end(); ++it)
    if (!allowed.count(it.key())) extra.push_back("'" + it.key() + "'");
  if (!extra.empty())
    throw fail(where, "unexpected field(s) [" + join(extra) + "] for a " + kind.get<std::string>());
  for (const char* key : {"name", "dtype"})
    if (!d.contains(key)) throw fail(where, std::string("missing field '") + key + "'");
  p.kind = kind.get<std::string>();
  p.name = ident(d["name"], where + ".name");
  p.dtype = dtype_of(d["dtype"], where + ".dtype");
  if (p.kind == "scalar") return p;
  if (!d.contains("shape")) throw fail(where, "missing field 'shape'");
  const json& shape = d["shape"];
  if (!shape.is_array()) throw fail(where + ".shape", "expected a list, got " + show(shape));
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& s = shape[i];
    std::string at = where + ".shape[" + std::to_string(i) + "]";
    Extent x;
    if (is_int(s) && s.get<int64_t>() >= 0) {
      x.value = s.get<int64_t>();
    } else if (s.is_string()) {
      x.symbolic = true;
      x.name = ident(s, at);
    } else {
      throw fail(at, "expected an int >= 0 or a dim name, got " + show(s));
    }
    p.shape.push_back(x);
  }
  if (d.contains("align") && !d["align"].is_null()) {
    const json& a = d["align"];
    if (!is_int(a) || a.get<int64_t>() <= 0 || (a.get<int64_t>() & (a.get<int64_t>() - 1)))
      throw fail(where + ".align", "expected a power of two, got " + show(a));
    p.align = a.get<int64_t>();
  }
  return p;
}

KernelArg parse_kernel_arg(const json& d, const std::string& where) {
  if (!d.is_object()) throw fail(where, "expected an object, got " + show(d));
  KernelArg k;
  json kind = d.contains("kind") ? d["kind"] : json();
  auto has_exactly = [&](std::set<std::string> fields) {
    if (d.size() != fields.size()) return false;
    for (auto it = d.begin(); it != d.end(); ++it)
      if (!fields.count(it.key())) return false;
    return true;
  };
  if (kind == "dim") {
    if (!has_exactly({"kind", "name", "dtype"}))
      throw fail(where, "a dim entry has exactly the fields kind, name, dtype");
    const json& t = d["dtype"];
    if (!(t == "int32" || t == "int64" || t == "uint32" || t == "uint64"))
      throw fail(where + ".dtype", "expected int32 or int64, got " + show(t));
    k.kind = "dim";
    k.name = ident(d["name"], where + ".name");
    k.dtype = t.get<std::string>();
    return k;
  }
  if (kind == "tensor" || kind == "scalar") {
    if (!has_exactly({"kind", "param"}) || !is_int(d["param"]))
      throw fail(where, "a " + kind.get<std::string>() +
                            " entry has exactly the fields kind, param (an int)");
    k.kind = kind.get<std::string>();
    k.param = d["param"].get<int>();
    return k;
  }
  if (kind == "tensor_map") {
    if (!has_exactly({"kind", "param", "box", "swizzle"}))
      throw fail(where, "a tensor_map entry has exactly the fields kind, param, box, swizzle");
    if (!is_int(d["param"])) throw fail(where + ".param", "expected an int, got " + show(d["param"]));
    const json& box = d["box"];
    if (!box.is_array() || box.empty() || box.size() > 5)
      throw fail(where + ".box",
                 "expected [inner, ..., outer] (1 to 5 ints, one per dim), got " + show(box));
    for (size_t j = 0; j < box.size(); ++j) {
      if (!is_int(box[j]) || box[j].get<int64_t>() < 1 || box[j].get<int64_t>() > 256)
        throw fail(where + ".box[" + std::to_string(j) + "]",
                   "expected an int in 1..256 (TMA box limit), got " + show(box[j]));
      k.box.push_back(box[j].get<int64_t>());
    }
    const json& sw = d["swizzle"];
    if (!is_int(sw) || !(sw == 0 || sw == 32 || sw == 64 || sw == 128))
      throw fail(where + ".swizzle", "expected one of 0, 32, 64, 128 (bytes), got " + show(sw));
    k.kind = "tensor_map";
    k.param = d["param"].get<int>();
    k.swizzle = sw.get<int>();
    return k;
  }
  throw fail(where + ".kind",
             "expected one of 'tensor', 'scalar', 'dim', 'tensor_map', got " + show(kind));
}

void check_tensor_map(const KernelArg& ka, const Param& p, int k, const std::string& where) {
  std::string which = "params[" + std::to_string(k) + "] (" + p.name + ")";
  if (!p.is_tensor())
    throw fail(where + ".param", "a tensor_map needs a tensor, but " + which + " is a " + p.kind);
  if (p.shape.size() != ka.box.size())
    throw fail(where + ".box", which + " has " + std::to_string(p.shape.size()) +
                                   " dims but the box has " + std::to_string(ka.box.size()) +
                                   " entries; a tensor_map needs one per dim");
  int64_t size = dtype_named(p.dtype, where).bytes();
  int64_t inner = ka.box[0] * size;
  if (inner % 16)
    throw fail(where + ".box[0]", std::to_string(ka.box[0]) + " " + p.dtype + " elements are " +
                                      std::to_string(inner) +
                                      " bytes; TMA needs the box's inner extent to be a "
                                      "multiple of 16 bytes");
  if (ka.swizzle && inner > ka.swizzle)
    throw fail(where + ".box[0]", std::to_string(inner) + " bytes are more than the " +
                                      std::to_string(ka.swizzle) + "-byte swizzle span");
}

const std::vector<std::string> kRequired = {"manifest_version", "name", "program_digest",
                                            "target", "backend", "arch", "artifact_format",
                                            "artifact_sha256", "symbol", "params"};
// code_object (rocm) and metal (metal): the backend's own records, carried but not read here
// (this library loads cpu and cuda artifacts only).
const std::vector<std::string> kOptional = {"kernel_args", "grid", "block",
                                            "dynamic_smem_bytes", "cluster", "action",
                                            "requires", "fallback", "notes", "code_object",
                                            "metal", "pdl"};
const std::vector<std::string> kFallbackFields = {"symbol", "kernel_args", "grid", "block",
                                                  "dynamic_smem_bytes", "cluster"};

void check_action(const json& a, const std::string& program_digest) {
  const std::set<std::string> fields = {"v", "program", "target", "options", "toolchain",
                                        "namespace"};
  bool ok = a.is_object() && a.size() == fields.size();
  if (ok)
    for (auto it = a.begin(); it != a.end(); ++it) ok = ok && fields.count(it.key());
  if (!ok)
    throw fail("action", "expected an object with the fields namespace, options, program, "
                         "target, toolchain, v");
  if (a["program"] != program_digest) throw fail("action.program", "names another program than program_digest");
  for (const char* key : {"toolchain", "program"})
    if (!is_hex64(a[key]))
      throw fail(std::string("action.") + key, "expected 64 lowercase hex digits (sha256)");
  if (!a["options"].is_object() || !a["namespace"].is_string() || !a["target"].is_object())
    throw fail("action", "options and target must be objects, namespace a string");
}

Manifest from_json(const json& d) {
  if (!d.is_object())
    throw ManifestError("manifest: expected a JSON object, got " + std::string(d.type_name()));
  std::vector<std::string> missing, unknown;
  for (const auto& k : kRequired)
    if (!d.contains(k)) missing.push_back(k);
  if (!missing.empty()) throw ManifestError("manifest: missing field(s) " + join(missing));
  for (auto it = d.begin(); it != d.end(); ++it)
    if (std::find(kRequired.begin(), kRequired.end(), it.key()) == kRequired.end() &&
        std::find(kOptional.begin(), kOptional.end(), it.key()) == kOptional.end())
      unknown.push_back(it.key());
  if (!unknown.empty())
    throw ManifestError("manifest: unknown field(s) " + join(unknown) +
                        " (manifest version 1 has no such field)");
  auto get = [&](const std::string& key, json fallback) {
    return d.contains(key) && !d[key].is_null() ? d[key] : fallback;
  };
  Manifest m;
  const json& version = d["manifest_version"];
  if (!is_int(version)) throw fail("manifest_version", "expected an int, got " + show(version));
  if (version != 1)
    throw fail("manifest_version", "this runtime reads version 1, got " + show(version));
  for (const char* key : {"params", "kernel_args", "grid", "block", "cluster", "requires"}) {
    if (d.contains(key) && !d[key].is_array())
      throw fail(key, std::string("expected a list, got ") + d[key].type_name());
  }
  auto text = [&](const char* key) {
    const json& v = d[key];
    if (!v.is_string() || v.get<std::string>().empty())
      throw fail(key, "expected a non-empty string, got " + show(v));
    return v.get<std::string>();
  };
  m.name = text("name");
  m.target = text("target");
  m.backend = text("backend");
  m.arch = text("arch");
  m.artifact_format = text("artifact_format");
  m.symbol = text("symbol");
  for (const char* key : {"program_digest", "artifact_sha256"})
    if (!is_hex64(d[key]))
      throw fail(key, "expected 64 lowercase hex digits (sha256), got " + show(d[key]));
  m.program_digest = d["program_digest"].get<std::string>();
  m.artifact_sha256 = d["artifact_sha256"].get<std::string>();
  if (m.target.substr(0, m.target.find(':')) != m.backend)
    throw fail("target", "'" + m.target + "' does not belong to backend '" + m.backend + "'");
  const std::map<std::string, std::string> formats = {
      {"cpu", "so"}, {"cuda", "cubin"}, {"rocm", "hsaco"}, {"metal", "msl"}};
  auto want = formats.find(m.backend);
  if (want != formats.end() && m.artifact_format != want->second)
    throw fail("artifact_format", "backend '" + m.backend + "' produces '" + want->second +
                                      "', got '" + m.artifact_format + "'");

  const json params = d["params"];
  std::set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string where = "params[" + std::to_string(i) + "]";
    Param p = parse_param(params[i], where);
    if (!names.insert(p.name).second)
      throw fail(where + ".name", "duplicate parameter name '" + p.name + "'");
    for (const Extent& x : p.shape)
      if (x.symbolic && std::find(m.dims.begin(), m.dims.end(), x.name) == m.dims.end())
        m.dims.push_back(x.name);
    m.params.push_back(std::move(p));
  }
  const std::set<std::string> dims(m.dims.begin(), m.dims.end());
  const json kargs = get("kernel_args", json::array());
  for (size_t i = 0; i < kargs.size(); ++i) {
    std::string where = "kernel_args[" + std::to_string(i) + "]";
    KernelArg ka = parse_kernel_arg(kargs[i], where);
    if (ka.kind == "dim") {
      if (!dims.count(ka.name))
        throw fail(where, "dim '" + ka.name + "' is not a dim of any tensor parameter");
    } else if (ka.param < 0 || ka.param >= static_cast<int>(m.params.size())) {
      throw fail(where, "param index " + std::to_string(ka.param) + " out of range (0.." +
                            std::to_string(static_cast<int>(m.params.size()) - 1) + ")");
    } else if (ka.kind == "tensor_map") {
      check_tensor_map(ka, m.params[ka.param], ka.param, where);
    } else if (m.params[ka.param].kind != ka.kind) {
      const Param& p = m.params[ka.param];
      throw fail(where, "kind '" + ka.kind + "' but params[" + std::to_string(ka.param) + "] (" +
                            p.name + ") is a " + p.kind);
    }
    m.kernel_args.push_back(std::move(ka));
  }
  std::string dim_list = m.dims.empty() ? "none" : join(m.dims);
  for (const char* key : {"grid", "block"}) {
    const json exprs = get(key, json::array({1, 1, 1}));
    if (exprs.size() != 3)
      throw fail(key, "expected 3 entries, got " + std::to_string(exprs.size()));
    for (size_t j = 0; j < 3; ++j) {
      std::string where = std::string(key) + "[" + std::to_string(j) + "]";
      Expr e = parse_expr(exprs[j], where);
      std::set<std::string> used;
      e.names(&used);
      std::vector<std::string> unknown_names;
      for (const auto& n : used)
        if (!dims.count(n) && !(std::string(key) == "grid" && n == kSmCountDim))
          unknown_names.push_back("'" + n + "'");
      if (!unknown_names.empty())
        throw fail(where, "uses [" + join(unknown_names) +
                              "], which no tensor parameter binds (dims: " + dim_list + ")");
      (std::string(key) == "grid" ? m.grid : m.block)[j] = std::move(e);
    }
  }
  const json smem = get("dynamic_smem_bytes", 0);
  if (!is_int(smem) || smem.get<int64_t>() < 0)
    throw fail("dynamic_smem_bytes", "expected an int >= 0, got " + show(smem));
  m.dynamic_smem_bytes = smem.get<int64_t>();
  const json cluster = get("cluster", json::array({1, 1, 1}));
  bool cluster_ok = cluster.size() == 3;
  for (const json& c : cluster) cluster_ok = cluster_ok && is_int(c) && c.get<int64_t>() >= 1;
  if (!cluster_ok) throw fail("cluster", "expected 3 ints >= 1, got " + show(cluster));
  for (int j = 0; j < 3; ++j) m.cluster[j] = cluster[j].get<int64_t>();
  const json pdl = get("pdl", false);
  if (!pdl.is_boolean()) throw fail("pdl", "expected true or false, got " + show(pdl));
  m.pdl = pdl.get<bool>();
  if (d.contains("action") && !d["action"].is_null()) check_action(d["action"], m.program_digest);
  const json requires_ = get("requires", json::array());
  for (size_t j = 0; j < requires_.size(); ++j) {
    std::string where = "requires[" + std::to_string(j) + "]";
    Expr e = parse_expr(requires_[j], where);
    std::set<std::string> used;
    e.names(&used);
    for (const auto& n : used)
      if (!dims.count(n))
        throw fail(where, "uses ['" + n + "'], which no tensor parameter binds (dims: " +
                              dim_list + ")");
    m.requires_.push_back(std::move(e));
  }
  if (d.contains("notes") && !d["notes"].is_null() && !d["notes"].is_object())
    throw fail("notes", std::string("expected an object, got ") + d["notes"].type_name());
  if (d.contains("fallback") && !d["fallback"].is_null()) {
    const json& fb = d["fallback"];
    bool ok = fb.is_object() && fb.size() == kFallbackFields.size();
    for (const auto& f : kFallbackFields) ok = ok && fb.contains(f);
    if (!ok)
      throw fail("fallback", "expected an object with the fields " + join(kFallbackFields));
    json merged = d;
    for (const auto& f : kFallbackFields) merged[f] = fb[f];
    merged.erase("requires");
    merged.erase("fallback");
    try {
      m.fallback = std::make_shared<const Manifest>(from_json(merged));
    } catch (const ManifestError& e) {
      std::string msg = e.message();
      auto at = msg.find("manifest ");
      if (at == 0) msg.replace(0, 9, "manifest fallback.");
      throw ManifestError(msg);
    }
  }
  return m;
}

}  // namespace

const DType& dtype_named(const std::string& name, const std::string& where) {
  for (const DType& d : dtype_table())
    if (d.name == name) return d;
  (void)dtype_of(json(name), where);  // throws, listing the known names
  throw fail(where, "unknown dtype");
}

int64_t Param::alignment() const { return align ? align : dtype_named(dtype, name).bytes(); }

int64_t Expr::eval(const Dims& dims) const {
  switch (kind) {
    case Kind::Int:
      return value;
    case Kind::Name: {
      auto it = dims.find(name);
      if (it == dims.end()) {
        std::vector<std::string> bound;
        for (const auto& kv : dims) bound.push_back(kv.first);
        throw LaunchError("expression uses dim '" + name + "', which no argument binds (bound: " +
                          (bound.empty() ? "none" : join(bound)) + ")");
      }
      return it->second;
    }
    case Kind::Op:
      break;
  }
  int64_t a = args[0].eval(dims), b = args[1].eval(dims), r = 0;
  bool overflow = false;
  if (name == "add") overflow = __builtin_add_overflow(a, b, &r);
  else if (name == "sub") overflow = __builtin_sub_overflow(a, b, &r);
  else if (name == "mul") overflow = __builtin_mul_overflow(a, b, &r);
  if (overflow) throw LaunchError("integer overflow evaluating " + str());
  if (name == "add" || name == "sub" || name == "mul") return r;
  if (name == "min") return std::min(a, b);
  if (name == "max") return std::max(a, b);
  if (b == 0) throw LaunchError("division by zero evaluating " + str());
  if (a == INT64_MIN && b == -1) throw LaunchError("integer overflow evaluating " + str());
  if (name == "floordiv") return floordiv(a, b);
  if (name == "floormod") return a - floordiv(a, b) * b;
  if (a == INT64_MIN) throw LaunchError("integer overflow evaluating " + str());
  return -floordiv(-a, b);  // ceildiv
}

void Expr::names(std::set<std::string>* out) const {
  if (kind == Kind::Name) out->insert(name);
  for (const Expr& a : args) a.names(out);
}

std::string Expr::str() const {
  if (kind == Kind::Int) return std::to_string(value);
  if (kind == Kind::Name) return "\"" + name + "\"";
  return "[\"" + name + "\", " + args[0].str() + ", " + args[1].str() + "]";
}

Manifest Manifest::parse(const std::string& json_text) {
  json d;
  try {
    d = json::parse(json_text);
  } catch (const json::exception& e) {
    throw ManifestError(std::string("manifest: not valid JSON: ") + e.what());
  }
  return from_json(d);
}

}  // namespace tiled
