// TensorFlow's modular filesystem plugin for s3:// (tensorflow/c/experimental/filesystem): only
// the C interface, whose ABI TensorFlow keeps across 2.x releases, and no TensorFlow C++ symbol.
//
// An object store has no directories and no rename. Here:
//  - a directory is a prefix: it exists when an object "dir/" (a marker, which create_dir writes)
//    or any object under "dir/" does;
//  - a file written is uploaded in parts as it is appended to and appears, whole, only when it is
//    closed (a multipart upload completed), so no reader ever sees half of it;
//  - a rename is a server-side copy then a delete: the data does not pass through this process,
//    and the destination appears whole.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "s3.h"
#include "tensorflow/c/experimental/filesystem/filesystem_interface.h"

namespace s3fs {
namespace {

void SetStatus(TF_Status* status, const Status& s) { TF_SetStatus(status, s.code, s.message.c_str()); }

Client* ClientOf(const TF_Filesystem* filesystem) { return static_cast<Client*>(filesystem->plugin_filesystem); }

struct Path {
  std::string bucket, key;  // key without a trailing slash; "" for the bucket itself
  std::string dir_prefix() const { return key.empty() ? "" : key + "/"; }
};

bool ParsePath(const char* path, Path* out, TF_Status* status) {
  std::string text(path);
  const std::string scheme = "s3://";
  if (text.rfind(scheme, 0) != 0 || text.size() == scheme.size() || text[scheme.size()] == '/') {
    TF_SetStatus(status, TF_INVALID_ARGUMENT, (text + ": expected s3://bucket/path").c_str());
    return false;
  }
  size_t slash = text.find('/', scheme.size());
  out->bucket = text.substr(scheme.size(), slash == std::string::npos ? std::string::npos : slash - scheme.size());
  out->key = slash == std::string::npos ? "" : text.substr(slash + 1);
  while (!out->key.empty() && out->key.back() == '/') out->key.pop_back();
  return true;
}

enum class Kind { kMissing, kFile, kDirectory };

// What a path is: a bucket, an object, or a prefix with objects under it.
Status Lookup(Client* client, const Path& p, Kind* kind, ObjectInfo* info) {
  *kind = Kind::kMissing;
  if (p.key.empty()) {
    Status s = client->HeadBucket(p.bucket);
    if (s.ok()) *kind = Kind::kDirectory;
    return s;
  }
  Status s = client->HeadObject(p.bucket, p.key, info);
  if (s.ok()) {
    *kind = Kind::kFile;
    return s;
  }
  if (s.code != TF_NOT_FOUND) return s;
  Listing listing;
  s = client->List(p.bucket, p.dir_prefix(), false, 1, &listing);
  if (s.ok() && !listing.keys.empty()) *kind = Kind::kDirectory;
  return s;
}

Status NotFound(const char* path) { return {TF_NOT_FOUND, std::string(path) + " does not exist"}; }

// Filesystem

void Init(TF_Filesystem* filesystem, TF_Status* status) {
  Config config;
  Status s = Config::FromEnvironment(&config);
  filesystem->plugin_filesystem = s.ok() ? new Client(std::move(config)) : nullptr;
  SetStatus(status, s);
}

void Cleanup(TF_Filesystem* filesystem) { delete ClientOf(filesystem); }

void Stat(const TF_Filesystem* filesystem, const char* path, TF_FileStatistics* stats, TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return;
  Kind kind;
  ObjectInfo info;
  Status s = Lookup(ClientOf(filesystem), p, &kind, &info);
  if (s.ok() && kind == Kind::kMissing) s = NotFound(path);
  if (s.ok()) {
    stats->length = kind == Kind::kFile ? static_cast<int64_t>(info.size) : 0;
    stats->mtime_nsec = info.mtime_nsec;
    stats->is_directory = kind == Kind::kDirectory;
  }
  SetStatus(status, s);
}

void PathExists(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  TF_FileStatistics stats;
  Stat(filesystem, path, &stats, status);
}

bool IsDirectory(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  TF_FileStatistics stats;
  Stat(filesystem, path, &stats, status);
  if (TF_GetCode(status) != TF_OK) return false;
  if (!stats.is_directory) TF_SetStatus(status, TF_FAILED_PRECONDITION, (std::string(path) + " is a file").c_str());
  return stats.is_directory;
}

int64_t GetFileSize(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  TF_FileStatistics stats;
  Stat(filesystem, path, &stats, status);
  if (TF_GetCode(status) != TF_OK) return -1;
  if (stats.is_directory) {
    TF_SetStatus(status, TF_FAILED_PRECONDITION, (std::string(path) + " is a directory").c_str());
    return -1;
  }
  return stats.length;
}

void CreateDir(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return;
  Client* client = ClientOf(filesystem);
  Kind kind;
  ObjectInfo info;
  Status s = Lookup(client, p, &kind, &info);
  if (s.ok() && kind != Kind::kMissing) s = {TF_ALREADY_EXISTS, std::string(path) + " exists"};
  // The bucket itself must be there; a missing one is an error, never created here.
  if (s.ok()) s = client->HeadBucket(p.bucket);
  if (s.ok()) s = client->Put(p.bucket, p.dir_prefix(), nullptr, 0);
  SetStatus(status, s);
}

void RecursivelyCreateDir(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  CreateDir(filesystem, path, status);
  if (TF_GetCode(status) == TF_ALREADY_EXISTS) TF_SetStatus(status, TF_OK, "");
}

void DeleteFile(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return;
  Client* client = ClientOf(filesystem);
  ObjectInfo info;
  // S3 deletes a missing key without complaint; TensorFlow expects NOT_FOUND.
  Status s = p.key.empty() ? Status{TF_FAILED_PRECONDITION, std::string(path) + " is a bucket"}
                           : client->HeadObject(p.bucket, p.key, &info);
  if (s.ok()) s = client->Delete(p.bucket, p.key);
  SetStatus(status, s);
}

void DeleteDir(const TF_Filesystem* filesystem, const char* path, TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return;
  if (p.key.empty()) {
    TF_SetStatus(status, TF_FAILED_PRECONDITION, (std::string(path) + ": a bucket is not deleted").c_str());
    return;
  }
  Client* client = ClientOf(filesystem);
  Listing listing;
  Status s = client->List(p.bucket, p.dir_prefix(), false, 2, &listing);
  bool marker_only = listing.keys.size() == 1 && listing.keys[0] == p.dir_prefix();
  if (s.ok() && listing.keys.empty()) s = NotFound(path);
  if (s.ok() && !marker_only) s = {TF_FAILED_PRECONDITION, std::string(path) + " is not empty"};
  if (s.ok()) s = client->Delete(p.bucket, p.dir_prefix());
  SetStatus(status, s);
}

void DeleteRecursively(const TF_Filesystem* filesystem, const char* path, uint64_t* undeleted_files,
                       uint64_t* undeleted_dirs, TF_Status* status) {
  *undeleted_files = *undeleted_dirs = 0;
  Path p;
  if (!ParsePath(path, &p, status)) return;
  Client* client = ClientOf(filesystem);
  Listing listing;
  Status s = client->List(p.bucket, p.dir_prefix(), false, 0, &listing);
  if (s.ok() && listing.keys.empty()) {
    ObjectInfo info;
    s = client->HeadObject(p.bucket, p.key, &info);  // a file: delete just it
    if (s.ok()) listing.keys.push_back(p.key);
  }
  for (const std::string& key : listing.keys) {
    if (!s.ok()) break;
    s = client->Delete(p.bucket, key);
    if (!s.ok()) *undeleted_files = 1;
  }
  SetStatus(status, s);
}

void CopyOrRename(const TF_Filesystem* filesystem, const char* src, const char* dst, bool remove,
                  TF_Status* status) {
  Path from, to;
  if (!ParsePath(src, &from, status) || !ParsePath(dst, &to, status)) return;
  if (from.bucket != to.bucket) {
    TF_SetStatus(status, TF_UNIMPLEMENTED, "copies between buckets are not supported");
    return;
  }
  Client* client = ClientOf(filesystem);
  ObjectInfo info;
  Status s = client->HeadObject(from.bucket, from.key, &info);
  if (s.ok()) s = client->Copy(from.bucket, from.key, to.key, info.size);
  if (s.ok() && remove) s = client->Delete(from.bucket, from.key);
  SetStatus(status, s);
}

void RenameFile(const TF_Filesystem* filesystem, const char* src, const char* dst, TF_Status* status) {
  CopyOrRename(filesystem, src, dst, true, status);
}

void CopyFile(const TF_Filesystem* filesystem, const char* src, const char* dst, TF_Status* status) {
  CopyOrRename(filesystem, src, dst, false, status);
}

int GetChildren(const TF_Filesystem* filesystem, const char* path, char*** entries, TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return -1;
  Client* client = ClientOf(filesystem);
  Listing listing;
  Status s = client->List(p.bucket, p.dir_prefix(), true, 0, &listing);
  std::vector<std::string> names;
  size_t skip = p.dir_prefix().size();
  for (const std::string& key : listing.keys) {
    if (key.size() > skip) names.push_back(key.substr(skip));
  }
  for (const std::string& prefix : listing.prefixes) {
    if (prefix.size() > skip + 1) names.push_back(prefix.substr(skip, prefix.size() - skip - 1));
  }
  if (s.ok() && listing.keys.empty() && listing.prefixes.empty() && !p.key.empty()) {
    Kind kind;
    ObjectInfo info;
    s = Lookup(client, p, &kind, &info);
    if (s.ok() && kind == Kind::kMissing) s = NotFound(path);
    if (s.ok() && kind == Kind::kFile) s = {TF_FAILED_PRECONDITION, std::string(path) + " is a file"};
  }
  SetStatus(status, s);
  if (!s.ok()) return -1;
  *entries = static_cast<char**>(std::calloc(names.size() + 1, sizeof(char*)));
  for (size_t i = 0; i < names.size(); ++i) (*entries)[i] = strdup(names[i].c_str());
  return static_cast<int>(names.size());
}

// Random access files: a ranged GET per read.

struct Reader {
  Client* client;
  Path path;
  uint64_t size;
};

void NewRandomAccessFile(const TF_Filesystem* filesystem, const char* path, TF_RandomAccessFile* file,
                         TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return;
  ObjectInfo info;
  Status s = ClientOf(filesystem)->HeadObject(p.bucket, p.key, &info);
  file->plugin_file = s.ok() ? new Reader{ClientOf(filesystem), p, info.size} : nullptr;
  SetStatus(status, s);
}

void CleanupReader(TF_RandomAccessFile* file) { delete static_cast<Reader*>(file->plugin_file); }

int64_t Read(const TF_RandomAccessFile* file, uint64_t offset, size_t n, char* buffer, TF_Status* status) {
  const auto* reader = static_cast<const Reader*>(file->plugin_file);
  size_t want = offset >= reader->size ? 0 : static_cast<size_t>(std::min<uint64_t>(n, reader->size - offset));
  size_t got = 0;
  Status s;
  if (want > 0) s = reader->client->GetRange(reader->path.bucket, reader->path.key, offset, want, buffer, &got);
  if (s.ok() && got < n) s = {TF_OUT_OF_RANGE, "read past the end of the object"};
  SetStatus(status, s);
  return s.ok() || s.code == TF_OUT_OF_RANGE ? static_cast<int64_t>(got) : -1;
}

// Writable files: parts uploaded as they fill; the object appears when the file is closed.

struct Writer {
  Client* client;
  Path path;
  std::string buffer;
  uint64_t written = 0;
  std::string upload_id;
  std::vector<std::string> etags;
  Status failed;  // the first error: every later call reports it
  bool closed = false;
};

Status UploadBuffered(Writer* w) {
  if (w->upload_id.empty()) {
    Status s = w->client->CreateUpload(w->path.bucket, w->path.key, &w->upload_id);
    if (!s.ok()) return s;
  }
  std::string etag;
  Status s = w->client->UploadPart(w->path.bucket, w->path.key, w->upload_id, static_cast<int>(w->etags.size() + 1),
                                   w->buffer.data(), w->buffer.size(), &etag);
  if (s.ok()) {
    w->etags.push_back(etag);
    w->buffer.clear();
  }
  return s;
}

void NewWritableFile(const TF_Filesystem* filesystem, const char* path, TF_WritableFile* file, TF_Status* status) {
  Path p;
  if (!ParsePath(path, &p, status)) return;
  if (p.key.empty()) {
    TF_SetStatus(status, TF_FAILED_PRECONDITION, (std::string(path) + " is a bucket").c_str());
    return;
  }
  file->plugin_file = new Writer{ClientOf(filesystem), p};
  TF_SetStatus(status, TF_OK, "");
}

void CleanupWriter(TF_WritableFile* file) {
  auto* w = static_cast<Writer*>(file->plugin_file);
  // Never closed (an error on the way): its parts are not kept.
  if (!w->upload_id.empty()) w->client->AbortUpload(w->path.bucket, w->path.key, w->upload_id);
  delete w;
}

void Append(const TF_WritableFile* file, const char* data, size_t n, TF_Status* status) {
  auto* w = static_cast<Writer*>(file->plugin_file);
  if (w->failed.ok()) {
    w->buffer.append(data, n);
    w->written += n;
    if (w->buffer.size() >= w->client->config().part_size) w->failed = UploadBuffered(w);
  }
  SetStatus(status, w->failed);
}

int64_t Tell(const TF_WritableFile* file, TF_Status* status) {
  TF_SetStatus(status, TF_OK, "");
  return static_cast<int64_t>(static_cast<Writer*>(file->plugin_file)->written);
}

void Close(const TF_WritableFile* file, TF_Status* status) {
  auto* w = static_cast<Writer*>(file->plugin_file);
  Status& s = w->failed;
  // TensorFlow's checkpoint writer closes its files twice (its buffer, then the file): the object
  // is uploaded once, and a second close answers as the first did.
  if (w->closed) {
    SetStatus(status, s);
    return;
  }
  w->closed = true;
  if (s.ok() && w->upload_id.empty()) {
    s = w->client->Put(w->path.bucket, w->path.key, w->buffer.data(), w->buffer.size());
  } else if (s.ok()) {
    if (!w->buffer.empty()) s = UploadBuffered(w);
    if (s.ok()) s = w->client->CompleteUpload(w->path.bucket, w->path.key, w->upload_id, w->etags);
    if (s.ok()) w->upload_id.clear();
  }
  w->buffer.clear();
  w->buffer.shrink_to_fit();
  SetStatus(status, s);
}

// The path as given: the default would keep only its path, and lose the bucket.
char* TranslateName(const TF_Filesystem*, const char* uri) { return strdup(uri); }

void* Allocate(size_t size) { return std::calloc(1, size); }

void Free(void* pointer) { std::free(pointer); }

}  // namespace
}  // namespace s3fs

extern "C" TF_CAPI_EXPORT void TF_InitPlugin(TF_FilesystemPluginInfo* info) {
  using namespace s3fs;
  info->plugin_memory_allocate = Allocate;
  info->plugin_memory_free = Free;
  info->num_schemes = 1;
  info->ops = static_cast<TF_FilesystemPluginOps*>(Allocate(sizeof(TF_FilesystemPluginOps)));
  TF_FilesystemPluginOps& ops = info->ops[0];
  TF_SetFilesystemVersionMetadata(&ops);
  ops.scheme = strdup("s3");

  auto* fs = static_cast<TF_FilesystemOps*>(Allocate(TF_FILESYSTEM_OPS_SIZE));
  fs->init = Init;
  fs->cleanup = Cleanup;
  fs->new_random_access_file = NewRandomAccessFile;
  fs->new_writable_file = NewWritableFile;
  fs->create_dir = CreateDir;
  fs->recursively_create_dir = RecursivelyCreateDir;
  fs->delete_file = DeleteFile;
  fs->delete_dir = DeleteDir;
  fs->delete_recursively = DeleteRecursively;
  fs->rename_file = RenameFile;
  fs->copy_file = CopyFile;
  fs->path_exists = PathExists;
  fs->stat = Stat;
  fs->is_directory = IsDirectory;
  fs->get_file_size = GetFileSize;
  fs->get_children = GetChildren;
  fs->translate_name = TranslateName;
  ops.filesystem_ops = fs;

  auto* reader = static_cast<TF_RandomAccessFileOps*>(Allocate(TF_RANDOM_ACCESS_FILE_OPS_SIZE));
  reader->cleanup = CleanupReader;
  reader->read = Read;
  ops.random_access_file_ops = reader;

  auto* writer = static_cast<TF_WritableFileOps*>(Allocate(TF_WRITABLE_FILE_OPS_SIZE));
  writer->cleanup = CleanupWriter;
  writer->append = Append;
  writer->tell = Tell;
  writer->close = Close;
  ops.writable_file_ops = writer;
}
