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

#include <poll.h>

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
MOLT__HIDDEN void molt__requests_fork_prepare(void);
MOLT__HIDDEN void molt__requests_fork_parent(void);
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
/* Clients served at once (the slots of control.c). */
#define MOLT__CONTROL_SLOTS 32
/* Poll entries of the control server: the listener, then one per slot. */
#define MOLT__CONTROL_POLLFDS (1 + MOLT__CONTROL_SLOTS)
/* Creates the listening socket for this process in *out: on the abstract
 * name "\0molt.<pid>", or, when another socket holds that name, on the
 * fallback "\0molt.<pid>.<random>"; the name taken (without its NUL) goes
 * into name.  Returns 0 or a negative MOLT_E* code. */
MOLT__HIDDEN int molt__control_listen(molt__fd *out, char *name, size_t namelen);
/* Runtime thread, before poll: fills fds[0 .. MOLT__CONTROL_POLLFDS) (the
 * listener, then every client; -1 where there is none) and lowers
 * *timeout_ms (-1: none) to the nearest deadline of a client or a due log
 * summary of refusals. */
MOLT__HIDDEN void molt__control_poll_prepare(const molt__fd *listener, struct pollfd *fds,
                                             int *timeout_ms);
/* Runtime thread, after poll (fds as prepared, with their revents): serves
 * what is ready, ends clients past their deadline, accepts new clients if
 * the listener is readable and still ours.  Never blocks. */
MOLT__HIDDEN void molt__control_poll_done(const molt__fd *listener,
                                          const struct pollfd *fds);
/* Runtime thread: it was busy for ns with something else (an operation):
 * every client's deadline but except's moves by as much. */
MOLT__HIDDEN void molt__control_held(uint64_t ns, const void *except);
/* The records "denied <uid> <count> <first> <last> <last pid>" of refused
 * connections, for status (runtime thread). */
MOLT__HIDDEN void molt__control_status(molt__buf *out);
/* In a forked child: the parent's clients are dropped. */
MOLT__HIDDEN void molt__control_after_fork_child(void);

#endif /* MOLT_SERVICE_H */
