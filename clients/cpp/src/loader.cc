// load(): the artifact check and the choice of loader; Kernel::geometry.
#include "kernels.h"
#include "tiled/sha256.h"

namespace tiled {
namespace {

constexpr int64_t kMaxGrid[3] = {(int64_t(1) << 31) - 1, 65535, 65535};
constexpr int64_t kMaxBlock[3] = {1024, 1024, 64};
constexpr int64_t kMaxThreads = 1024;

std::string dims_text(const Dims& dims) {
  std::string s = "{";
  for (const auto& kv : dims) s += (s.size() > 1 ? ", " : "") + kv.first + ": " + std::to_string(kv.second);
  return s + "}";
}

}  // namespace

std::array<std::array<int64_t, 3>, 2> Kernel::geometry(const Dims& dims) const {
  const Manifest& m = manifest_;
  std::array<int64_t, 3> grid{}, block{};
  for (int a = 0; a < 3; ++a) {
    grid[a] = m.grid[a].eval(dims);
    block[a] = m.block[a].eval(dims);
  }
  for (int a = 0; a < 3; ++a)
    if (grid[a] < 0 || grid[a] > kMaxGrid[a])
      throw LaunchError(m.name + ": grid[" + std::to_string(a) + "] = " + std::to_string(grid[a]) +
                        " outside [0, " + std::to_string(kMaxGrid[a]) + "] (dims " + dims_text(dims) + ")");
  for (int a = 0; a < 3; ++a)
    if (block[a] < 1 || block[a] > kMaxBlock[a])
      throw LaunchError(m.name + ": block[" + std::to_string(a) + "] = " + std::to_string(block[a]) +
                        " outside [1, " + std::to_string(kMaxBlock[a]) + "]");
  if (block[0] * block[1] * block[2] > kMaxThreads)
    throw LaunchError(m.name + ": block has more than " + std::to_string(kMaxThreads) + " threads");
  bool empty = grid[0] == 0 || grid[1] == 0 || grid[2] == 0;
  if (!empty)
    for (int a = 0; a < 3; ++a)
      if (grid[a] % m.cluster[a])
        throw LaunchError(m.name + ": grid[" + std::to_string(a) + "] = " + std::to_string(grid[a]) +
                          " is not a multiple of the cluster size " + std::to_string(m.cluster[a]));
  return {grid, block};
}

std::unique_ptr<Kernel> load(const std::string& artifact, const Manifest& m) {
  std::string digest = sha256_hex(artifact);
  if (digest != m.artifact_sha256)
    throw LaunchError(m.name + ": artifact sha256 " + digest +
                          " does not match the manifest's artifact_sha256 " + m.artifact_sha256,
                      "ARTIFACT_MISMATCH");
  if (m.backend != "cuda" && (!m.requires_.empty() || m.fallback))
    throw LaunchError(m.name + ": launch preconditions and fallback variants are a cuda "
                               "manifest's; this " + m.backend + " manifest has them");
  if (m.backend == "cpu") return load_cpu(artifact, m);
  if (m.backend == "cuda") return load_cuda(artifact, m);
  throw LaunchError(m.name + ": no loader for backend '" + m.backend +
                    "' in this runtime (available: cpu, cuda)");
}

}  // namespace tiled
