// CPU feature levels (the Python runtime's tiled.runtime.cpu_levels): which CPU flags a
// `cpu:<level>` artifact needs, and whether this host shows them, so that an artifact built
// for a newer host is refused with a LaunchError instead of dying on an illegal instruction.
#pragma once

#include <set>
#include <string>

namespace tiled {

struct HostCpu {
  std::string isa;              // "x86_64", "aarch64", or another machine name
  std::set<std::string> flags;  // as /proc/cpuinfo names them ("flags" / "Features")
};

// The host described by /proc/cpuinfo `text` on `machine` (uname's machine): the flags of
// its first processor.
HostCpu parse_cpuinfo(const std::string& text, const std::string& machine);

// This host (/proc/cpuinfo read once; without it, no flags: only `generic` runs).
const HostCpu& host_cpu();

// The newest level whose flags `host` all shows ("generic" at least).
std::string host_level(const HostCpu& host);

// Throws LaunchError naming the missing flags when an artifact built for cpu:`arch` may use
// instructions `host` lacks, or when `arch` is a level of another ISA or unknown.
void check_runs_here(const std::string& kernel, const std::string& arch, const HostCpu& host);

}  // namespace tiled
