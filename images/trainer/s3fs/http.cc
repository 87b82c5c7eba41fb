#include "http.h"

#include <curl/curl.h>
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

namespace s3fs {
namespace {

struct EvpMd;  // OpenSSL's EVP_MD, used through a pointer only

struct Libraries {
  CURLcode (*global_init)(long);
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_perform)(CURL*);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  void (*easy_reset)(CURL*);
  void (*easy_cleanup)(CURL*);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
  unsigned char* (*sha256)(const unsigned char*, size_t, unsigned char*);
  const EvpMd* (*evp_sha256)();
  unsigned char* (*hmac)(const EvpMd*, const void*, int, const unsigned char*, size_t, unsigned char*,
                         unsigned int*);
};

Libraries libs;
std::once_flag load_once;
std::string load_error;

void* OpenFirst(const std::vector<const char*>& names, std::string* tried) {
  for (const char* name : names) {
    void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle != nullptr) return handle;
    *tried += std::string(tried->empty() ? "" : "; ") + dlerror();
  }
  return nullptr;
}

template <typename F>
bool Resolve(void* handle, const char* name, F* out, std::string* error) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr) *error = std::string("symbol ") + name + " not found";
  return *out != nullptr;
}

void Load() {
  std::string tried;
  void* curl = OpenFirst({"libcurl.so.4", "libcurl-gnutls.so.4"}, &tried);
  void* crypto = OpenFirst({"libcrypto.so.3", "libcrypto.so.1.1"}, &tried);
  if (curl == nullptr || crypto == nullptr) {
    load_error = "the S3 filesystem needs libcurl 4 and OpenSSL's libcrypto: " + tried;
    return;
  }
  std::string& e = load_error;
  bool ok = Resolve(curl, "curl_global_init", &libs.global_init, &e) &&
            Resolve(curl, "curl_easy_init", &libs.easy_init, &e) &&
            Resolve(curl, "curl_easy_setopt", &libs.easy_setopt, &e) &&
            Resolve(curl, "curl_easy_perform", &libs.easy_perform, &e) &&
            Resolve(curl, "curl_easy_getinfo", &libs.easy_getinfo, &e) &&
            Resolve(curl, "curl_easy_reset", &libs.easy_reset, &e) &&
            Resolve(curl, "curl_easy_cleanup", &libs.easy_cleanup, &e) &&
            Resolve(curl, "curl_easy_strerror", &libs.easy_strerror, &e) &&
            Resolve(curl, "curl_slist_append", &libs.slist_append, &e) &&
            Resolve(curl, "curl_slist_free_all", &libs.slist_free_all, &e) &&
            Resolve(crypto, "SHA256", &libs.sha256, &e) &&
            Resolve(crypto, "EVP_sha256", &libs.evp_sha256, &e) &&
            Resolve(crypto, "HMAC", &libs.hmac, &e);
  if (ok && libs.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) e = "curl_global_init failed";
}

// Easy handles kept between requests, so that their connections are reused.
std::mutex pool_mutex;
std::vector<CURL*> pool;

CURL* Acquire() {
  std::lock_guard<std::mutex> lock(pool_mutex);
  if (pool.empty()) return libs.easy_init();
  CURL* handle = pool.back();
  pool.pop_back();
  return handle;
}

void Release(CURL* handle) {
  libs.easy_reset(handle);
  std::lock_guard<std::mutex> lock(pool_mutex);
  pool.push_back(handle);
}

struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  CURL* handle;
  size_t sent = 0;
};

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = size * count;
  long status = 0;
  libs.easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  bool success = status >= 200 && status < 300;
  if (success && t->request->sink != nullptr) {
    size_t room = t->request->sink_size - t->response->sunk;
    if (n > room) return 0;  // more than asked for: abort the transfer
    memcpy(t->request->sink + t->response->sunk, data, n);
    t->response->sunk += n;
  } else {
    t->response->body.append(data, n);
  }
  return n;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<HttpResponse*>(user);
  std::string line(data, size * count);
  size_t colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    size_t start = line.find_first_not_of(" \t", colon + 1);
    size_t end = line.find_last_not_of(" \t\r\n");
    std::string value = start == std::string::npos || end < start ? "" : line.substr(start, end - start + 1);
    response->headers.emplace_back(name, value);
  }
  return size * count;
}

size_t OnUpload(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = std::min(size * count, t->request->body_size - t->sent);
  memcpy(buffer, t->request->body + t->sent, n);
  t->sent += n;
  return n;
}

void SetOptions(CURL* h, Transfer* t, curl_slist* headers, const HttpOptions& options) {
  const HttpRequest& r = *t->request;
  libs.easy_setopt(h, CURLOPT_URL, r.url.c_str());
  libs.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  libs.easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  libs.easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
  libs.easy_setopt(h, CURLOPT_WRITEDATA, t);
  libs.easy_setopt(h, CURLOPT_HEADERFUNCTION, OnHeader);
  libs.easy_setopt(h, CURLOPT_HEADERDATA, t->response);
  libs.easy_setopt(h, CURLOPT_CONNECTTIMEOUT, options.connect_timeout_seconds);
  libs.easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
  libs.easy_setopt(h, CURLOPT_LOW_SPEED_TIME, options.stall_timeout_seconds);
  if (!options.ca_bundle.empty()) libs.easy_setopt(h, CURLOPT_CAINFO, options.ca_bundle.c_str());
  if (r.method == "HEAD") {
    libs.easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    libs.easy_setopt(h, CURLOPT_UPLOAD, 1L);
    libs.easy_setopt(h, CURLOPT_READFUNCTION, OnUpload);
    libs.easy_setopt(h, CURLOPT_READDATA, t);
    libs.easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body_size));
    if (r.method == "POST") libs.easy_setopt(h, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method != "GET") {
    libs.easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
}

}  // namespace

std::string HttpResponse::header(const std::string& lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return "";
}

bool LoadLibraries(std::string* error) {
  std::call_once(load_once, Load);
  *error = load_error;
  return load_error.empty();
}

HttpResponse Perform(const HttpRequest& request, const HttpOptions& options) {
  HttpResponse response;
  CURL* handle = Acquire();
  if (handle == nullptr) {
    response.transport_error = "curl_easy_init failed";
    return response;
  }
  Transfer transfer{&request, &response, handle};
  curl_slist* headers = nullptr;
  for (const std::string& h : request.headers) headers = libs.slist_append(headers, h.c_str());
  // No "Expect: 100-continue" round trip before a body.
  headers = libs.slist_append(headers, "Expect:");
  SetOptions(handle, &transfer, headers, options);
  CURLcode code = libs.easy_perform(handle);
  if (code == CURLE_OK) {
    libs.easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &response.status);
  } else {
    response.status = 0;
    response.transport_error = libs.easy_strerror(code);
  }
  libs.slist_free_all(headers);
  Release(handle);
  return response;
}

std::string Sha256Hex(const char* data, size_t size) {
  unsigned char digest[32];
  libs.sha256(reinterpret_cast<const unsigned char*>(data), size, digest);
  return Hex(std::string(reinterpret_cast<char*>(digest), sizeof(digest)));
}

std::string HmacSha256(const std::string& key, const std::string& data) {
  unsigned char digest[32];
  unsigned int length = sizeof(digest);
  libs.hmac(libs.evp_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest, &length);
  return std::string(reinterpret_cast<char*>(digest), length);
}

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

}  // namespace s3fs
