// tiled-launch: runs a compiled kernel from a folder as `tiled compile --out DIR` or
// `tiled-compile --out DIR` writes it (NAME.manifest.json + NAME.so | NAME.cubin) on random
// inputs, through tiled_loader alone (no gRPC), and checks its outputs against a reference
// computed here in C++. A cubin runs on a CUDA device (libcuda.so.1 at run time).
//
//   tiled-launch DIR [--kernel NAME] [--dim N=100003]... [--scalar alpha=0.5]... [--seed S]
//                [--device D] [--threads T] [--repeat R]
//
// References exist for the kernels named in `references()` below (their manifest name and
// params must match); any other kernel is refused. Prints one JSON line; exit 0 when every
// checked element is within tolerance, 1 when not (or on a launch error), 2 on a usage error.
#include <dirent.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tiled/half.h"
#include "tiled/loader.h"

namespace {

using nlohmann::json;

const char* const kUsage =
    "usage: tiled-launch DIR|NAME.manifest.json [--kernel NAME] [--dim NAME=VALUE]...\n"
    "                    [--scalar NAME=VALUE]... [--seed S] [--device D] [--threads T]\n"
    "                    [--repeat R]\n";

// One tensor in host memory, in its dtype's bytes.
struct HostTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
  int size = 0;  // bytes per element

  int64_t numel() const { return size ? int64_t(bytes.size()) / size : 0; }
  double get(int64_t i) const {
    const unsigned char* p = bytes.data() + i * size;
    auto as = [p](auto v) { std::memcpy(&v, p, sizeof v); return v; };
    if (dtype == "float32") return as(float());
    if (dtype == "float64") return as(double());
    if (dtype == "float16") return tiled::float16_value(as(uint16_t()));
    if (dtype == "bfloat16") return tiled::bfloat16_value(as(uint16_t()));
    if (dtype == "int8") return as(int8_t());
    if (dtype == "int16") return as(int16_t());
    if (dtype == "int32") return as(int32_t());
    if (dtype == "int64") return double(as(int64_t()));
    if (dtype == "uint8" || dtype == "bool") return as(uint8_t());
    if (dtype == "uint16") return as(uint16_t());
    if (dtype == "uint32") return as(uint32_t());
    if (dtype == "uint64") return double(as(uint64_t()));
    throw std::runtime_error("tiled-launch has no host conversion for " + dtype);
  }
  void set(int64_t i, double x) {
    unsigned char* p = bytes.data() + i * size;
    auto put = [p](auto v) { std::memcpy(p, &v, sizeof v); };
    if (dtype == "float32") put(float(x));
    else if (dtype == "float64") put(x);
    else if (dtype == "float16") put(tiled::float16_bits(x));
    else if (dtype == "bfloat16") put(tiled::bfloat16_bits(x));
    else if (dtype == "int8") put(int8_t(x));
    else if (dtype == "int16") put(int16_t(x));
    else if (dtype == "int32") put(int32_t(x));
    else if (dtype == "int64") put(int64_t(x));
    else if (dtype == "uint8" || dtype == "bool") put(uint8_t(x));
    else if (dtype == "uint16") put(uint16_t(x));
    else if (dtype == "uint32") put(uint32_t(x));
    else if (dtype == "uint64") put(uint64_t(x));
    else throw std::runtime_error("tiled-launch has no host conversion for " + dtype);
  }
};

using Tensors = std::map<std::string, HostTensor>;
using Scalars = std::map<std::string, double>;

// The comparison of one output: elements checked, worst errors, verdict.
struct Check {
  int64_t checked = 0, bad = 0;
  double max_abs = 0, max_rel = 0;
  void add(double got, double want, double atol, double rtol) {
    ++checked;
    double err = std::fabs(got - want);
    if (!(err <= atol + rtol * std::fabs(want))) ++bad;  // NaN counts as bad
    if (std::isnan(err) || std::isnan(max_abs)) {  // NaN stays (JSON: null)
      max_abs = max_rel = NAN;
      return;
    }
    max_abs = std::max(max_abs, err);
    if (want != 0) max_rel = std::max(max_rel, err / std::fabs(want));
  }
};

double rtol_for(const std::string& dtype) {
  return dtype == "float16" ? 2e-3 : dtype == "bfloat16" ? 1.6e-2 : dtype == "float64" ? 1e-12 : 2e-6;
}

struct Reference {
  std::vector<std::pair<std::string, int>> params;  // name and rank, in order
  std::vector<std::string> outputs;
  tiled::Dims dims;      // defaults (a ragged tail where the kernel tiles)
  Scalars scalars;       // defaults
  std::function<Check(const Tensors&, const Scalars&)> check;
};

const std::map<std::string, Reference>& references() {
  static const std::map<std::string, Reference> table = {
      // examples/elementwise.py add(): C = A + B
      {"vadd",
       {{{"A", 1}, {"B", 1}, {"C", 1}}, {"C"}, {{"N", 100003}}, {},
        [](const Tensors& t, const Scalars&) {
          const auto &a = t.at("A"), &b = t.at("B"), &c = t.at("C");
          Check k;
          for (int64_t i = 0; i < c.numel(); ++i)
            k.add(c.get(i), a.get(i) + b.get(i), 0, rtol_for(c.dtype));
          return k;
        }}},
      // clients/cpp/testdata/make_programs.py rows_axpb(): Y = X * alpha + B + k
      {"rows_axpb",
       {{{"X", 2}, {"B", 1}, {"alpha", 0}, {"k", 0}, {"Y", 2}}, {"Y"}, {{"M", 37}},
        {{"alpha", 0.5}, {"k", -3}},
        [](const Tensors& t, const Scalars& s) {
          const auto &x = t.at("X"), &b = t.at("B"), &y = t.at("Y");
          int64_t n = b.numel();
          Check k;
          for (int64_t i = 0; i < y.numel(); ++i)
            k.add(y.get(i), x.get(i) * s.at("alpha") + b.get(i % n) + s.at("k"), 1e-6,
                  rtol_for(y.dtype));
          return k;
        }}},
      // examples/gemm.py matmul(): C = A @ B, accumulated in float32 or wider; checked on
      // up to 4096 sampled elements (every one when fewer), each against a float64 dot product.
      {"gemm",
       {{{"A", 2}, {"B", 2}, {"C", 2}}, {"C"}, {{"M", 1000}}, {},
        [](const Tensors& t, const Scalars&) {
          const auto &a = t.at("A"), &b = t.at("B"), &c = t.at("C");
          int64_t m = a.shape[0], kk = a.shape[1], n = b.shape[1];
          std::mt19937_64 rng(7);
          int64_t total = m * n, samples = std::min<int64_t>(total, 4096);
          Check k;
          for (int64_t s = 0; s < samples; ++s) {
            int64_t idx = samples == total ? s : int64_t(rng() % uint64_t(total));
            int64_t i = idx / n, j = idx % n;
            double want = 0, scale = 0;
            for (int64_t p = 0; p < kk; ++p) {
              double term = a.get(i * kk + p) * b.get(p * n + j);
              want += term;
              scale += std::fabs(term);
            }
            // the output dtype's rounding plus float32 accumulation over K terms
            k.add(c.get(idx), want, 1e-5 * scale, 2 * rtol_for(c.dtype));
          }
          return k;
        }}},
  };
  return table;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The manifest file to run: PATH itself, or the one NAME.manifest.json in the folder PATH.
std::string find_manifest(const std::string& path, const std::string& kernel) {
  if (ends_with(path, ".manifest.json")) return path;
  if (!kernel.empty()) return path + "/" + kernel + ".manifest.json";
  DIR* dir = opendir(path.c_str());
  if (!dir) throw std::runtime_error("cannot open the folder " + path);
  std::vector<std::string> found;
  while (dirent* e = readdir(dir))
    if (ends_with(e->d_name, ".manifest.json")) found.push_back(e->d_name);
  closedir(dir);
  if (found.size() != 1)
    throw std::runtime_error(path + " holds " + std::to_string(found.size()) +
                             " manifests (NAME.manifest.json): pass --kernel NAME");
  return path + "/" + found[0];
}

struct Options {
  std::string path, kernel;
  tiled::Dims dims;
  Scalars scalars;
  uint64_t seed = 0;
  int device = 0, threads = 0, repeat = 1;
};

std::pair<std::string, double> assignment(const std::string& flag, const std::string& text) {
  size_t eq = text.find('=');
  char* end = nullptr;
  double v = eq == std::string::npos ? 0 : std::strtod(text.c_str() + eq + 1, &end);
  if (eq == std::string::npos || eq == 0 || !end || *end != '\0' || end == text.c_str() + eq + 1)
    throw std::invalid_argument(flag + ": expected NAME=NUMBER, got '" + text + "'");
  return {text.substr(0, eq), v};
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--kernel") o.kernel = value();
    else if (arg == "--dim") {
      auto [name, v] = assignment(arg, value());
      if (v != std::floor(v)) throw std::invalid_argument("--dim " + name + ": not an integer");
      o.dims[name] = int64_t(v);
    } else if (arg == "--scalar") o.scalars.insert(assignment(arg, value()));
    else if (arg == "--seed") o.seed = std::stoull(value());
    else if (arg == "--device") o.device = std::stoi(value());
    else if (arg == "--threads") o.threads = std::stoi(value());
    else if (arg == "--repeat") o.repeat = std::max(1, std::stoi(value()));
    else if (arg.size() > 1 && arg[0] == '-') throw std::invalid_argument("unknown option " + arg);
    else if (o.path.empty()) o.path = arg;
    else throw std::invalid_argument("more than one folder given");
  }
  if (o.path.empty()) throw std::invalid_argument("no folder given");
  return o;
}

json run(const Options& o) {
  std::string manifest_path = find_manifest(o.path, o.kernel);
  tiled::Manifest m = tiled::Manifest::parse(read_file(manifest_path));
  std::string folder = manifest_path.substr(0, manifest_path.rfind('/') + 1);
  std::string artifact_path = folder + m.name + "." + m.artifact_format;
  auto kernel = tiled::load(read_file(artifact_path), m);

  auto found = references().find(m.name);
  if (found == references().end())
    throw std::runtime_error(m.name + ": tiled-launch has no reference for this kernel (it has: "
                             "vadd, rows_axpb, gemm)");
  const Reference& ref = found->second;
  bool same = ref.params.size() == m.params.size();
  for (size_t i = 0; same && i < m.params.size(); ++i)
    same = m.params[i].name == ref.params[i].first &&
           int(m.params[i].shape.size()) == ref.params[i].second;
  if (!same)
    throw std::runtime_error(m.name + ": its params are not the ones the reference '" + m.name +
                             "' computes");

  tiled::Dims dims;
  for (const auto& d : m.dims) {
    auto given = o.dims.find(d);
    auto fallback = ref.dims.find(d);
    if (given != o.dims.end()) dims[d] = given->second;
    else if (fallback != ref.dims.end()) dims[d] = fallback->second;
    else throw std::runtime_error(m.name + ": pass --dim " + d + "=VALUE");
  }
  Scalars scalars = ref.scalars;
  for (const auto& kv : o.scalars) scalars[kv.first] = kv.second;

  // Inputs: uniform in [-1, 1) (ints: -8..7, bools: 0 / 1); outputs: NaN (ints: 0x5a bytes),
  // so an element the kernel does not write fails the check.
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> uniform(-1, 1);
  Tensors host;
  for (const auto& p : m.params) {
    if (!p.is_tensor()) continue;
    HostTensor t;
    t.dtype = p.dtype;
    t.size = tiled::dtype_named(p.dtype, p.name).bytes();
    int64_t numel = 1;
    for (const auto& e : p.shape) {
      t.shape.push_back(e.symbolic ? dims.at(e.name) : e.value);
      numel *= t.shape.back();
    }
    t.bytes.assign(size_t(numel * t.size), 0x5a);
    bool output = std::find(ref.outputs.begin(), ref.outputs.end(), p.name) != ref.outputs.end();
    char family = tiled::dtype_named(p.dtype, p.name).family;
    for (int64_t i = 0; i < numel; ++i) {
      if (output) {
        if (family == 'f') t.set(i, NAN);
      } else if (family == 'f') {
        t.set(i, uniform(rng));
      } else if (family == 'b') {
        t.set(i, double(rng() & 1));
      } else {
        t.set(i, double(int64_t(rng() % 16) - (family == 'i' ? 8 : 0)));
      }
    }
    host[p.name] = std::move(t);
  }

  std::unique_ptr<tiled::CudaDevice> device;
  std::map<std::string, void*> on_device;
  std::vector<tiled::Arg> args;
  if (m.backend == "cuda") {
    device = std::make_unique<tiled::CudaDevice>(o.device);
    for (auto& [name, t] : host) {
      on_device[name] = device->alloc(t.bytes.size());
      device->upload(on_device[name], t.bytes.data(), t.bytes.size());
    }
  } else if (o.threads) {
    tiled::set_cpu_threads(*kernel, o.threads);
  }
  for (const auto& p : m.params) {
    if (p.is_tensor()) {
      HostTensor& t = host[p.name];
      void* data = device ? on_device[p.name] : static_cast<void*>(t.bytes.data());
      args.emplace_back(tiled::Tensor{data, t.shape, t.dtype});
    } else if (!scalars.count(p.name)) {
      throw std::runtime_error(m.name + ": pass --scalar " + p.name + "=VALUE");
    } else if (tiled::dtype_named(p.dtype, p.name).family == 'f') {
      args.emplace_back(scalars[p.name]);
    } else if (tiled::dtype_named(p.dtype, p.name).family == 'b') {
      args.emplace_back(scalars[p.name] != 0);
    } else {
      args.emplace_back(static_cast<long long>(scalars[p.name]));
    }
  }
  tiled::LaunchOptions launch;
  launch.device = device ? o.device : -1;
  for (int r = 0; r < o.repeat; ++r) kernel->launch(args, launch);
  if (device) {
    device->synchronize();
    for (auto& [name, t] : host) device->download(t.bytes.data(), on_device[name], t.bytes.size());
    for (auto& kv : on_device) device->free(kv.second);
  }
  Check c = ref.check(host, scalars);

  tiled::Dims geo_dims = dims;
  if (device) geo_dims[tiled::kSmCountDim] = device->multiprocessors();
  auto geo = kernel->geometry(geo_dims);
  json out = {{"kernel", m.name}, {"backend", m.backend}, {"target", m.target},
              {"dims", dims}, {"grid", geo[0]}, {"block", geo[1]},
              {"dynamic_smem_bytes", m.dynamic_smem_bytes}, {"checked", c.checked},
              {"bad", c.bad}, {"max_abs_err", c.max_abs}, {"max_rel_err", c.max_rel},
              {"ok", c.bad == 0}};
  if (device) {
    auto [major, minor] = device->compute_capability();
    out["device"] = device->name();
    out["compute_capability"] = std::to_string(major) + "." + std::to_string(minor);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "tiled-launch: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    json out = run(o);
    std::cout << out.dump() << std::endl;
    return out["ok"].get<bool>() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "tiled-launch: " << o.path << ": " << e.what() << "\n";
    return 1;
  }
}
