// Which daemon sockets the client trusts: the rules of tiled/client/socket_trust.py (the daemon
// sends shared libraries and cubins that this process loads and runs, so whoever can place or
// swap the socket chooses code that runs here). Refused: a socket, or its directory, owned by
// a user other than this process's effective user or root, or a symlink owned by such a user;
// a directory writable by group or others without the sticky bit. A socket not bound yet is
// left to gRPC (UNAVAILABLE, retried); its directory is checked all the same.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "tiled/client.h"

namespace tiled {
namespace {

const char* const kLoads = "the daemon sends shared libraries that this process loads";

std::string socket_path(const std::string& address) {
  if (address.compare(0, 5, "unix:") != 0) return "";
  std::string path = address.substr(5);
  return path.compare(0, 2, "//") == 0 ? path.substr(2) : path;
}

// os.path.abspath: absolute and lexically normalised, links not resolved.
std::string abspath(const std::string& path) {
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    char cwd[PATH_MAX];
    if (!::getcwd(cwd, sizeof cwd)) return path;
    full = std::string(cwd) + "/" + path;
  }
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= full.size()) {
    size_t end = full.find('/', start);
    if (end == std::string::npos) end = full.size();
    std::string part = full.substr(start, end - start);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    start = end + 1;
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

std::string dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string who(uid_t uid) {
  struct passwd pw, *found = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found)
    return std::string(found->pw_name) + " (uid " + std::to_string(uid) + ")";
  return "uid " + std::to_string(uid);
}

bool trusted(uid_t uid, uid_t euid) { return uid == euid || uid == 0; }

std::string neither(uid_t euid) {
  return euid == 0 ? "not root" : "neither this user, " + who(euid) + ", nor root";
}

Error untrusted(const std::string& message) { return Error("UNTRUSTED_SOCKET", message); }

}  // namespace

void refuse_untrusted_socket(const std::string& address) {
  std::string path = socket_path(address);
  if (path.empty()) return;
  uid_t euid = ::geteuid();
  path = abspath(path);
  std::string directory = dirname(path);
  struct stat dir_link {}, sock_link {};
  if (::lstat(directory.c_str(), &dir_link) != 0) return;  // gRPC reports it
  bool have_sock = true;
  if (::lstat(path.c_str(), &sock_link) != 0) {
    if (errno != ENOENT) return;
    have_sock = false;  // not bound yet: its directory is still checked
  }
  if (S_ISLNK(dir_link.st_mode) && !trusted(dir_link.st_uid, euid))
    throw untrusted("refusing the daemon socket " + path + ": its directory " + directory +
                    " is a symlink owned by " + who(dir_link.st_uid) + ", " + neither(euid) +
                    ": they could point it at another daemon; " + kLoads);
  if (have_sock && S_ISLNK(sock_link.st_mode) && !trusted(sock_link.st_uid, euid))
    throw untrusted("refusing the daemon socket " + path + ": it is a symlink owned by " +
                    who(sock_link.st_uid) + ", " + neither(euid) +
                    ": they could point it at another daemon; " + kLoads);
  struct stat dir_st = dir_link, sock_st = sock_link;
  if (S_ISLNK(dir_link.st_mode) || (have_sock && S_ISLNK(sock_link.st_mode))) {
    // the checks below are on what the links lead to
    char real[PATH_MAX];
    if (have_sock) {
      if (!::realpath(path.c_str(), real)) return;  // a dangling link: gRPC reports it
      path = real;
    } else {
      if (!::realpath(directory.c_str(), real)) return;
      path = std::string(real) + path.substr(path.rfind('/'));
    }
    directory = dirname(path);
    if (::stat(directory.c_str(), &dir_st) != 0) return;
    if (have_sock && ::stat(path.c_str(), &sock_st) != 0) return;
  }
  if (!trusted(dir_st.st_uid, euid))
    throw untrusted("refusing the daemon socket " + path + ": its directory " + directory +
                    " belongs to " + who(dir_st.st_uid) + ", " + neither(euid) +
                    ": they could replace the socket; " + kLoads +
                    ". Use a daemon whose socket is in a directory of your own");
  if ((dir_st.st_mode & 022) && !(dir_st.st_mode & S_ISVTX)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(dir_st.st_mode & 07777));
    throw untrusted("refusing the daemon socket " + path + ": its directory " + directory +
                    " is writable by group or others without the sticky bit (mode " + mode +
                    "), so another user could replace the socket; " + kLoads +
                    ". Run chmod go-w " + directory);
  }
  if (have_sock && !trusted(sock_st.st_uid, euid))
    throw untrusted("refusing the daemon socket " + path + ": it belongs to " +
                    who(sock_st.st_uid) + ", " + neither(euid) + "; " + kLoads +
                    ". Use a daemon of your own (tiled serve)");
}

}  // namespace tiled
