// A few lines of test harness for the C++ client's test programs: TEST(name) registers a case,
// CHECK / CHECK_EQ / CHECK_THROWS record failures, run_tests() runs the cases named on the
// command line (all without names) and ends with "N passed, M failed".
#pragma once

#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tiled/errors.h"

namespace check {

struct Case {
  std::string name;
  std::function<void()> body;
};

inline std::vector<Case>& cases() {
  static std::vector<Case> all;
  return all;
}

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Register {
  Register(const char* name, std::function<void()> body) { cases().push_back({name, body}); }
};

inline std::string where(const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": ";
}

template <typename A, typename B>
void equal(const A& a, const B& b, const char* text, const char* file, int line) {
  if (a == b) return;
  std::ostringstream s;
  s << where(file, line) << text << ": " << a << " != " << b;
  throw Failure(s.str());
}

// Runs `fn`, which must throw a tiled::Error with code `code` whose what() contains `part`.
inline void throws(const std::function<void()>& fn, const std::string& code,
                   const std::string& part, const char* text, const char* file, int line) {
  try {
    fn();
  } catch (const tiled::Error& e) {
    if (e.code() != code || std::string(e.what()).find(part) == std::string::npos)
      throw Failure(where(file, line) + text + ": threw '" + e.what() + "', expected " + code +
                    " containing '" + part + "'");
    return;
  }
  throw Failure(where(file, line) + text + ": did not throw (expected " + code + ")");
}

inline int run_tests(int argc, char** argv) {
  int passed = 0, failed = 0;
  for (const Case& c : cases()) {
    bool wanted = argc < 2;
    for (int i = 1; i < argc; ++i) wanted = wanted || c.name == argv[i];
    if (!wanted) continue;
    try {
      c.body();
      ++passed;
      std::cout << "ok   " << c.name << std::endl;
    } catch (const std::exception& e) {
      ++failed;
      std::cout << "FAIL " << c.name << ": " << e.what() << std::endl;
    }
  }
  std::cout << passed << " passed, " << failed << " failed" << std::endl;
  return failed || !passed ? 1 : 0;
}

}  // namespace check

#define TEST(name)                                              \
  static void test_##name();                                    \
  static check::Register register_##name(#name, test_##name);   \
  static void test_##name()
#define CHECK(cond) \
  if (!(cond)) throw check::Failure(check::where(__FILE__, __LINE__) + #cond)
#define CHECK_EQ(a, b) check::equal((a), (b), #a " == " #b, __FILE__, __LINE__)
#define CHECK_THROWS(expr, code, part) \
  check::throws([&] { (void)(expr); }, code, part, #expr, __FILE__, __LINE__)
