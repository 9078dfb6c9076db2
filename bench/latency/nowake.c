/*
 * nowake.c — linked into a second copy of the kvstore (kvstore-nowake) to
 * measure what the kvstore's wake-up callback is worth under `global`.
 *
 * kvstore.c registers molt_on_update_pending() so that a global update
 * wakes its threads out of epoll_wait()/poll() at once.  Without it, a
 * thread that is waiting when the update starts reaches its update point
 * only when its 100 ms wait times out or a request arrives, and every
 * thread already parked at the barrier waits for it: the Kitsune/WFPATCH
 * global-quiescence cost.  Defining the function here, in the executable,
 * binds kvstore.c's (weak) reference to this no-op at link time instead of
 * to libmolt's, so the very same kvstore sources run without the callback.
 */
void molt_on_update_pending(void (*cb)(void *), void *arg);
void molt_on_update_pending(void (*cb)(void *), void *arg) {
  (void)cb;
  (void)arg;
}
