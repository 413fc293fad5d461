// SHA-256 (FIPS 180-4), so the loader checks artifacts without linking a crypto library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tiled {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  // The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex_digest();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

// sha256 of `data` as 64 lowercase hex digits.
std::string sha256_hex(const std::string& data);

}  // namespace tiled
