#include "s3.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace s3fs {
namespace {

const char kEmptySha256[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// Credentials that expire are renewed this long before they do.
const int64_t kRenewSeconds = 300;

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

std::string FirstEnv(std::initializer_list<const char*> names) {
  for (const char* name : names) {
    std::string value = Env(name);
    if (!value.empty()) return value;
  }
  return "";
}

bool ParseUint(const std::string& text, uint64_t* out) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::strtoull(text.c_str(), nullptr, 10);
  return true;
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string AmzDate(int64_t now) {
  time_t t = static_cast<time_t>(now);
  struct tm utc;
  gmtime_r(&t, &utc);
  char text[17];
  strftime(text, sizeof(text), "%Y%m%dT%H%M%SZ", &utc);
  return text;
}

// ISO 8601 (2026-12-07T13:00:00Z) or HTTP dates (Mon, 07 Dec 2026 13:00:00 GMT) to Unix seconds.
int64_t ParseTime(const std::string& text) {
  struct tm t = {};
  if (strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &t) == nullptr &&
      strptime(text.c_str(), "%a, %d %b %Y %H:%M:%S", &t) == nullptr) {
    return 0;
  }
  return static_cast<int64_t>(timegm(&t));
}

std::string XmlDecode(const std::string& text) {
  static const std::pair<const char*, char> kEntities[] = {
      {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
  std::string out;
  for (size_t i = 0; i < text.size();) {
    bool done = false;
    if (text[i] == '&') {
      for (const auto& [entity, c] : kEntities) {
        if (text.compare(i, strlen(entity), entity) == 0) {
          out.push_back(c);
          i += strlen(entity);
          done = true;
          break;
        }
      }
      size_t end = text.find(';', i);
      if (!done && text.compare(i, 2, "&#") == 0 && end != std::string::npos) {
        bool hex = text[i + 2] == 'x';
        long code = std::strtol(text.substr(i + (hex ? 3 : 2), end).c_str(), nullptr, hex ? 16 : 10);
        if (code > 0 && code < 128) out.push_back(static_cast<char>(code));
        i = end + 1;
        done = true;
      }
    }
    if (!done) out.push_back(text[i++]);
  }
  return out;
}

// A JSON string member of a flat object, for the container credentials endpoint's answer.
std::string JsonString(const std::string& json, const std::string& name) {
  size_t at = json.find("\"" + name + "\"");
  if (at == std::string::npos) return "";
  size_t open = json.find('"', json.find(':', at) + 1);
  size_t close = json.find('"', open + 1);
  return open == std::string::npos || close == std::string::npos ? "" : json.substr(open + 1, close - open - 1);
}

TF_Code CodeOfHttp(long status) {
  switch (status) {
    case 400: return TF_INVALID_ARGUMENT;
    case 401: return TF_UNAUTHENTICATED;
    case 403: return TF_PERMISSION_DENIED;
    case 404: return TF_NOT_FOUND;
    case 409:
    case 412: return TF_FAILED_PRECONDITION;
    case 416: return TF_OUT_OF_RANGE;
    default: return status >= 500 || status == 429 ? TF_UNAVAILABLE : TF_UNKNOWN;
  }
}

bool Transient(const HttpResponse& r) {
  if (r.status == 0 || r.status >= 500 || r.status == 429) return true;
  std::vector<std::string> codes = XmlElements(r.body, "Code");
  return !codes.empty() && (codes[0] == "RequestTimeout" || codes[0] == "SlowDown");
}

std::string Describe(const HttpResponse& r) {
  if (r.status == 0) return "no answer: " + r.transport_error;
  std::vector<std::string> codes = XmlElements(r.body, "Code");
  std::vector<std::string> messages = XmlElements(r.body, "Message");
  std::string text = "HTTP " + std::to_string(r.status);
  if (!codes.empty()) text += " " + codes[0];
  if (!messages.empty()) text += ": " + messages[0];
  if (codes.empty() && r.status == 403) text += " (access denied: check the credentials and the bucket's policy)";
  if (codes.empty() && r.status == 404) text += " (not found)";
  return text;
}

std::string ObjectUrl(const std::string& bucket, const std::string& key) {
  return "s3://" + bucket + (key.empty() ? "" : "/" + key);
}

}  // namespace

std::string UriEncode(const std::string& text, bool keep_slash) {
  static const char kDigits[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'%', kDigits[c >> 4], kDigits[c & 15]};
    }
  }
  return out;
}

std::vector<std::string> XmlElements(const std::string& xml, const std::string& tag) {
  std::vector<std::string> found;
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  for (size_t at = xml.find(open); at != std::string::npos; at = xml.find(open, at)) {
    size_t start = at + open.size();
    size_t end = xml.find(close, start);
    if (end == std::string::npos) break;
    found.push_back(XmlDecode(xml.substr(start, end - start)));
    at = end + close.size();
  }
  return found;
}

std::string Authorization(const SigningInput& in, const Credentials& credentials) {
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : in.headers) {
    canonical_headers += name + ":" + value + "\n";
    signed_headers += (signed_headers.empty() ? "" : ";") + name;
  }
  std::string request = in.method + "\n" + in.canonical_uri + "\n" + in.canonical_query + "\n" +
                        canonical_headers + "\n" + signed_headers + "\n" + in.payload_hash;
  std::string day = in.amz_date.substr(0, 8);
  std::string scope = day + "/" + in.region + "/" + in.service + "/aws4_request";
  std::string to_sign = "AWS4-HMAC-SHA256\n" + in.amz_date + "\n" + scope + "\n" +
                        Sha256Hex(request.data(), request.size());
  std::string key = HmacSha256("AWS4" + credentials.secret_key, day);
  key = HmacSha256(HmacSha256(HmacSha256(key, in.region), in.service), "aws4_request");
  return "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" + scope +
         ", SignedHeaders=" + signed_headers + ", Signature=" + Hex(HmacSha256(key, to_sign));
}

Status Config::FromEnvironment(Config* c) {
  std::string error;
  if (!LoadLibraries(&error)) return {TF_FAILED_PRECONDITION, error};
  c->region = FirstEnv({"AWS_REGION", "AWS_DEFAULT_REGION"});
  if (c->region.empty()) c->region = "us-east-1";
  c->endpoint = FirstEnv({"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"});
  bool named = !c->endpoint.empty();
  if (!named) c->endpoint = "https://s3." + c->region + ".amazonaws.com";
  while (!c->endpoint.empty() && c->endpoint.back() == '/') c->endpoint.pop_back();
  if (c->endpoint.rfind("http://", 0) != 0 && c->endpoint.rfind("https://", 0) != 0) {
    return {TF_INVALID_ARGUMENT, "S3 endpoint " + c->endpoint + ": expected http://host[:port] or https://..."};
  }
  std::string style = Env("S3_ADDRESSING_STYLE");
  if (!style.empty() && style != "path" && style != "virtual") {
    return {TF_INVALID_ARGUMENT, "S3_ADDRESSING_STYLE=" + style + ": expected path or virtual"};
  }
  c->path_style = style.empty() ? named : style == "path";
  c->http.ca_bundle = Env("AWS_CA_BUNDLE");
  c->log_requests = Env("S3_LOG_REQUESTS") == "1";
  uint64_t number = 0;
  const std::pair<const char*, uint64_t*> sizes[] = {{"S3_PART_SIZE_BYTES", &c->part_size},
                                                     {"S3_SINGLE_COPY_LIMIT_BYTES", &c->single_copy_limit}};
  for (const auto& [name, target] : sizes) {
    std::string text = Env(name);
    if (text.empty()) continue;
    if (!ParseUint(text, &number) || number < (5u << 20)) {
      return {TF_INVALID_ARGUMENT, std::string(name) + "=" + text + ": expected a number of bytes >= 5 MiB"};
    }
    *target = number;
  }
  std::string attempts = Env("AWS_MAX_ATTEMPTS");
  if (!attempts.empty()) {
    if (!ParseUint(attempts, &number) || number < 1 || number > 100) {
      return {TF_INVALID_ARGUMENT, "AWS_MAX_ATTEMPTS=" + attempts + ": expected 1 to 100"};
    }
    c->max_attempts = static_cast<int>(number);
  }
  return {};
}

// Credentials from the environment, a web identity token exchanged at STS, or the container
// credentials endpoint; false with the reason when the way named fails.
bool FetchCredentials(const Config& config, Credentials* out, bool* anonymous, std::string* error) {
  *anonymous = false;
  out->access_key = Env("AWS_ACCESS_KEY_ID");
  out->secret_key = Env("AWS_SECRET_ACCESS_KEY");
  out->session_token = Env("AWS_SESSION_TOKEN");
  out->expires_at = 0;
  if (!out->access_key.empty() && !out->secret_key.empty()) return true;
  HttpRequest request;
  std::string token_file = Env("AWS_WEB_IDENTITY_TOKEN_FILE"), full_uri = Env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (!token_file.empty()) {
    std::ifstream file(token_file);
    std::stringstream token;
    token << file.rdbuf();
    if (!file) {
      *error = "cannot read AWS_WEB_IDENTITY_TOKEN_FILE " + token_file;
      return false;
    }
    std::string session = Env("AWS_ROLE_SESSION_NAME");
    std::string sts = Env("AWS_ENDPOINT_URL_STS");
    request.method = "POST";
    request.url = sts.empty() ? "https://sts." + config.region + ".amazonaws.com/" : sts;
    request.headers = {"Content-Type: application/x-www-form-urlencoded"};
    std::string body = "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=" +
                       UriEncode(Env("AWS_ROLE_ARN"), false) + "&RoleSessionName=" +
                       UriEncode(session.empty() ? "pstrainer" : session, false) +
                       "&WebIdentityToken=" + UriEncode(token.str(), false);
    request.body = body.data();
    request.body_size = body.size();
    HttpResponse r = Perform(request, config.http);
    if (r.status != 200) {
      *error = "AssumeRoleWithWebIdentity at " + request.url + ": " + Describe(r);
      return false;
    }
    auto first = [&](const char* tag) {
      std::vector<std::string> v = XmlElements(r.body, tag);
      return v.empty() ? std::string() : v[0];
    };
    out->access_key = first("AccessKeyId");
    out->secret_key = first("SecretAccessKey");
    out->session_token = first("SessionToken");
    out->expires_at = ParseTime(first("Expiration"));
  } else if (!full_uri.empty()) {
    std::string authorization = Env("AWS_CONTAINER_AUTHORIZATION_TOKEN");
    std::string authorization_file = Env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    if (!authorization_file.empty()) {
      std::ifstream file(authorization_file);
      std::getline(file, authorization);
    }
    request.method = "GET";
    request.url = full_uri;
    if (!authorization.empty()) request.headers = {"Authorization: " + authorization};
    HttpResponse r = Perform(request, config.http);
    if (r.status != 200) {
      *error = "container credentials at " + full_uri + ": " + Describe(r);
      return false;
    }
    out->access_key = JsonString(r.body, "AccessKeyId");
    out->secret_key = JsonString(r.body, "SecretAccessKey");
    out->session_token = JsonString(r.body, "Token");
    out->expires_at = ParseTime(JsonString(r.body, "Expiration"));
  } else {
    *anonymous = true;
    return true;
  }
  if (out->access_key.empty() || out->secret_key.empty()) {
    *error = "the credentials answer held no access key";
    return false;
  }
  return true;
}

bool Client::GetCredentials(Credentials* credentials, std::string* error) {
  std::lock_guard<std::mutex> lock(credentials_mutex_);
  bool fresh = have_credentials_ &&
               (credentials_.expires_at == 0 || credentials_.expires_at - Now() > kRenewSeconds);
  if (!fresh) {
    bool anonymous = false;
    if (!FetchCredentials(config_, &credentials_, &anonymous, error)) return false;
    have_credentials_ = true;
    if (anonymous) credentials_ = Credentials{};
  }
  *credentials = credentials_;
  return true;
}

HttpResponse Client::SendOnce(const Call& call, const Credentials* credentials) {
  // Path style: endpoint/bucket/key; virtual-hosted: bucket.endpoint-host/key.
  size_t host_start = config_.endpoint.find("://") + 3;
  std::string scheme = config_.endpoint.substr(0, host_start);
  std::string host = config_.endpoint.substr(host_start);
  std::string path = "/" + UriEncode(call.key, true);
  if (config_.path_style) {
    path = "/" + call.bucket + (call.key.empty() ? "" : path);
  } else {
    host = call.bucket + "." + host;
  }
  std::string query;
  for (const auto& [name, value] : call.query) {
    query += (query.empty() ? "" : "&") + UriEncode(name, false) + "=" + UriEncode(value, false);
  }
  int64_t now = Now();
  SigningInput in{call.method, path, query, call.headers, "", config_.region, "s3", AmzDate(now)};
  in.payload_hash = call.body_size == 0 ? kEmptySha256 : Sha256Hex(call.body, call.body_size);
  in.headers["host"] = host;
  in.headers["x-amz-date"] = in.amz_date;
  in.headers["x-amz-content-sha256"] = in.payload_hash;
  if (credentials != nullptr && !credentials->session_token.empty()) {
    in.headers["x-amz-security-token"] = credentials->session_token;
  }
  HttpRequest request{call.method, scheme + host + path + (query.empty() ? "" : "?" + query)};
  for (const auto& [name, value] : in.headers) {
    if (name != "host") request.headers.push_back(name + ": " + value);
  }
  if (credentials != nullptr && !credentials->access_key.empty()) {
    request.headers.push_back("Authorization: " + Authorization(in, *credentials));
  }
  request.body = call.body;
  request.body_size = call.body_size;
  request.sink = call.sink;
  request.sink_size = call.sink_size;
  return Perform(request, config_.http);
}

Status Client::Send(const Call& call, HttpResponse* response) {
  std::string what = call.method + " " + ObjectUrl(call.bucket, call.key);
  std::string error;
  Credentials credentials;
  if (!GetCredentials(&credentials, &error)) return {TF_UNAUTHENTICATED, what + ": " + error};
  std::mt19937 random(std::random_device{}());
  for (int attempt = 1;; ++attempt) {
    *response = SendOnce(call, &credentials);
    if (config_.log_requests) {
      fprintf(stderr, "s3: %s -> %ld, %zu bytes sent, %zu received\n", what.c_str(), response->status,
              call.body_size, response->sunk + response->body.size());
    }
    if (response->status >= 200 && response->status < 300) return {};
    if (!Transient(*response) || attempt >= config_.max_attempts) break;
    // Exponential backoff with jitter: 0.1 s, 0.2 s, ... at most 5 s.
    int64_t ceiling = std::min<int64_t>(5000, 100ll << std::min(attempt - 1, 6));
    int64_t pause = ceiling / 2 + static_cast<int64_t>(random() % (ceiling / 2 + 1));
    fprintf(stderr, "s3: %s: %s; try %d of %d in %lld ms\n", what.c_str(), Describe(*response).c_str(),
            attempt + 1, config_.max_attempts, static_cast<long long>(pause));
    std::this_thread::sleep_for(std::chrono::milliseconds(pause));
  }
  if (call.method == "HEAD" && response->status >= 400 && response->status != 404) {
    // An answer to HEAD has no body: the same read as a GET brings the store's reason.
    Call get = call;
    get.method = "GET";
    if (call.key.empty()) get.query = {{"list-type", "2"}, {"max-keys", "1"}};
    else get.headers["range"] = "bytes=0-0";
    HttpResponse explained = SendOnce(get, &credentials);
    if (explained.status == response->status) *response = explained;
  }
  TF_Code code = response->status == 0 ? TF_UNAVAILABLE : CodeOfHttp(response->status);
  std::vector<std::string> codes = XmlElements(response->body, "Code");
  if (!codes.empty() && (codes[0] == "InvalidAccessKeyId" || codes[0] == "SignatureDoesNotMatch")) {
    code = TF_PERMISSION_DENIED;
  }
  return {code, what + " at " + config_.endpoint + ": " + Describe(*response)};
}

Status Client::HeadBucket(const std::string& bucket) {
  HttpResponse r;
  Status s = Send({"HEAD", bucket, ""}, &r);
  if (s.code == TF_NOT_FOUND) s.message = "bucket " + bucket + " does not exist at " + config_.endpoint;
  return s;
}

Status Client::HeadObject(const std::string& bucket, const std::string& key, ObjectInfo* info) {
  HttpResponse r;
  Status s = Send({"HEAD", bucket, key}, &r);
  if (!s.ok()) return s;
  uint64_t size = 0;
  ParseUint(r.header("content-length"), &size);
  info->size = size;
  info->mtime_nsec = ParseTime(r.header("last-modified")) * 1000000000ll;
  return {};
}

Status Client::GetRange(const std::string& bucket, const std::string& key, uint64_t offset, size_t size,
                        char* buffer, size_t* got) {
  Call call{"GET", bucket, key};
  call.headers["range"] = "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + size - 1);
  call.sink = buffer;
  call.sink_size = size;
  HttpResponse r;
  Status s = Send(call, &r);
  *got = r.sunk;
  return s;
}

Status Client::Put(const std::string& bucket, const std::string& key, const char* data, size_t size) {
  Call call{"PUT", bucket, key};
  call.body = data;
  call.body_size = size;
  HttpResponse r;
  return Send(call, &r);
}

Status Client::Delete(const std::string& bucket, const std::string& key) {
  HttpResponse r;
  return Send({"DELETE", bucket, key}, &r);
}

Status Client::List(const std::string& bucket, const std::string& prefix, bool delimited, int max_keys,
                    Listing* listing) {
  Call call{"GET", bucket, ""};
  call.query = {{"list-type", "2"}, {"prefix", prefix}};
  if (delimited) call.query["delimiter"] = "/";
  if (max_keys > 0) call.query["max-keys"] = std::to_string(max_keys);
  for (;;) {
    HttpResponse r;
    Status s = Send(call, &r);
    if (s.code == TF_NOT_FOUND) s.message = "bucket " + bucket + " does not exist at " + config_.endpoint;
    if (!s.ok()) return s;
    for (const std::string& contents : XmlElements(r.body, "Contents")) {
      for (const std::string& key : XmlElements(contents, "Key")) listing->keys.push_back(key);
    }
    for (const std::string& common : XmlElements(r.body, "CommonPrefixes")) {
      for (const std::string& p : XmlElements(common, "Prefix")) listing->prefixes.push_back(p);
    }
    std::vector<std::string> truncated = XmlElements(r.body, "IsTruncated");
    std::vector<std::string> token = XmlElements(r.body, "NextContinuationToken");
    if (max_keys > 0 || truncated.empty() || truncated[0] != "true" || token.empty()) return {};
    call.query["continuation-token"] = token[0];
  }
}

Status Client::Copy(const std::string& bucket, const std::string& from, const std::string& to, uint64_t size) {
  if (size > config_.single_copy_limit) return CopyInParts(bucket, from, to, size);
  Call call{"PUT", bucket, to};
  call.headers["x-amz-copy-source"] = "/" + bucket + "/" + UriEncode(from, true);
  HttpResponse r;
  Status s = Send(call, &r);
  // A copy can fail after its 200: the error is then in the body.
  if (s.ok() && !XmlElements(r.body, "Error").empty()) s = {TF_UNAVAILABLE, "copy to " + to + ": " + r.body};
  return s;
}

Status Client::CopyInParts(const std::string& bucket, const std::string& from, const std::string& to,
                           uint64_t size) {
  std::string upload_id;
  Status s = CreateUpload(bucket, to, &upload_id);
  if (!s.ok()) return s;
  std::vector<std::string> etags;
  for (uint64_t offset = 0; offset < size && s.ok(); offset += config_.part_size) {
    uint64_t last = std::min(size, offset + config_.part_size) - 1;
    Call call{"PUT", bucket, to};
    call.query = {{"partNumber", std::to_string(etags.size() + 1)}, {"uploadId", upload_id}};
    call.headers["x-amz-copy-source"] = "/" + bucket + "/" + UriEncode(from, true);
    call.headers["x-amz-copy-source-range"] = "bytes=" + std::to_string(offset) + "-" + std::to_string(last);
    HttpResponse r;
    s = Send(call, &r);
    std::vector<std::string> etag = XmlElements(r.body, "ETag");
    if (s.ok() && etag.empty()) s = {TF_UNAVAILABLE, "copy of part " + std::to_string(etags.size() + 1) + ": " + r.body};
    if (s.ok()) etags.push_back(etag[0]);
  }
  if (s.ok()) s = CompleteUpload(bucket, to, upload_id, etags);
  if (!s.ok()) AbortUpload(bucket, to, upload_id);
  return s;
}

Status Client::CreateUpload(const std::string& bucket, const std::string& key, std::string* upload_id) {
  Call call{"POST", bucket, key};
  call.query = {{"uploads", ""}};
  HttpResponse r;
  Status s = Send(call, &r);
  std::vector<std::string> id = XmlElements(r.body, "UploadId");
  if (s.ok() && id.empty()) return {TF_UNAVAILABLE, "no UploadId for " + ObjectUrl(bucket, key)};
  if (s.ok()) *upload_id = id[0];
  return s;
}

Status Client::UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                          int number, const char* data, size_t size, std::string* etag) {
  Call call{"PUT", bucket, key};
  call.query = {{"partNumber", std::to_string(number)}, {"uploadId", upload_id}};
  call.body = data;
  call.body_size = size;
  HttpResponse r;
  Status s = Send(call, &r);
  *etag = r.header("etag");
  return s;
}

Status Client::CompleteUpload(const std::string& bucket, const std::string& key, const std::string& upload_id,
                              const std::vector<std::string>& etags) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] + "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  Call call{"POST", bucket, key};
  call.query = {{"uploadId", upload_id}};
  call.body = xml.data();
  call.body_size = xml.size();
  HttpResponse r;
  Status s = Send(call, &r);
  if (s.ok() && !XmlElements(r.body, "Error").empty()) s = {TF_UNAVAILABLE, "completing " + key + ": " + r.body};
  return s;
}

void Client::AbortUpload(const std::string& bucket, const std::string& key, const std::string& upload_id) {
  Call call{"DELETE", bucket, key};
  call.query = {{"uploadId", upload_id}};
  HttpResponse r;
  Send(call, &r);
}

}  // namespace s3fs
