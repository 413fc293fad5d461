// A C++ client of the tiled compile daemon: the tiled.v1.Compiler service of
// proto/tiled/v1/compile.proto over gRPC C++, with the behaviour of the Python client
// (tiled/client/client.py): every call carries a deadline and is retried with jittered
// exponential backoff on UNAVAILABLE only; artifacts are checked against the sha256 that the
// response and its manifest name before anything is returned; a unix: socket that another user
// could have placed or swapped is refused before each call; TLS + a bearer token for host:port.
//
//   tiled::Client client(tiled::ClientOptions::from_env());     // TILED_SERVER, ...
//   tiled::CompileResult r = client.compile(program_bytes, {"cpu"});
//   auto kernel = tiled::load(r.artifact, r.manifest());
//
// Thread-safe: one Client may serve many threads. Failures throw tiled::Error (errors.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tiled/errors.h"
#include "tiled/loader.h"
#include "tiled/manifest.h"
#include "tiled/v1/compile.pb.h"

namespace tiled {

struct ClientOptions {
  std::string address;      // "unix:///path/tiled.sock" or "host:port"
  double timeout_s = 600;   // deadline of each call, a compile included
  int retries = 5;          // retries of a call answered UNAVAILABLE
  double backoff_s = 0.1;   // first retry delay; doubles per retry, capped at 5 s, jittered
  std::string tls_ca;       // host:port only: a PEM file of the CA to trust, or "system"
  std::string token_file;   // host:port only: the bearer token's file (needs tls_ca)
  uint64_t inline_limit = 0;  // inline artifacts up to this many bytes (0: the daemon's 1 MiB)

  // The settings the Python client reads, from the same variables: TILED_SERVER,
  // TILED_CLIENT_TIMEOUT_SECONDS, TILED_CLIENT_RETRIES, TILED_CLIENT_BACKOFF_SECONDS,
  // TILED_TLS_CA, TILED_TOKEN_FILE (tiled/config.py declares them). Error on a bad number.
  static ClientOptions from_env();
};

struct CompileOptions {
  std::string target = "local";  // "cpu", "cuda:sm_90a", ... or "local" (the daemon's device)
  std::string options_json;      // backend options as a JSON object, "" for none
  bool cache_only = false;       // NOT_FOUND instead of compiling
};

// A compile's answer with the artifact bytes, checked.
struct CompileResult {
  tiled::v1::CompileResponse response;  // artifact field cleared; bytes are in `artifact`
  std::string artifact;
  const std::string& action_key() const { return response.action_key(); }
  bool cache_hit() const { return response.cache_hit(); }
  Manifest manifest() const { return Manifest::parse(response.manifest_json()); }
};

struct WarmItem {
  std::string program;  // Tile IR bytes (Program.to_bytes())
  CompileOptions options;
};

struct WarmOutcome {
  uint32_t index = 0;     // position in the request
  int code = 0;           // gRPC status code; 0 = OK
  std::string code_name;  // "OK", "INVALID_ARGUMENT", ...
  std::string message, action_key;
  bool cache_hit = false;
};

// The gRPC status name of a code ("UNAVAILABLE"), "UNKNOWN(n)" for others.
std::string status_code_name(int code);

// `data` when it is the blob that the response and its manifest both name; ARTIFACT_MISMATCH
// otherwise, so a corrupt or truncated transfer never reaches the loader.
const std::string& check_artifact(const std::string& data, const tiled::v1::CompileResponse& response);

// Reassembles GetArtifact chunks; ARTIFACT_MISMATCH on a gap, an overlap, a total size that
// changes or disagrees, or bytes whose sha256 is not the one asked for.
class ChunkAssembler {
 public:
  explicit ChunkAssembler(std::string sha256) : sha256_(std::move(sha256)) {}
  void add(const tiled::v1::ArtifactChunk& chunk);
  std::string result();

 private:
  std::string sha256_, data_;
  std::optional<uint64_t> total_;
};

// UNTRUSTED_SOCKET when the daemon socket at a unix: address could have been placed or
// swapped by another user (the rules of tiled/client/socket_trust.py); returns otherwise.
void refuse_untrusted_socket(const std::string& address);

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }

  // The daemon's answer for `program` (Tile IR bytes, sent as the daemon's Program message)
  // with the checked artifact, fetched with GetArtifact when it was not inlined.
  CompileResult compile(const std::string& program, const CompileOptions& options = {});
  // compile() and load(): a kernel ready to launch, with the result it came from.
  std::pair<CompileResult, std::unique_ptr<Kernel>> compile_and_load(
      const std::string& program, const CompileOptions& options = {});
  // Whether the request is cached, compiling nothing: its response (artifact not fetched) on a
  // hit, nullopt on a miss; the errors a compile would raise for a request that would fail.
  std::optional<tiled::v1::CompileResponse> lookup(const std::string& program,
                                                   const CompileOptions& options = {});
  // The blob `sha256`, streamed in chunks of `chunk_bytes` (0: the daemon's default), checked.
  std::string get_artifact(const std::string& sha256, uint32_t chunk_bytes = 0);
  // The action keys among `keys` that the daemon has not cached.
  std::vector<std::string> find_missing(const std::vector<std::string>& keys);
  // Compiles the items on the daemon; one outcome per item, in the order they finish (also
  // passed to `on_result` as each arrives). A failed item is an outcome with a nonzero code.
  // Retried on UNAVAILABLE only before the first result.
  std::vector<WarmOutcome> warm(const std::vector<WarmItem>& items,
                                const std::function<void(const WarmOutcome&)>& on_result = {});
  tiled::v1::CapabilitiesResponse capabilities();
  // grpc.health.v1 status of `service` ("" is the whole daemon): "SERVING", "NOT_SERVING",
  // ..., or "SERVICE_UNKNOWN" for a name the daemon does not serve.
  std::string health(const std::string& service = "");

 private:
  struct Impl;
  ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tiled
