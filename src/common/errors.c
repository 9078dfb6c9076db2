/* Error codes and messages: everything derives from MOLT_ERRNO_MAP.  And the
 * one mapping from a system call's errno to a MOLT_E* code. */
#include "common/common.h"

#include <errno.h>

const char *molt_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
#define MOLT__ERR_MSG(name, val, msg)                                                    \
  case (val):                                                                            \
    return msg;
    MOLT_ERRNO_MAP(MOLT__ERR_MSG)
#undef MOLT__ERR_MSG
  default:
    return "unknown error";
  }
}

const char *molt_err_name(int err) {
  switch (err) {
  case 0:
    return "0";
#define MOLT__ERR_NAME(name, val, msg)                                                   \
  case (val):                                                                            \
    return "MOLT_" #name;
    MOLT_ERRNO_MAP(MOLT__ERR_NAME)
#undef MOLT__ERR_NAME
  default:
    return "MOLT_EUNKNOWN";
  }
}

int molt__from_errno(int e) {
  switch (e) {
  case ENOENT:
  case ENOTDIR:
    return MOLT_ENOENT;
  case EACCES:
  case EPERM:
    return MOLT_EPERM;
  case ENOMEM:
  case ENOBUFS:
    return MOLT_ENOMEM;
  default:
    return MOLT_EIO;
  }
}
