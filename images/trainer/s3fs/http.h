// HTTP and hashing for the S3 filesystem plugin, through the system's libcurl and libcrypto.
//
// TensorFlow's own library exports the curl and BoringSSL it bundles for its GCS filesystem, and
// those symbols come first in the process's global scope: a plugin linked against the system's
// libcurl would be bound to TensorFlow's copy, and that libcurl's libssl calls to BoringSSL. So
// both libraries are opened here with RTLD_DEEPBIND, which binds them (and what they load) to
// their own dependencies, and reached through function pointers only.
#ifndef PSTRAINER_S3FS_HTTP_H_
#define PSTRAINER_S3FS_HTTP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace s3fs {

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  const char* body = nullptr;
  size_t body_size = 0;
  // A successful (2xx) response body goes here when set (at most sink_size bytes), else into
  // HttpResponse::body; an error's body always goes into HttpResponse::body.
  char* sink = nullptr;
  size_t sink_size = 0;
};

struct HttpResponse {
  long status = 0;            // 0 when the request never got an answer
  std::string transport_error;  // why not, then
  std::string body;
  size_t sunk = 0;  // bytes written to the request's sink
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case

  std::string header(const std::string& lower_name) const;
};

struct HttpOptions {
  std::string ca_bundle;  // CA certificates to trust instead of the system's, if set
  long connect_timeout_seconds = 10;
  // A transfer slower than 1 byte/s for this long is abandoned.
  long stall_timeout_seconds = 60;
};

// Loads libcurl and libcrypto once; false with the reason when either is missing.
bool LoadLibraries(std::string* error);

// One request; connections are kept for the next (a pool of handles).
HttpResponse Perform(const HttpRequest& request, const HttpOptions& options);

std::string Sha256Hex(const char* data, size_t size);
std::string HmacSha256(const std::string& key, const std::string& data);  // raw bytes
std::string Hex(const std::string& bytes);

}  // namespace s3fs

#endif  // PSTRAINER_S3FS_HTTP_H_
