// The C++ client's errors: one base, tiled::Error, whose code() names the failure the way the
// Node and Python clients do ("INVALID_ARGUMENT", "ARTIFACT_MISMATCH", ...).
#pragma once

#include <stdexcept>
#include <string>

namespace tiled {

// Every failure of the library. what() is "CODE: message". For an RPC that failed, code() is
// the gRPC status name (compile.proto says what each means) and grpc_code() its number; for
// the library's own checks code() is one of
//   ARTIFACT_MISMATCH  bytes received are not the blob the daemon or the manifest named
//   LAUNCH_ERROR       arguments that do not fit the manifest, or a loader / driver failure
//   MANIFEST_ERROR     a manifest that does not follow the schema (the field is named)
//   UNTRUSTED_SOCKET   a unix: socket another user could have placed or swapped
//   NO_SERVER          no daemon address was given
//   CREDENTIALS        TLS / token files that cannot be read, or a token without TLS
// and grpc_code() is -1.
class Error : public std::runtime_error {
 public:
  Error(std::string code, const std::string& message, int grpc_code = -1)
      : std::runtime_error(code + ": " + message),
        code_(std::move(code)),
        message_(message),
        grpc_code_(grpc_code) {}

  const std::string& code() const noexcept { return code_; }
  // The message without the "CODE: " prefix.
  const std::string& message() const noexcept { return message_; }
  int grpc_code() const noexcept { return grpc_code_; }

 private:
  std::string code_;
  std::string message_;
  int grpc_code_;
};

// A kernel that cannot be loaded or launched with these arguments; nothing ran.
class LaunchError : public Error {
 public:
  explicit LaunchError(const std::string& message, std::string code = "LAUNCH_ERROR")
      : Error(std::move(code), message) {}
};

// A manifest that does not follow the schema of tiled/runtime/manifest.py.
class ManifestError : public LaunchError {
 public:
  explicit ManifestError(const std::string& message)
      : LaunchError(message, "MANIFEST_ERROR") {}
};

}  // namespace tiled
