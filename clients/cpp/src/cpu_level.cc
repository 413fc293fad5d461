// CPU feature levels: the tables of tiled/runtime/cpu_levels.py, checked the same way.
#include "cpu_level.h"

#include <sys/utsname.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "tiled/errors.h"

namespace tiled {
namespace {

struct Level {
  const char* name;
  const char* isa;
  std::vector<const char*> requires_;
};

const std::vector<const char*> kV2 = {"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2",
                                      "ssse3"};

std::vector<const char*> plus(std::vector<const char*> base,
                              std::initializer_list<const char*> more) {
  base.insert(base.end(), more);
  return base;
}

// Per ISA, oldest first; each level needs what the one before it does.
const std::vector<Level>& levels() {
  static const std::vector<Level> all = [] {
    auto v3 = plus(kV2, {"abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"});
    auto v4 = plus(v3, {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"});
    std::vector<const char*> fp16 = {"fphp", "asimdhp"};
    return std::vector<Level>{{"generic", "x86_64", {}},      {"x86-64-v2", "x86_64", kV2},
                              {"x86-64-v3", "x86_64", v3},    {"x86-64-v4", "x86_64", v4},
                              {"x86-64-v4+bf16", "x86_64", plus(v4, {"avx512_bf16"})},
                              {"generic", "aarch64", {}},     {"aarch64+fp16", "aarch64", fp16},
                              {"aarch64+sve", "aarch64", plus(fp16, {"sve"})}};
  }();
  return all;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string isa_of_machine(const std::string& machine) {
  std::string m = lower(machine);
  if (m == "x86_64" || m == "amd64") return "x86_64";
  if (m == "aarch64" || m == "arm64") return "aarch64";
  return m;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<const Level*> levels_of(const std::string& isa) {
  std::vector<const Level*> out;
  for (const Level& lv : levels())
    if (isa == lv.isa) out.push_back(&lv);
  return out;
}

bool shows(const HostCpu& host, const Level& lv) {
  for (const char* f : lv.requires_)
    if (!host.flags.count(f)) return false;
  return true;
}

}  // namespace

HostCpu parse_cpuinfo(const std::string& text, const std::string& machine) {
  HostCpu host{isa_of_machine(machine), {}};
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = lower(trim(line.substr(0, colon)));
    if (key != "flags" && key != "features") continue;
    std::istringstream words(line.substr(colon + 1));
    for (std::string w; words >> w;) host.flags.insert(w);
    break;
  }
  return host;
}

const HostCpu& host_cpu() {
  static const HostCpu host = [] {
    struct utsname u {};
    std::string machine = uname(&u) == 0 ? u.machine : "unknown";
    std::ifstream f("/proc/cpuinfo");
    std::stringstream text;
    if (f) text << f.rdbuf();
    return parse_cpuinfo(text.str(), machine);
  }();
  return host;
}

std::string host_level(const HostCpu& host) {
  std::string best = "generic";
  for (const Level* lv : levels_of(host.isa))
    if (shows(host, *lv)) best = lv->name;
  return best;
}

void check_runs_here(const std::string& kernel, const std::string& arch, const HostCpu& host) {
  std::string name = arch;
  if (isa_of_machine(arch) == host.isa && (lower(arch) == "x86_64" || lower(arch) == "amd64" ||
                                           lower(arch) == "aarch64" || lower(arch) == "arm64"))
    name = "generic";  // older manifests name the machine: the ISA's baseline
  const Level* level = nullptr;
  for (const Level* lv : levels_of(host.isa))
    if (name == lv->name) level = lv;
  std::string here = host_level(host);
  if (!level && name == "generic" && levels_of(host.isa).empty()) return;  // no table: baseline
  if (!level)
    throw LaunchError(kernel + ": compiled for cpu:" + arch + ", a level of another ISA or one "
                      "this runtime does not know; this host is cpu:" + here + " (" + host.isa + ")");
  std::vector<std::string> lacking;
  for (const char* f : level->requires_)
    if (!host.flags.count(f)) lacking.push_back(f);
  std::sort(lacking.begin(), lacking.end());
  std::string missing;
  for (const auto& f : lacking) missing += (missing.empty() ? "" : ", ") + f;
  if (!missing.empty())
    throw LaunchError(kernel + ": compiled for cpu:" + arch + ", which needs " + missing +
                      "; this host is cpu:" + here + " and lacks them: compile it for 'cpu' on "
                      "this host, or for cpu:generic to run on any " + host.isa + " host");
}

}  // namespace tiled
