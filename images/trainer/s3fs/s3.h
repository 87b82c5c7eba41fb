// A small S3 client: the requests a TensorFlow filesystem needs, signed with AWS Signature V4,
// against AWS S3 or any S3-compatible store.
//
// Configuration comes from the environment, under the AWS SDKs' names where they have one:
//   AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL   the store (default https://s3.<region>.amazonaws.com)
//   AWS_REGION or AWS_DEFAULT_REGION          the signing region (default us-east-1)
//   S3_ADDRESSING_STYLE                       path or virtual (default: virtual for AWS, path when an
//                                             endpoint is named)
//   AWS_CA_BUNDLE                             CA certificates for a store with a private CA
//   AWS_MAX_ATTEMPTS                          tries of a request that failed transiently (default 5)
//   S3_PART_SIZE_BYTES                        multipart upload and copy part size (default 32 MiB)
//   S3_SINGLE_COPY_LIMIT_BYTES                larger objects are copied in parts (default 5 GiB)
//   S3_LOG_REQUESTS=1                         one line on stderr per request (method, object, status)
// Credentials, first found: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN);
// AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN (a Kubernetes ServiceAccount token exchanged at STS,
// AWS_ENDPOINT_URL_STS); AWS_CONTAINER_CREDENTIALS_FULL_URI (with AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE
// or _TOKEN); else requests go unsigned (public buckets).
#ifndef PSTRAINER_S3FS_S3_H_
#define PSTRAINER_S3FS_S3_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "http.h"
#include "tensorflow/c/tf_status.h"

namespace s3fs {

struct Status {
  TF_Code code = TF_OK;
  std::string message;
  bool ok() const { return code == TF_OK; }
};

struct Config {
  std::string endpoint;  // scheme://host[:port]
  std::string region = "us-east-1";
  bool path_style = false;
  int max_attempts = 5;
  uint64_t part_size = 32ull << 20;
  uint64_t single_copy_limit = 5ull << 30;
  bool log_requests = false;
  HttpOptions http;

  static Status FromEnvironment(Config* config);
};

struct Credentials {
  std::string access_key, secret_key, session_token;
  int64_t expires_at = 0;  // Unix seconds; 0: never
};

// What a request signs; pure, so that it can be checked against AWS's published examples.
struct SigningInput {
  std::string method, canonical_uri, canonical_query;
  std::map<std::string, std::string> headers;  // lower-case names; host and x-amz-date among them
  std::string payload_hash, region, service, amz_date;  // amz_date: YYYYMMDDTHHMMSSZ
};
std::string Authorization(const SigningInput& input, const Credentials& credentials);
std::string UriEncode(const std::string& text, bool keep_slash);

struct ObjectInfo {
  uint64_t size = 0;
  int64_t mtime_nsec = 0;
};

struct Listing {
  std::vector<std::string> keys;      // objects under the prefix
  std::vector<std::string> prefixes;  // common prefixes, when listed with a delimiter
};

class Client {
 public:
  explicit Client(Config config) : config_(std::move(config)) {}

  Status HeadBucket(const std::string& bucket);
  Status HeadObject(const std::string& bucket, const std::string& key, ObjectInfo* info);
  // Reads [offset, offset + size) into buffer; *got is what came (less at the end of the object).
  Status GetRange(const std::string& bucket, const std::string& key, uint64_t offset, size_t size,
                  char* buffer, size_t* got);
  Status Put(const std::string& bucket, const std::string& key, const char* data, size_t size);
  Status Delete(const std::string& bucket, const std::string& key);
  // Up to max_keys entries (0: all, page by page); with a delimiter, the prefixes one level down.
  Status List(const std::string& bucket, const std::string& prefix, bool delimited, int max_keys,
              Listing* listing);
  Status Copy(const std::string& bucket, const std::string& from, const std::string& to, uint64_t size);

  Status CreateUpload(const std::string& bucket, const std::string& key, std::string* upload_id);
  Status UploadPart(const std::string& bucket, const std::string& key, const std::string& upload_id,
                    int number, const char* data, size_t size, std::string* etag);
  Status CompleteUpload(const std::string& bucket, const std::string& key, const std::string& upload_id,
                        const std::vector<std::string>& etags);
  void AbortUpload(const std::string& bucket, const std::string& key, const std::string& upload_id);

  const Config& config() const { return config_; }

 private:
  struct Call {
    std::string method, bucket, key;
    std::map<std::string, std::string> query;
    std::map<std::string, std::string> headers;  // extra, signed
    const char* body = nullptr;
    size_t body_size = 0;
    char* sink = nullptr;
    size_t sink_size = 0;
  };
  // Signs and sends, retrying transient failures; the status says what failed, for `what`.
  Status Send(const Call& call, HttpResponse* response);
  HttpResponse SendOnce(const Call& call, const Credentials* credentials);
  Status CopyInParts(const std::string& bucket, const std::string& from, const std::string& to,
                     uint64_t size);
  bool GetCredentials(Credentials* credentials, std::string* error);

  Config config_;
  std::mutex credentials_mutex_;
  Credentials credentials_;
  bool have_credentials_ = false;
};

// The inner texts of every <tag>...</tag> in xml, entities decoded.
std::vector<std::string> XmlElements(const std::string& xml, const std::string& tag);

}  // namespace s3fs

#endif  // PSTRAINER_S3FS_S3_H_
