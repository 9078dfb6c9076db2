/* libmoltproto.so: the hazard word of the HP prototype of molt_proto.h
 * (see there).  A shared library, like libmolt, so that it is reached
 * through initial-exec TLS from the program exactly as molt__self is. */
#define MOLT__NO_AUTO_REGISTER /* no updatable functions here */
#include "molt_proto.h"

__attribute__((visibility("default"))) __thread _Atomic(molt__gen *) molt_proto_hz
    __attribute__((tls_model("initial-exec")));
