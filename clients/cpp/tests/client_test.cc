// tiled_client against a real daemon (TILED_SERVER; tests/clients/test_cpp_client.py starts
// one) and its checks that need none: a committed Tile IR program compiled, loaded and launched
// from C++ with numerics checked, streamed artifacts, lookup, socket trust, credentials, and the
// artifact checks. Run: tiled_client_test [CASE...]
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "check.h"
#include "tiled/client.h"
#include "tiled/sha256.h"

using tiled::Arg;
using tiled::Tensor;

namespace {

std::string testdata(const std::string& name) {
  std::ifstream in(std::string(TILED_TESTDATA_DIR) + "/" + name, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  if (!in || s.str().empty()) throw std::runtime_error("cannot read testdata/" + name);
  return s.str();
}

tiled::Client daemon_client(uint64_t inline_limit = 0) {
  tiled::ClientOptions o = tiled::ClientOptions::from_env();
  o.timeout_s = 120;
  o.inline_limit = inline_limit;
  return tiled::Client(o);
}

tiled::CompileOptions cpu() {
  tiled::CompileOptions o;
  o.target = "cpu";
  return o;
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

}  // namespace

// --- against the daemon ---------------------------------------------------------------------

TEST(vadd_compiles_loads_and_adds) {
  tiled::Client client = daemon_client();
  auto [result, kernel] = client.compile_and_load(testdata("vadd.tir"), cpu());
  // "cpu" resolves to this host's feature level (cpu:x86-64-v4, ...)
  CHECK_EQ(result.response.resolved_target().rfind("cpu:", 0), size_t(0));
  CHECK_EQ(tiled::sha256_hex(result.artifact), result.response.artifact_sha256());
  for (int64_t n : {100003, 1024, 1, 0}) {  // a ragged tail, exact blocks, one, none
    auto a = random_floats(size_t(n), 1), b = random_floats(size_t(n), 2);
    std::vector<float> c(size_t(n), NAN);
    kernel->launch({Tensor{a.data(), {n}, "float32"}, Tensor{b.data(), {n}, "float32"},
                    Tensor{c.data(), {n}, "float32"}});
    for (int64_t i = 0; i < n; ++i) CHECK_EQ(c[size_t(i)], a[size_t(i)] + b[size_t(i)]);
  }
  // the same request again: the daemon's cache answers, with the same action and bytes
  tiled::CompileResult again = client.compile(testdata("vadd.tir"), cpu());
  CHECK(again.cache_hit());
  CHECK_EQ(again.action_key(), result.action_key());
  CHECK(again.artifact == result.artifact);
}

TEST(rows_axpb_takes_scalars_and_a_symbolic_dim) {
  tiled::Client client = daemon_client();
  auto [result, kernel] = client.compile_and_load(testdata("rows_axpb.tir"), cpu());
  tiled::Manifest m = result.manifest();
  CHECK_EQ(m.dims.size(), 1u);
  CHECK_EQ(m.dims[0], std::string("M"));
  const int64_t n = 64;
  for (int64_t rows : {37, 4, 0}) {
    auto x = random_floats(size_t(rows * n), 3), b = random_floats(size_t(n), 4);
    std::vector<float> y(size_t(rows * n), NAN);
    kernel->launch({Tensor{x.data(), {rows, n}, "float32"}, Tensor{b.data(), {n}, "float32"},
                    0.25, -3, Tensor{y.data(), {rows, n}, "float32"}});
    for (int64_t i = 0; i < rows * n; ++i) {
      float want = x[size_t(i)] * 0.25f + b[size_t(i % n)] + -3.0f;
      CHECK(std::fabs(y[size_t(i)] - want) <= 1e-6f * (1 + std::fabs(want)));
    }
  }
  // arguments the manifest does not accept are refused before anything runs
  std::vector<float> x(2 * n), b(n), y(2 * n, 7.0f);
  CHECK_THROWS(kernel->launch({Tensor{x.data(), {2, n}, "float32"}, Tensor{b.data(), {n}, "float32"},
                               0.25, 1.5, Tensor{y.data(), {2, n}, "float32"}}),
               "LAUNCH_ERROR", "rows_axpb: k: expected an int for int32, got a float");
  CHECK_THROWS(kernel->launch({Tensor{x.data(), {2, n}, "float32"}, Tensor{b.data(), {n}, "float32"},
                               0.25, 1, Tensor{y.data(), {3, n}, "float32"}}),
               "LAUNCH_ERROR", "Y: dim 0 is M=3 here but M=2 from X");
  CHECK_EQ(y[0], 7.0f);
}

TEST(large_artifacts_stream_in_chunks) {
  tiled::Client inlined = daemon_client();
  tiled::Client streamed = daemon_client(1);  // nothing is inlined: Compile + GetArtifact
  tiled::CompileResult a = inlined.compile(testdata("vadd.tir"), cpu());
  tiled::CompileResult b = streamed.compile(testdata("vadd.tir"), cpu());
  CHECK(a.artifact == b.artifact);
  std::string chunked = streamed.get_artifact(a.response.artifact_sha256(), 1000);
  CHECK(chunked == a.artifact);
  CHECK_THROWS(streamed.get_artifact(std::string(64, '0')), "NOT_FOUND", "");
}

TEST(lookup_answers_hits_and_misses_without_compiling) {
  tiled::Client client = daemon_client();
  client.compile(testdata("vadd.tir"), cpu());
  auto hit = client.lookup(testdata("vadd.tir"), cpu());
  CHECK(hit.has_value());
  CHECK(hit->artifact().empty());
  tiled::CompileOptions other = cpu();
  other.options_json = "{\"safe_access\": false}";  // never compiled in these tests
  CHECK(!client.lookup(testdata("vadd.tir"), other).has_value());
}

TEST(program_that_does_not_decode_is_invalid_argument) {
  tiled::Client client = daemon_client();
  CHECK_THROWS(client.compile(testdata("vadd.tir").substr(0, 300), cpu()), "INVALID_ARGUMENT", "");
}

// --- no daemon needed -------------------------------------------------------------------------

TEST(chunks_with_gaps_or_other_bytes_are_refused) {
  std::string data(3000, 'x');
  std::string sha = tiled::sha256_hex(data);
  auto chunk = [](uint64_t offset, std::string bytes, uint64_t total) {
    tiled::v1::ArtifactChunk c;
    c.set_offset(offset);
    c.set_data(bytes);
    c.set_total_size(total);
    return c;
  };
  tiled::ChunkAssembler ok(sha);
  ok.add(chunk(0, data.substr(0, 1000), 3000));
  ok.add(chunk(1000, data.substr(1000), 3000));
  CHECK(ok.result() == data);
  tiled::ChunkAssembler gap(sha);
  gap.add(chunk(0, data.substr(0, 1000), 3000));
  CHECK_THROWS(gap.add(chunk(1500, data.substr(1500), 3000)), "ARTIFACT_MISMATCH",
               "chunk at offset 1500, expected 1000");
  tiled::ChunkAssembler resized(sha);
  resized.add(chunk(0, data.substr(0, 1000), 3000));
  CHECK_THROWS(resized.add(chunk(1000, data.substr(1000), 4000)), "ARTIFACT_MISMATCH",
               "total size changed");
  tiled::ChunkAssembler short_(sha);
  short_.add(chunk(0, data.substr(0, 1000), 3000));
  CHECK_THROWS(short_.result(), "ARTIFACT_MISMATCH", "got 1000 bytes of 3000");
  tiled::ChunkAssembler flipped(sha);
  std::string bad = data;
  bad[2999] = 'y';
  flipped.add(chunk(0, bad, 3000));
  CHECK_THROWS(flipped.result(), "ARTIFACT_MISMATCH", "received bytes have sha256");
}

TEST(an_artifact_its_manifest_does_not_name_is_refused) {
  std::string data = "not a shared library";
  tiled::v1::CompileResponse r;
  r.set_artifact_sha256(tiled::sha256_hex(data));
  r.set_artifact_size(data.size());
  std::string manifest =
      "{\"manifest_version\":1,\"name\":\"k\",\"program_digest\":\"" + std::string(64, 'a') +
      "\",\"target\":\"cpu\",\"backend\":\"cpu\",\"arch\":\"x86_64\",\"artifact_format\":"
      "\"so\",\"artifact_sha256\":\"" + std::string(64, '0') + "\",\"symbol\":\"k\",\"params\":[]}";
  r.set_manifest_json(manifest);
  CHECK_THROWS(tiled::check_artifact(data, r), "ARTIFACT_MISMATCH", "the manifest names 000");
  r.set_artifact_size(data.size() + 1);
  r.set_manifest_json(manifest.replace(manifest.find(std::string(64, '0')), 64, r.artifact_sha256()));
  CHECK_THROWS(tiled::check_artifact(data, r), "ARTIFACT_MISMATCH", "but the response says");
  r.set_artifact_sha256(std::string(64, '1'));
  CHECK_THROWS(tiled::check_artifact(data, r), "ARTIFACT_MISMATCH", "the response names 111");
}

TEST(sockets_other_users_could_swap_are_refused) {
  char base[] = "/tmp/tiled-cpp-trust-XXXXXX";
  CHECK(::mkdtemp(base) != nullptr);
  std::string dir = std::string(base) + "/open";
  ::mkdir(dir.c_str(), 0777);
  ::chmod(dir.c_str(), 0777);  // past the umask: writable by anyone, no sticky bit
  std::string address = "unix://" + dir + "/tiled.sock";
  CHECK_THROWS(tiled::refuse_untrusted_socket(address), "UNTRUSTED_SOCKET",
               "is writable by group or others without the sticky bit (mode 0777)");
  tiled::ClientOptions o;
  o.address = address;
  o.retries = 3;
  tiled::Client client(o);
  CHECK_THROWS(client.capabilities(), "UNTRUSTED_SOCKET", "Run chmod go-w");  // not retried
  ::chmod(dir.c_str(), 01777);  // sticky, as /tmp: others cannot rename the socket away
  tiled::refuse_untrusted_socket(address);
  tiled::refuse_untrusted_socket("127.0.0.1:1");  // not a unix: address: nothing to check
  ::rmdir(dir.c_str());
  ::rmdir(base);
}

TEST(settings_that_cannot_work_are_refused) {
  CHECK_THROWS(tiled::Client(tiled::ClientOptions{}), "NO_SERVER", "set TILED_SERVER");
  tiled::ClientOptions o;
  o.address = "127.0.0.1:1";
  o.token_file = "/nonexistent/token";
  CHECK_THROWS(tiled::Client{o}, "CREDENTIALS", "in plaintext");
  o.tls_ca = "/nonexistent/ca.pem";
  CHECK_THROWS(tiled::Client{o}, "CREDENTIALS", "cannot read the TLS CA /nonexistent/ca.pem");
  ::setenv("TILED_CLIENT_RETRIES", "many", 1);
  CHECK_THROWS(tiled::ClientOptions::from_env(), "CONFIG", "TILED_CLIENT_RETRIES: expected an int");
  ::unsetenv("TILED_CLIENT_RETRIES");
}

TEST(unavailable_is_retried_then_reported) {
  char base[] = "/tmp/tiled-cpp-gone-XXXXXX";
  CHECK(::mkdtemp(base) != nullptr);
  tiled::ClientOptions o;
  o.address = std::string("unix://") + base + "/none.sock";
  o.retries = 2;
  o.backoff_s = 0.05;
  tiled::Client client(o);
  CHECK_THROWS(client.capabilities(), "UNAVAILABLE",
               std::string("tiled daemon at ") + o.address + " is unavailable");
  ::rmdir(base);
}

int main(int argc, char** argv) { return check::run_tests(argc, argv); }
