// Status: the result of a core operation. The core has no TensorFlow dependency, so kernels
// translate a Status into the matching tensorflow::Status (see kernels/table_resource.h).
#ifndef REC_SDK_CORE_STATUS_H_
#define REC_SDK_CORE_STATUS_H_

#include <string>
#include <utility>

namespace rec_sdk {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input from the caller: shapes, values, stale addresses
  kResourceExhausted,   // a fixed-capacity table is full
  kFailedPrecondition,  // the table is not in a state that allows the call
  kNotFound,            // a checkpoint file or directory is missing
  kDataLoss,            // a checkpoint file is truncated or corrupted
  kPermissionDenied,    // the file system refused access to a checkpoint path
  kInternal,            // an I/O call failed otherwise
  kOutOfRange,          // a rank's input ended (step headers: every rank stops)
};

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static Status ResourceExhausted(std::string m) {
    return {StatusCode::kResourceExhausted, std::move(m)};
  }
  static Status FailedPrecondition(std::string m) {
    return {StatusCode::kFailedPrecondition, std::move(m)};
  }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
  static Status PermissionDenied(std::string m) {
    return {StatusCode::kPermissionDenied, std::move(m)};
  }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define REC_SDK_RETURN_IF_ERROR(expr)   \
  do {                                  \
    ::rec_sdk::Status _status = (expr); \
    if (!_status.ok()) return _status;  \
  } while (0)

}  // namespace rec_sdk

#endif  // REC_SDK_CORE_STATUS_H_
