// tiled_loader without a daemon or a GPU: SHA-256, manifest validation, expressions, argument
// checks, launch geometry, 16-bit float conversions, cuda parameter packing and TMA requests,
// what load() refuses, and CPU feature levels. Run: tiled_loader_test [CASE...]
#include <cstring>
#include <nlohmann/json.hpp>

#include "check.h"
#include "cpu_level.h"
#include "cuda_pack.h"
#include "tiled/half.h"
#include "tiled/loader.h"
#include "tiled/sha256.h"

using nlohmann::json;
using tiled::Arg;
using tiled::Manifest;
using tiled::Tensor;

namespace {

const std::string kHex(64, 'a');

// A cuda manifest over A[M, 64] float16, B[64] float32, scale float32, n int32, C[M] float16.
json cuda_manifest() {
  return json{
      {"manifest_version", 1}, {"name", "k"}, {"program_digest", kHex},
      {"target", "cuda:sm_90a"}, {"backend", "cuda"}, {"arch", "sm_90a"},
      {"artifact_format", "cubin"}, {"artifact_sha256", kHex}, {"symbol", "k_kernel"},
      {"params", json::array({
          {{"name", "A"}, {"kind", "tensor"}, {"dtype", "float16"}, {"shape", {"M", 64}},
           {"align", 16}},
          {{"name", "B"}, {"kind", "tensor"}, {"dtype", "float32"}, {"shape", {64}}},
          {{"name", "scale"}, {"kind", "scalar"}, {"dtype", "float16"}},
          {{"name", "n"}, {"kind", "scalar"}, {"dtype", "int8"}},
          {{"name", "C"}, {"kind", "tensor"}, {"dtype", "float16"}, {"shape", {"M"}}}})},
      {"kernel_args", json::array({{{"kind", "tensor"}, {"param", 0}},
                                   {{"kind", "scalar"}, {"param", 2}},
                                   {{"kind", "scalar"}, {"param", 3}},
                                   {{"kind", "dim"}, {"name", "M"}, {"dtype", "int32"}},
                                   {{"kind", "tensor_map"}, {"param", 0}, {"box", {64, 32}},
                                    {"swizzle", 128}}})},
      {"grid", {{"ceildiv", "M", 128}, 1, 1}}, {"block", {128, 1, 1}},
      {"dynamic_smem_bytes", 65536}, {"cluster", {1, 1, 1}}};
}

Manifest parse(const json& j) { return Manifest::parse(j.dump()); }

json with(json j, const std::string& key, const json& value) {
  j[key] = value;
  return j;
}

}  // namespace

TEST(sha256_known_vectors) {
  CHECK_EQ(tiled::sha256_hex(""),
           std::string("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
  CHECK_EQ(tiled::sha256_hex("abc"),
           std::string("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
  CHECK_EQ(tiled::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
           std::string("248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
  std::string million(1000000, 'a');
  CHECK_EQ(tiled::sha256_hex(million),
           std::string("cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
  for (size_t cut : {0u, 1u, 55u, 56u, 63u, 64u, 65u, 1000u}) {  // any split, same digest
    tiled::Sha256 s;
    s.update(million.data(), cut);
    s.update(million.data() + cut, million.size() - cut);
    CHECK_EQ(s.hex_digest(), tiled::sha256_hex(million));
  }
}

TEST(manifest_parses_every_field) {
  json j = cuda_manifest();
  j["requires"] = {{"floormod", {"mul", 2, "M"}, 16}};
  j["fallback"] = {{"symbol", "k_fallback"}, {"kernel_args", json::array()},
                   {"grid", {"M", 1, 1}}, {"block", {64, 1, 1}}, {"dynamic_smem_bytes", 0},
                   {"cluster", {1, 1, 1}}};
  Manifest m = parse(j);
  CHECK_EQ(m.name, std::string("k"));
  CHECK_EQ(m.params.size(), 5u);
  CHECK_EQ(m.dims.size(), 1u);
  CHECK_EQ(m.dims[0], std::string("M"));
  CHECK_EQ(m.params[0].alignment(), 16);
  CHECK_EQ(m.params[1].alignment(), 4);  // the element size by default
  CHECK_EQ(m.kernel_args[4].swizzle, 128);
  CHECK_EQ(m.grid[0].eval({{"M", 257}}), 3);
  CHECK_EQ(m.requires_.size(), 1u);
  CHECK(m.fallback != nullptr);
  CHECK_EQ(m.fallback->symbol, std::string("k_fallback"));
  CHECK_EQ(m.fallback->grid[0].eval({{"M", 5}}), 5);
  CHECK(m.fallback->requires_.empty());
}

TEST(manifest_errors_name_the_field) {
  json j = cuda_manifest();
  CHECK_THROWS(Manifest::parse("{"), "MANIFEST_ERROR", "not valid JSON");
  CHECK_THROWS(Manifest::parse("[]"), "MANIFEST_ERROR", "expected a JSON object");
  json missing = j;
  missing.erase("symbol");
  CHECK_THROWS(parse(missing), "MANIFEST_ERROR", "missing field(s) symbol");
  CHECK_THROWS(parse(with(j, "colour", 1)), "MANIFEST_ERROR", "unknown field(s) colour");
  CHECK_THROWS(parse(with(j, "manifest_version", 2)), "MANIFEST_ERROR", "reads version 1");
  CHECK_THROWS(parse(with(j, "artifact_sha256", "ABC")), "MANIFEST_ERROR", "artifact_sha256");
  CHECK_THROWS(parse(with(j, "target", "cpu")), "MANIFEST_ERROR", "does not belong to backend");
  CHECK_THROWS(parse(with(j, "artifact_format", "so")), "MANIFEST_ERROR", "produces 'cubin'");
  CHECK_THROWS(parse(with(j, "grid", {"K", 1, 1})), "MANIFEST_ERROR",
               "manifest grid[0]: uses ['K'], which no tensor parameter binds (dims: M)");
  CHECK_THROWS(parse(with(j, "grid", {{"pow", 2, 3}, 1, 1})), "MANIFEST_ERROR",
               "unknown operator");
  CHECK_THROWS(parse(with(j, "block", {1, 1})), "MANIFEST_ERROR", "expected 3 entries");
  CHECK_THROWS(parse(with(j, "cluster", {0, 1, 1})), "MANIFEST_ERROR", "cluster");
  CHECK_THROWS(parse(with(j, "dynamic_smem_bytes", -1)), "MANIFEST_ERROR", "dynamic_smem_bytes");
  json dup = j;
  dup["params"][1]["name"] = "A";
  CHECK_THROWS(parse(dup), "MANIFEST_ERROR", "params[1].name: duplicate parameter name 'A'");
  json dtype = j;
  dtype["params"][1]["dtype"] = "float128";
  CHECK_THROWS(parse(dtype), "MANIFEST_ERROR", "params[1].dtype: unknown dtype");
  json align = j;
  align["params"][0]["align"] = 12;
  CHECK_THROWS(parse(align), "MANIFEST_ERROR", "params[0].align: expected a power of two");
  json range = j;
  range["kernel_args"][0]["param"] = 9;
  CHECK_THROWS(parse(range), "MANIFEST_ERROR", "kernel_args[0]: param index 9 out of range");
  json kind = j;
  kind["kernel_args"][0]["param"] = 2;
  CHECK_THROWS(parse(kind), "MANIFEST_ERROR", "kind 'tensor' but params[2] (scale) is a scalar");
  json box = j;
  box["kernel_args"][4]["box"] = {64};
  CHECK_THROWS(parse(box), "MANIFEST_ERROR", "a tensor_map needs one per dim");
  json narrow = j;
  narrow["kernel_args"][4]["box"] = {4, 32};  // 8 bytes
  CHECK_THROWS(parse(narrow), "MANIFEST_ERROR", "multiple of 16 bytes");
  json fallback = j;
  fallback["fallback"] = {{"symbol", "f"}, {"kernel_args", json::array()}, {"grid", {"Q", 1, 1}},
                          {"block", {1, 1, 1}}, {"dynamic_smem_bytes", 0}, {"cluster", {1, 1, 1}}};
  CHECK_THROWS(parse(fallback), "MANIFEST_ERROR", "manifest fallback.grid[0]");
  json deep = 1;
  for (int i = 0; i < 100; ++i) deep = json{"add", deep, 1};
  CHECK_THROWS(parse(with(j, "grid", {deep, 1, 1})), "MANIFEST_ERROR", "nested more than 64");
}

TEST(expressions_round_like_python) {
  auto e = [](const json& j) {
    json m = cuda_manifest();
    m["grid"] = {j, 1, 1};
    return parse(m).grid[0];
  };
  tiled::Dims dims{{"M", -7}};
  CHECK_EQ(e({"floordiv", "M", 2}).eval(dims), -4);
  CHECK_EQ(e({"floormod", "M", 2}).eval(dims), 1);
  CHECK_EQ(e({"ceildiv", "M", 2}).eval(dims), -3);
  CHECK_EQ(e({"ceildiv", 7, 2}).eval(dims), 4);
  CHECK_EQ(e({"floormod", 7, -2}).eval(dims), -1);
  CHECK_EQ(e({"min", {"mul", "M", 3}, {"sub", 0, 30}}).eval(dims), -30);
  CHECK_EQ(e({"max", "M", 2}).eval(dims), 2);
  CHECK_THROWS(e({"floordiv", 1, {"sub", "M", "M"}}).eval(dims), "LAUNCH_ERROR", "division by zero");
  CHECK_THROWS(e("M").eval({}), "LAUNCH_ERROR", "which no argument binds");
  CHECK_THROWS(e({"mul", "M", "M"}).eval({{"M", int64_t(1) << 40}}), "LAUNCH_ERROR", "overflow");
}

TEST(bind_args_checks_like_the_python_runtime) {
  Manifest m = parse(cuda_manifest());
  alignas(16) static uint16_t a[3 * 64], c[3];
  alignas(16) static float b[64];
  auto args = [&](Arg scale, Arg n) {
    return std::vector<Arg>{Tensor{a, {3, 64}, "float16"}, Tensor{b, {64}, "float32"}, scale, n,
                            Tensor{c, {3}, "float16"}};
  };
  tiled::BoundArgs bound = tiled::bind_args(m, args(2, 5));
  CHECK_EQ(bound.dims.at("M"), 3);
  CHECK(bound.values[2].kind() == Arg::Kind::Float);  // an int for a float param
  CHECK_EQ(bound.values[2].as_float(), 2.0);
  CHECK_THROWS(tiled::bind_args(m, {}), "LAUNCH_ERROR", "expected 5 arguments (A, B, scale, n, C), got 0");
  auto bad = args(1.5, 5);
  bad[1] = Tensor{b, {64}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "k: B: expected dtype float32, got float16");
  bad = args(1.5, 5);
  bad[0] = Tensor{a, {3, 32}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "A: dim 1 must be 64, got 32");
  bad = args(1.5, 5);
  bad[0] = Tensor{a, {192}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "A: expected 2 dims [M, 64], got 1");
  bad = args(1.5, 5);
  bad[4] = Tensor{c, {2}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "C: dim 0 is M=2 here but M=3 from A");
  bad = args(1.5, 5);
  bad[0] = Tensor{a + 1, {3, 64}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "is not aligned to 16 bytes");
  bad = args(1.5, 5);
  bad[4] = Tensor{c, {-1}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "dim 0 is negative");
  bad = args(1.5, 5);
  bad[4] = Tensor{c, {int64_t(1) << 31}, "float16"};
  bad[0] = Tensor{a, {int64_t(1) << 31, 64}, "float16"};
  CHECK_THROWS(tiled::bind_args(m, bad), "LAUNCH_ERROR", "32-bit integers");
  CHECK_THROWS(tiled::bind_args(m, args(1.5, 128)), "LAUNCH_ERROR", "n: 128 is out of range for int8 [-128, 127]");
  CHECK_THROWS(tiled::bind_args(m, args(1.5, -129)), "LAUNCH_ERROR", "out of range for int8");
  CHECK_THROWS(tiled::bind_args(m, args(1.5, 2.0)), "LAUNCH_ERROR", "n: expected an int for int8, got a float");
  CHECK_THROWS(tiled::bind_args(m, args(70000.0, 1)), "LAUNCH_ERROR", "out of range for float16");
  CHECK_THROWS(tiled::bind_args(m, args(true, 1)), "LAUNCH_ERROR", "expected a float or int for float16, got a bool");
  CHECK_THROWS(tiled::bind_args(m, args(Tensor{b, {64}, "float32"}, 1)), "LAUNCH_ERROR", "got a tensor");
  CHECK_THROWS(tiled::bind_args(m, args(1.5, 1ULL << 63)), "LAUNCH_ERROR", "out of range for int8");
}

TEST(half_and_bfloat16_round_to_nearest_even) {
  CHECK_EQ(tiled::float16_bits(1.0), 0x3c00);
  CHECK_EQ(tiled::float16_bits(-2.0), 0xc000);
  CHECK_EQ(tiled::float16_bits(65504.0), 0x7bff);
  CHECK_EQ(tiled::float16_bits(65519.0), 0x7bff);
  CHECK_EQ(tiled::float16_bits(65520.0), 0x7c00);
  CHECK_EQ(tiled::float16_bits(std::ldexp(1.0, -24)), 0x0001);
  CHECK_EQ(tiled::float16_bits(std::ldexp(1.0, -25)), 0x0000);      // a tie: to even (0)
  CHECK_EQ(tiled::float16_bits(3 * std::ldexp(1.0, -25)), 0x0002);  // a tie: to even (2)
  CHECK_EQ(tiled::float16_bits(1.0 + std::ldexp(1.0, -11)), 0x3c00);  // tie below: even
  CHECK_EQ(tiled::float16_bits(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);
  CHECK_EQ(tiled::float16_value(0x3555), 0.333251953125);
  for (uint32_t bits = 0; bits < 0x7c00; ++bits)  // every finite half survives a round trip
    CHECK_EQ(tiled::float16_bits(tiled::float16_value(uint16_t(bits))), uint16_t(bits));
  CHECK_EQ(tiled::bfloat16_bits(1.0), 0x3f80);
  CHECK_EQ(tiled::bfloat16_bits(1.0 + std::ldexp(1.0, -8)), 0x3f80);  // tie: even
  CHECK_EQ(tiled::bfloat16_bits(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);
  CHECK_EQ(tiled::bfloat16_bits(std::nan("")), 0x7fc0);
  CHECK_EQ(tiled::bfloat16_value(0x4049), 3.140625);
}

TEST(geometry_evaluates_grid_and_checks_limits) {
  json j = cuda_manifest();
  std::string cubin = "not a cubin";
  j["artifact_sha256"] = tiled::sha256_hex(cubin);
  auto kernel = tiled::load(cubin, parse(j));  // nothing touches the driver before a launch
  auto geo = kernel->geometry({{"M", 1000}});
  CHECK_EQ(geo[0][0], 8);
  CHECK_EQ(geo[1][0], 128);
  CHECK_EQ(kernel->geometry({{"M", 0}})[0][0], 0);  // nothing to launch
  CHECK_THROWS(kernel->geometry({{"M", -300}}), "LAUNCH_ERROR", "grid[0] = -2 outside");
  json wide = with(j, "block", {2048, 1, 1});
  CHECK_THROWS(tiled::load(cubin, parse(wide))->geometry({{"M", 1}}), "LAUNCH_ERROR",
               "block[0] = 2048 outside [1, 1024]");
  json cluster = with(j, "cluster", {2, 1, 1});
  CHECK_THROWS(tiled::load(cubin, parse(cluster))->geometry({{"M", 384}}), "LAUNCH_ERROR",
               "grid[0] = 3 is not a multiple of the cluster size 2");
}

TEST(cuda_kernel_args_pack_like_the_python_runtime) {
  Manifest m = parse(cuda_manifest());
  alignas(16) static uint16_t a[2 * 64], c[2];
  alignas(16) static float b[64];
  std::vector<Arg> args{Tensor{a, {2, 64}, "float16"}, Tensor{b, {64}, "float32"}, 0.333, -3,
                        Tensor{c, {2}, "float16"}};
  tiled::BoundArgs bound = tiled::bind_args(m, args);
  tiled::TensorMapRequest seen;
  auto slots = tiled::pack_kernel_args(m, bound, [&](const tiled::TensorMapRequest& r) {
    seen = r;
    std::array<unsigned char, 128> out{};
    out.fill(0xab);
    return out;
  });
  CHECK_EQ(slots.size(), 5u);
  uint64_t ptr;
  std::memcpy(&ptr, slots[0].bytes, 8);
  CHECK_EQ(ptr, uint64_t(reinterpret_cast<uintptr_t>(a)));
  uint16_t half;
  std::memcpy(&half, slots[1].bytes, 2);
  CHECK_EQ(half, 0x3554);  // float16(0.333)
  CHECK_EQ(int(int8_t(slots[2].bytes[0])), -3);
  int32_t dim;
  std::memcpy(&dim, slots[3].bytes, 4);
  CHECK_EQ(dim, 2);
  CHECK_EQ(int(slots[4].bytes[127]), 0xab);
  CHECK_EQ(seen.dtype, std::string("float16"));
  CHECK(seen.address == a);
  CHECK((seen.dims == std::vector<uint64_t>{64, 2}));
  CHECK((seen.strides == std::vector<uint64_t>{128}));
  CHECK((seen.box == std::vector<uint32_t>{64, 32}));
  CHECK_EQ(seen.swizzle, 128);
}

TEST(tensor_map_requests_follow_the_tma_rules) {
  json j = cuda_manifest();
  j["params"][0]["shape"] = {"M", "K"};
  j["kernel_args"][4]["box"] = {8, 32};
  j["kernel_args"][4]["swizzle"] = 0;
  Manifest m = parse(j);
  alignas(16) static uint16_t a[64 * 64];
  // rows of K = 12 halves are 24 bytes apart: not a multiple of 16
  CHECK_THROWS(tiled::tensor_map_request(m, 4, Tensor{a, {4, 12}, "float16"}), "LAUNCH_ERROR",
               "K=12 float16 rows are 24 bytes; TMA needs row strides that are multiples of 16 "
               "bytes: pad the row length to a multiple of 8");
  // one row: never stepped, so its stride is free (rounded up to 16 bytes)
  auto r = tiled::tensor_map_request(m, 4, Tensor{a, {1, 12}, "float16"});
  CHECK((r.strides == std::vector<uint64_t>{32}));
  CHECK_THROWS(tiled::tensor_map_request(m, 4, Tensor{a + 1, {4, 16}, "float16"}),
               "LAUNCH_ERROR", "not 16-byte aligned");
  CHECK_THROWS(tiled::tensor_map_request(m, 4, Tensor{a, {0, 16}, "float16"}), "LAUNCH_ERROR",
               "every dim in 1..2^32");
  Manifest dims = parse(cuda_manifest());
  json big = cuda_manifest();
  big["kernel_args"][3]["dtype"] = "uint32";
  alignas(16) static uint16_t c[1];
  tiled::BoundArgs bound;
  bound.values = {Tensor{a, {1, 64}, "float16"}, Tensor{a, {64}, "float32"}, 1.0, 1,
                  Tensor{c, {1}, "float16"}};
  bound.dims["M"] = -1;
  auto encode = [](const tiled::TensorMapRequest&) { return std::array<unsigned char, 128>{}; };
  CHECK_THROWS(tiled::pack_kernel_args(parse(big), bound, encode), "LAUNCH_ERROR",
               "dim M=-1 does not fit the kernel's uint32 parameter #3");
}

TEST(load_refuses_what_it_cannot_run) {
  json j = cuda_manifest();
  std::string cubin = "bytes";
  CHECK_THROWS(tiled::load(cubin, parse(j)), "ARTIFACT_MISMATCH",
               "does not match the manifest's artifact_sha256");
  j["artifact_sha256"] = tiled::sha256_hex(cubin);
  json rocm = with(with(with(j, "backend", "rocm"), "target", "rocm:gfx942"), "artifact_format", "hsaco");
  rocm["code_object"] = {{"vgpr_count", 32}, {"lds_bytes", 0}};  // rocm's record parses
  CHECK_THROWS(tiled::load(cubin, parse(rocm)), "LAUNCH_ERROR", "no loader for backend 'rocm'");
  json metal = with(with(with(j, "backend", "metal"), "target", "metal:apple9"), "artifact_format", "msl");
  metal["metal"] = {{"msl_version", "3.1"}};  // and metal's
  CHECK_THROWS(tiled::load(cubin, parse(metal)), "LAUNCH_ERROR", "no loader for backend 'metal'");
  json cpu = with(with(with(with(j, "backend", "cpu"), "target", "cpu:generic"), "arch", "generic"),
                  "artifact_format", "so");
  cpu["kernel_args"] = json::array();
  cpu["requires"] = {0};
  CHECK_THROWS(tiled::load(cubin, parse(cpu)), "LAUNCH_ERROR", "are a cuda manifest's");
  cpu.erase("requires");
  CHECK_THROWS(tiled::load(cubin, parse(cpu)), "LAUNCH_ERROR", "cannot load the CPU kernel library");
  std::string why;
  if (!tiled::CudaDevice::available(&why)) {  // a host without a driver: a clear refusal
    auto kernel = tiled::load(cubin, parse(j));
    alignas(16) static uint16_t a[64], c[1];
    alignas(16) static float b[64];
    CHECK_THROWS(kernel->launch({Tensor{a, {1, 64}, "float16"}, Tensor{b, {64}, "float32"}, 1.0,
                                 1, Tensor{c, {1}, "float16"}}),
                 "LAUNCH_ERROR", why);
    CHECK(why.find("libcuda.so.1") != std::string::npos || why.find("cuInit") != std::string::npos);
  }
}

int main(int argc, char** argv) { return check::run_tests(argc, argv); }

TEST(cpu_levels_refuse_what_the_host_lacks) {
  // /proc/cpuinfo of an AVX2 host without AVX-512 (x86-64-v3) and of an arm host with fp16.
  std::string v3 = "processor\t: 0\nflags\t\t: fpu cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3 "
                   "abm avx avx2 bmi1 bmi2 f16c fma movbe xsave\nprocessor\t: 1\n";
  tiled::HostCpu host = tiled::parse_cpuinfo(v3, "x86_64");
  CHECK_EQ(host.isa, std::string("x86_64"));
  CHECK_EQ(tiled::host_level(host), std::string("x86-64-v3"));
  tiled::check_runs_here("k", "x86-64-v3", host);
  tiled::check_runs_here("k", "generic", host);
  tiled::check_runs_here("k", "x86_64", host);  // an older manifest: the machine, baseline
  CHECK_THROWS(tiled::check_runs_here("k", "x86-64-v4", host), "LAUNCH_ERROR",
               "which needs avx512bw, avx512cd, avx512dq, avx512f, avx512vl; this host is "
               "cpu:x86-64-v3");
  CHECK_THROWS(tiled::check_runs_here("k", "aarch64+sve", host), "LAUNCH_ERROR",
               "a level of another ISA");
  // A Zen 4: AVX-512 with AVX512-BF16 (float32 -> bfloat16 by instruction).
  tiled::HostCpu zen4 = tiled::parse_cpuinfo(
      "flags\t\t: fpu cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3 abm avx avx2 bmi1 bmi2 f16c "
      "fma movbe xsave avx512f avx512bw avx512cd avx512dq avx512vl avx512_bf16\n", "x86_64");
  CHECK_EQ(tiled::host_level(zen4), std::string("x86-64-v4+bf16"));
  tiled::check_runs_here("k", "x86-64-v4", zen4);
  CHECK_THROWS(tiled::check_runs_here("k", "x86-64-v4+bf16", host), "LAUNCH_ERROR",
               "which needs avx512_bf16, avx512bw");
  tiled::HostCpu arm = tiled::parse_cpuinfo("Features\t: fp asimd fphp asimdhp\n", "arm64");
  CHECK_EQ(tiled::host_level(arm), std::string("aarch64+fp16"));
  CHECK_THROWS(tiled::check_runs_here("k", "aarch64+sve", arm), "LAUNCH_ERROR", "needs sve");
  CHECK_EQ(tiled::host_level(tiled::parse_cpuinfo("", "x86_64")), std::string("generic"));
}

TEST(load_checks_the_cpu_level_before_loading) {
  json j = cuda_manifest();
  std::string so = "not an elf";
  j["artifact_sha256"] = tiled::sha256_hex(so);
  json cpu = with(with(with(with(j, "backend", "cpu"), "target", "cpu:x86-64-v9"), "arch",
                       "x86-64-v9"), "artifact_format", "so");
  cpu["kernel_args"] = json::array();
  CHECK_THROWS(tiled::load(so, parse(cpu)), "LAUNCH_ERROR", "compiled for cpu:x86-64-v9");
}
