/*
 * service -- the top layer of libmolt, on switch/: the runtime thread, the
 * one path every request takes to it, the control server, status, start-up
 * and fork.  It reaches the modes only through switch/ (their registered
 * handlers and hooks), never by name.
 *
 *   runtime.c  start-up, the runtime thread (wake-up, requests, control
 *              socket, reclamation), fork handlers
 *   request.c  the dispatch table (from MOLT__OPS) and the request queue:
 *              molt_apply / molt_rollback hand their request to the runtime
 *              thread and wait, as the control server's requests do
 *   status.c   the records of `molt status`
 *   control.c  the control socket server (runs on the runtime thread)
 */
#ifndef MOLT_SERVICE_H
#define MOLT_SERVICE_H

#include "switch/switch.h"

/* ---- request.c -------------------------------------------------------------*/
/* Carries out a request ON the runtime thread (the control server calls it
 * from there): the response records into out; on failure a one-line
 * message into err.  Returns 0 or MOLT_E*. */
MOLT__HIDDEN int molt__execute(const molt__request *req, molt__buf *out, char *err,
                               size_t errlen);
/* Runs req on the runtime thread from any thread: executes it directly on
 * the runtime thread itself, else hands it over and waits (the caller
 * counts as waiting at an update point meanwhile). */
MOLT__HIDDEN int molt__request_run(const molt__request *req, molt__buf *out, char *err,
                                   size_t errlen);
/* The runtime thread is about to start: requests wait for it from now on. */
MOLT__HIDDEN void molt__requests_open(void);
/* The runtime thread: the calling thread is it (once, at its start). */
MOLT__HIDDEN void molt__requests_serve_here(void);
/* Runtime thread: carries out every queued request. */
MOLT__HIDDEN void molt__requests_drain(void);
/* The runtime thread stops (its loop failed): queued and later requests
 * fail with MOLT_EREFUSING instead of waiting for ever. */
MOLT__HIDDEN void molt__requests_stop(void);
MOLT__HIDDEN void molt__requests_after_fork_child(void);
/* One reclamation pass (op_lock held): generations, owners, modes.
 * Returns the number of retired generations still alive. */
MOLT__HIDDEN size_t molt__reclaim_locked(void);
/* op_lock, for status and the request dispatch (runtime.c owns it). */
MOLT__HIDDEN void molt__op_lock(void);
MOLT__HIDDEN void molt__op_unlock(void);

/* ---- status.c ----------------------------------------------------------------*/
/* The records of `molt status` (op_lock held). */
MOLT__HIDDEN void molt__status(molt__buf *out);
/* Why the control channel is missing (0: it is there), for status. */
MOLT__HIDDEN int molt__control_error(void);

/* ---- control.c ----------------------------------------------------------------*/
/* Creates the listening socket for this process (abstract name
 * "\0molt.<pid>") in *out.  Returns 0 or a negative MOLT_E* code. */
MOLT__HIDDEN int molt__control_listen(molt__fd *out);
/* The listener is readable: if it is still ours, accept one client, check
 * its credentials, serve its request with molt__execute, close it.  Never
 * blocks longer than the per-client I/O timeout. */
MOLT__HIDDEN void molt__control_serve(const molt__fd *listener);

#endif /* MOLT_SERVICE_H */
