// The backends' loaders (internal).
#pragma once

#include <memory>
#include <string>

#include "tiled/loader.h"

namespace tiled {

std::unique_ptr<Kernel> load_cpu(const std::string& artifact, const Manifest& manifest);
std::unique_ptr<Kernel> load_cuda(const std::string& artifact, const Manifest& manifest);

}  // namespace tiled
