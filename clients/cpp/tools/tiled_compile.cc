// tiled-compile: the C++ client's command line (clients/cpp/README.md).
//
//   tiled-compile [OPTIONS] PROGRAM.tir              compile one program; one JSON line
//   tiled-compile [OPTIONS] --warm PROGRAM.tir...    one JSON line per result, as each finishes
//   tiled-compile [OPTIONS] --find-missing KEY...    a JSON list of the keys not cached
//   tiled-compile [OPTIONS] --capabilities           the CapabilitiesResponse as JSON
//   tiled-compile [OPTIONS] --health [SERVICE]       the status name; exit 1 unless SERVING
//   tiled-compile [OPTIONS] --get-artifact SHA256 --output FILE
//
// Exit status: 0 done, 1 an RPC error, a mismatch or a failed check (stderr names the gRPC
// status or the check, then the daemon's message), 2 a usage error.
#include <google/protobuf/util/json_util.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <sys/stat.h>

#include "tiled/client.h"

namespace {

using nlohmann::json;

const char* const kUsage =
    "usage: tiled-compile [OPTIONS] PROGRAM.tir\n"
    "       tiled-compile [OPTIONS] --warm PROGRAM.tir...\n"
    "       tiled-compile [OPTIONS] --find-missing KEY...\n"
    "       tiled-compile [OPTIONS] --capabilities\n"
    "       tiled-compile [OPTIONS] --health [SERVICE]\n"
    "       tiled-compile [OPTIONS] --get-artifact SHA256 --output FILE\n"
    "options:\n"
    "  --server ADDR       unix:///path or host:port (default $TILED_SERVER)\n"
    "  --target T          cpu, cuda:sm_90a, ... or local (default local)\n"
    "  --options JSON      backend options, a JSON object\n"
    "  --timeout S         deadline of each call (default $TILED_CLIENT_TIMEOUT_SECONDS or 600)\n"
    "  --retries N         retries on UNAVAILABLE (default $TILED_CLIENT_RETRIES or 5)\n"
    "  --backoff S         first retry delay (default $TILED_CLIENT_BACKOFF_SECONDS or 0.1)\n"
    "  --tls-ca FILE       CA for a host:port daemon, or 'system' (default $TILED_TLS_CA)\n"
    "  --token-file FILE   bearer token for a host:port daemon (default $TILED_TOKEN_FILE)\n"
    "  --inline-limit N    inline artifacts up to N bytes, else stream them (0: daemon default)\n"
    "  --cache-only        answer from the cache only (NOT_FOUND on a miss)\n"
    "  --refetch           fetch the artifact again with GetArtifact and compare\n"
    "  --chunk-bytes N     GetArtifact chunk size (0: the daemon's default)\n"
    "  --out DIR           write NAME.so|NAME.cubin and NAME.manifest.json into DIR\n";

struct Args {
  tiled::ClientOptions client;
  tiled::CompileOptions compile;
  std::string mode = "compile";  // compile | warm | find-missing | capabilities | health | get-artifact
  std::vector<std::string> positionals;
  bool refetch = false;
  uint32_t chunk_bytes = 0;
  std::string out_dir, output;
};

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double number(const std::string& flag, const std::string& text, bool integer) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || v < 0 || (integer && v != static_cast<uint64_t>(v)))
    throw UsageError(flag + ": expected " + (integer ? "an integer >= 0" : "a number >= 0") +
                     ", got '" + text + "'");
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  a.client = tiled::ClientOptions::from_env();
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") throw UsageError("");
    else if (arg == "--server") a.client.address = value();
    else if (arg == "--target") a.compile.target = value();
    else if (arg == "--options") a.compile.options_json = value();
    else if (arg == "--timeout") a.client.timeout_s = number(arg, value(), false);
    else if (arg == "--retries") a.client.retries = static_cast<int>(number(arg, value(), true));
    else if (arg == "--backoff") a.client.backoff_s = number(arg, value(), false);
    else if (arg == "--tls-ca") a.client.tls_ca = value();
    else if (arg == "--token-file") a.client.token_file = value();
    else if (arg == "--inline-limit") a.client.inline_limit = static_cast<uint64_t>(number(arg, value(), true));
    else if (arg == "--cache-only") a.compile.cache_only = true;
    else if (arg == "--refetch") a.refetch = true;
    else if (arg == "--chunk-bytes") a.chunk_bytes = static_cast<uint32_t>(number(arg, value(), true));
    else if (arg == "--out") a.out_dir = value();
    else if (arg == "--output") a.output = value();
    else if (arg == "--warm") a.mode = "warm";
    else if (arg == "--find-missing") a.mode = "find-missing";
    else if (arg == "--capabilities") a.mode = "capabilities";
    else if (arg == "--health") a.mode = "health";
    else if (arg == "--get-artifact") a.mode = "get-artifact";
    else if (arg.size() > 1 && arg[0] == '-') throw UsageError("unknown option " + arg);
    else a.positionals.push_back(arg);
  }
  size_t n = a.positionals.size();
  bool ok = a.mode == "compile"        ? n == 1
            : a.mode == "warm"         ? n >= 1
            : a.mode == "capabilities" ? n == 0
            : a.mode == "health"       ? n <= 1
            : a.mode == "get-artifact" ? n == 1 && !a.output.empty()
                                       : true;
  if (!ok) throw UsageError("wrong number of arguments for " + a.mode);
  if (a.client.address.empty()) throw UsageError("no daemon address: pass --server or set TILED_SERVER");
  return a;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
}

int compile(tiled::Client& client, const Args& a) {
  const std::string& file = a.positionals[0];
  tiled::CompileResult r = client.compile(read_file(file), a.compile);
  if (a.refetch) {  // get_artifact checks the streamed bytes against the digest it asked for
    std::string fetched = client.get_artifact(r.response.artifact_sha256(), a.chunk_bytes);
    if (fetched != r.artifact)
      throw tiled::Error("ARTIFACT_MISMATCH", "GetArtifact returned other bytes than Compile");
  }
  tiled::Manifest m = r.manifest();
  json line = {{"name", m.name},
               {"action_key", r.action_key()},
               {"artifact_sha256", r.response.artifact_sha256()},
               {"size", r.artifact.size()},
               {"cache_hit", r.cache_hit()},
               {"resolved_target", r.response.resolved_target()}};
  if (!a.out_dir.empty()) {
    ::mkdir(a.out_dir.c_str(), 0755);
    std::string ext = m.artifact_format == "cubin" ? "cubin" : m.artifact_format;
    std::string artifact = a.out_dir + "/" + m.name + "." + ext;
    write_file(artifact, r.artifact);
    write_file(a.out_dir + "/" + m.name + ".manifest.json", r.response.manifest_json());
    line["artifact"] = artifact;
  }
  std::cout << line.dump() << std::endl;
  return 0;
}

int warm(tiled::Client& client, const Args& a) {
  std::vector<tiled::WarmItem> items;
  for (const auto& file : a.positionals) items.push_back({read_file(file), a.compile});
  int failed = 0;
  client.warm(items, [&](const tiled::WarmOutcome& o) {
    failed += o.code != 0;
    std::cout << json{{"index", o.index}, {"file", a.positionals.at(o.index)},
                      {"code", o.code_name}, {"message", o.message},
                      {"action_key", o.action_key}, {"cache_hit", o.cache_hit}}.dump()
              << std::endl;
  });
  return failed ? 1 : 0;
}

int run(const Args& a) {
  tiled::Client client(a.client);
  if (a.mode == "compile") return compile(client, a);
  if (a.mode == "warm") return warm(client, a);
  if (a.mode == "find-missing") {
    std::cout << json(client.find_missing(a.positionals)).dump() << std::endl;
    return 0;
  }
  if (a.mode == "capabilities") {
    std::string text;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    google::protobuf::util::MessageToJsonString(client.capabilities(), &text, options);
    std::cout << text << std::endl;
    return 0;
  }
  if (a.mode == "health") {
    std::string status = client.health(a.positionals.empty() ? "" : a.positionals[0]);
    std::cout << status << std::endl;
    return status == "SERVING" ? 0 : 1;
  }
  // get-artifact
  write_file(a.output, client.get_artifact(a.positionals[0], a.chunk_bytes));
  std::cout << json{{"sha256", a.positionals[0]}, {"output", a.output}}.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& e) {
    if (*e.what()) std::cerr << "tiled-compile: " << e.what() << "\n";
    std::cerr << kUsage;
    return 2;
  } catch (const tiled::Error& e) {  // a TILED_* variable that does not parse
    std::cerr << "tiled-compile: " << e.what() << "\n";
    return 2;
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::string what = args.positionals.empty() ? args.mode : args.positionals[0];
    std::cerr << "tiled-compile: " << what << " on " << args.client.address << ": " << e.what()
              << "\n";
    return 1;
  }
}
