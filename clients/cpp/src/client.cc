// The gRPC side of the C++ client (see client.h for the contract).
#include "tiled/client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "tiled/sha256.h"
#include "tiled/v1/compile.grpc.pb.h"

namespace tiled {
namespace {

constexpr double kMaxBackoffS = 5.0;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

double env_number(const char* name, double fallback, bool integer) {
  std::string text = env(name);
  if (text.empty()) return fallback;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || (integer && v != std::floor(v)))
    throw Error("CONFIG", std::string(name) + ": expected " + (integer ? "an int" : "a number") +
                              ", got '" + text + "'");
  return v;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  if (!in) throw Error("CREDENTIALS", std::string("daemon credentials: cannot read ") + what + " " + path);
  return s.str();
}

std::string trim(std::string s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// Delays before retry n = 0, 1, ...: base * 2^n capped at kMaxBackoffS, each jittered to
// [d/2, d] so that clients refused together do not come back together.
double backoff_delay(int n, double base) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  double d = std::min(kMaxBackoffS, base * std::pow(2.0, n));
  return d / 2 + std::uniform_real_distribution<double>(0, d / 2)(rng);
}

// The program travels as the caller's bytes, untouched: they go into the request's unknown
// field set under CompileRequest.program's number (1, length-delimited), which protobuf writes
// out verbatim after the known fields. Decoding the file into this copy's Program type and
// encoding it again would drop what a newer schema added and need not give the same bytes; the
// daemon decodes and verifies the program either way (INVALID_ARGUMENT when it does not).
tiled::v1::CompileRequest compile_request(const std::string& program, const CompileOptions& o,
                                          uint64_t inline_limit) {
  tiled::v1::CompileRequest r;
  r.set_target(o.target);
  r.set_options_json(o.options_json);
  r.set_inline_limit(inline_limit);
  r.set_cache_only(o.cache_only);
  r.GetReflection()->MutableUnknownFields(&r)->AddLengthDelimited(1, program);
  return r;
}

Error rpc_error(const grpc::Status& s, const std::string& address) {
  int code = static_cast<int>(s.error_code());
  std::string details = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE)
    details = "tiled daemon at " + address + " is unavailable: " + details;
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && details.empty())
    details = "deadline exceeded";
  return Error(status_code_name(code), details, code);
}

}  // namespace

std::string status_code_name(int code) {
  static const char* const names[] = {
      "OK",           "CANCELLED",        "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",  "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",        "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code >= 0 && code <= 16) return names[code];
  return "UNKNOWN(" + std::to_string(code) + ")";
}

ClientOptions ClientOptions::from_env() {
  ClientOptions o;
  o.address = env("TILED_SERVER");
  o.timeout_s = env_number("TILED_CLIENT_TIMEOUT_SECONDS", o.timeout_s, false);
  o.retries = static_cast<int>(env_number("TILED_CLIENT_RETRIES", o.retries, true));
  o.backoff_s = env_number("TILED_CLIENT_BACKOFF_SECONDS", o.backoff_s, false);
  o.tls_ca = env("TILED_TLS_CA");
  o.token_file = env("TILED_TOKEN_FILE");
  return o;
}

const std::string& check_artifact(const std::string& data,
                                  const tiled::v1::CompileResponse& response) {
  Manifest m = Manifest::parse(response.manifest_json());
  std::string digest = sha256_hex(data);
  const std::pair<const char*, const std::string*> named[] = {
      {"response", &response.artifact_sha256()}, {"manifest", &m.artifact_sha256}};
  for (const auto& [what, want] : named)
    if (digest != *want)
      throw Error("ARTIFACT_MISMATCH", m.name + ": artifact from the daemon has sha256 " + digest +
                                           " (" + std::to_string(data.size()) + " bytes), but the " +
                                           what + " names " + *want);
  if (data.size() != response.artifact_size())
    throw Error("ARTIFACT_MISMATCH", m.name + ": artifact is " + std::to_string(data.size()) +
                                         " bytes, but the response says " +
                                         std::to_string(response.artifact_size()));
  return data;
}

void ChunkAssembler::add(const tiled::v1::ArtifactChunk& chunk) {
  std::string where = "artifact " + sha256_.substr(0, 12);
  if (chunk.offset() != data_.size())
    throw Error("ARTIFACT_MISMATCH", where + ": chunk at offset " + std::to_string(chunk.offset()) +
                                         ", expected " + std::to_string(data_.size()));
  if (total_ && chunk.total_size() != *total_)
    throw Error("ARTIFACT_MISMATCH", where + ": total size changed mid-stream");
  total_ = chunk.total_size();
  if (data_.size() + chunk.data().size() > *total_)
    throw Error("ARTIFACT_MISMATCH", where + ": more bytes than the total size " + std::to_string(*total_));
  data_ += chunk.data();
}

std::string ChunkAssembler::result() {
  std::string where = "artifact " + sha256_.substr(0, 12);
  if (total_ && data_.size() != *total_)
    throw Error("ARTIFACT_MISMATCH", where + ": got " + std::to_string(data_.size()) + " bytes of " +
                                         std::to_string(*total_));
  std::string digest = sha256_hex(data_);
  if (digest != sha256_)
    throw Error("ARTIFACT_MISMATCH", where + ": received bytes have sha256 " + digest);
  return std::move(data_);
}

struct Client::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<tiled::v1::Compiler::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;

  // fn(context) -> Status, retried on UNAVAILABLE with backoff within the deadline's time;
  // any other failure, or UNAVAILABLE past the retries, is thrown. Each attempt first checks
  // a unix: socket's owner and directory (UNTRUSTED_SOCKET, not retried).
  template <typename Fn>
  void call(const ClientOptions& o, Fn&& fn) {
    auto start = std::chrono::steady_clock::now();
    for (int attempt = 0;; ++attempt) {
      refuse_untrusted_socket(o.address);
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::microseconds(static_cast<int64_t>(o.timeout_s * 1e6)));
      grpc::Status status = fn(context);
      if (status.ok()) return;
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE && attempt < o.retries) {
        double delay = backoff_delay(attempt, o.backoff_s);
        double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (elapsed + delay <= o.timeout_s) {
          std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(delay * 1e6)));
          continue;
        }
      }
      throw rpc_error(status, o.address);
    }
  }
};

Client::Client(ClientOptions options) : options_(std::move(options)), impl_(new Impl) {
  const ClientOptions& o = options_;
  if (o.address.empty())
    throw Error("NO_SERVER", "no daemon address: pass one or set TILED_SERVER "
                             "(unix:///path or host:port)");
  if (!(o.timeout_s > 0)) throw Error("CONFIG", "timeout must be > 0 seconds");
  if (o.retries < 0 || o.backoff_s < 0) throw Error("CONFIG", "retries and backoff must be >= 0");
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  bool unix_socket = o.address.compare(0, 5, "unix:") == 0;
  if (!unix_socket) {  // the socket's file mode protects a unix: daemon; TLS is for TCP
    if (!o.token_file.empty() && o.tls_ca.empty())
      throw Error("CREDENTIALS", "a token file is set but no TLS CA (TILED_TLS_CA): the bearer "
                                 "token would cross the network to " + o.address + " in plaintext");
    if (!o.tls_ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      if (o.tls_ca != "system") ssl.pem_root_certs = read_file(o.tls_ca, "the TLS CA");
      creds = grpc::SslCredentials(ssl);
      if (!o.token_file.empty()) {
        std::string token = trim(read_file(o.token_file, "the token file"));
        if (token.empty()) throw Error("CREDENTIALS", "the token file " + o.token_file + " is empty");
        creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(token));
      }
    }
  }
  grpc::ChannelArguments args;
  // The daemon's unix socket or a host on the LAN: an HTTP proxy from the environment is wrong.
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // Reconnect within a second of a daemon (re)starting, so that the UNAVAILABLE retries above
  // reach it: gRPC's default reconnect backoff grows to two minutes, during which every call
  // fails at once.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  impl_->channel = grpc::CreateCustomChannel(o.address, creds, args);
  impl_->stub = tiled::v1::Compiler::NewStub(impl_->channel);
  impl_->health = grpc::health::v1::Health::NewStub(impl_->channel);
}

Client::~Client() = default;

CompileResult Client::compile(const std::string& program, const CompileOptions& options) {
  tiled::v1::CompileRequest request = compile_request(program, options, options_.inline_limit);
  CompileResult result;
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    return impl_->stub->Compile(&ctx, request, &result.response);
  });
  const auto& r = result.response;
  bool inlined = !r.artifact().empty() || r.artifact_size() == 0;
  result.artifact = inlined ? r.artifact() : get_artifact(r.artifact_sha256());
  result.response.clear_artifact();
  check_artifact(result.artifact, result.response);
  return result;
}

std::pair<CompileResult, std::unique_ptr<Kernel>> Client::compile_and_load(
    const std::string& program, const CompileOptions& options) {
  CompileResult r = compile(program, options);
  auto kernel = load(r.artifact, r.manifest());
  return {std::move(r), std::move(kernel)};
}

std::optional<tiled::v1::CompileResponse> Client::lookup(const std::string& program,
                                                         const CompileOptions& options) {
  CompileOptions probe = options;
  probe.cache_only = true;
  tiled::v1::CompileRequest request = compile_request(program, probe, 1);  // every artifact is > 1 byte
  tiled::v1::CompileResponse response;
  bool found = true;
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    grpc::Status s = impl_->stub->Compile(&ctx, request, &response);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      found = false;
      return grpc::Status::OK;
    }
    return s;
  });
  if (!found) return std::nullopt;
  return response;
}

std::string Client::get_artifact(const std::string& sha256, uint32_t chunk_bytes) {
  tiled::v1::GetArtifactRequest request;
  request.set_sha256(sha256);
  request.set_chunk_bytes(chunk_bytes);
  std::string data;
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    ChunkAssembler assembler(sha256);
    auto reader = impl_->stub->GetArtifact(&ctx, request);
    tiled::v1::ArtifactChunk chunk;
    while (reader->Read(&chunk)) {
      try {
        assembler.add(chunk);
      } catch (const Error&) {
        ctx.TryCancel();
        reader->Finish();
        throw;
      }
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) data = assembler.result();
    return s;
  });
  return data;
}

std::vector<std::string> Client::find_missing(const std::vector<std::string>& keys) {
  tiled::v1::FindMissingRequest request;
  for (const auto& k : keys) request.add_action_keys(k);
  tiled::v1::FindMissingResponse response;
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    return impl_->stub->FindMissing(&ctx, request, &response);
  });
  return {response.missing().begin(), response.missing().end()};
}

std::vector<WarmOutcome> Client::warm(const std::vector<WarmItem>& items,
                                      const std::function<void(const WarmOutcome&)>& on_result) {
  tiled::v1::WarmRequest request;
  for (const auto& item : items)
    *request.add_items() = compile_request(item.program, item.options, options_.inline_limit);
  std::vector<WarmOutcome> outcomes;
  grpc::Status late;  // a failure after the first result: not retried
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    auto reader = impl_->stub->Warm(&ctx, request);
    tiled::v1::WarmResult r;
    while (reader->Read(&r)) {
      WarmOutcome o{r.index(), r.code(), status_code_name(r.code()), r.message(), r.action_key(),
                    r.cache_hit()};
      outcomes.push_back(o);
      if (on_result) on_result(o);
    }
    grpc::Status s = reader->Finish();
    if (!s.ok() && !outcomes.empty()) {
      late = s;
      return grpc::Status::OK;
    }
    return s;
  });
  if (!late.ok()) throw rpc_error(late, options_.address);
  return outcomes;
}

tiled::v1::CapabilitiesResponse Client::capabilities() {
  tiled::v1::CapabilitiesRequest request;
  tiled::v1::CapabilitiesResponse response;
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    return impl_->stub->Capabilities(&ctx, request, &response);
  });
  return response;
}

std::string Client::health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  bool unknown = false;
  impl_->call(options_, [&](grpc::ClientContext& ctx) {
    grpc::Status s = impl_->health->Check(&ctx, request, &response);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      unknown = true;
      return grpc::Status::OK;
    }
    return s;
  });
  if (unknown) return "SERVICE_UNKNOWN";
  return grpc::health::v1::HealthCheckResponse_ServingStatus_Name(response.status());
}

}  // namespace tiled
