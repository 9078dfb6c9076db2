"""Status tells the truth about old code (issue 12, "Must show"): a thread
that never leaves an updatable loop function keeps running its version 0
after a patch of that function.  `molt apply` warns, naming the thread;
`molt status` (and --json) names the thread and the old version, and
flags it as a loop that never returns once it has run longer than the
threshold."""
import json
import re
import time

from harness.proc import Program, molt

SOURCE = r"""
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static volatile long ticks;

void tick(void)
{
    ticks++;
}

void serve(void)                        /* the event loop: never returns */
{
    for (;;) {
        poll(NULL, 0, 20);
        tick();
    }
}

static void *loop_thread(void *arg)
{
    (void)arg;
    serve();
    return NULL;
}

int main(void)
{
    pthread_t t;
    char line[64];
    pthread_create(&t, NULL, loop_thread, NULL);
    pthread_setname_np(t, "evloop");
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        printf("ticks %ld\n", ticks);
        fflush(stdout);
    }
    return 0;
}
"""


def test_a_loop_that_never_returns_is_named_by_apply_and_status(tool):
    tool.write("loop.c", SOURCE)
    tool.moltcc("--molt-updatable=all", "-O2", "-g", "-o", "loop", "loop.c").ok()
    tool.write("v2/loop.c", SOURCE.replace("poll(NULL, 0, 20);", "poll(NULL, 0, 10);"))
    tool.moltcc("--molt-patch", "--molt-target", "./loop", "-o", "fix.so", "v2/loop.c").ok()
    with Program([tool.path("loop")], cwd=tool.cwd) as p:
        pid = p.expect(r"^ready (\d+)").group(1)
        loop_tid = None
        for tid in __import__("os").listdir("/proc/%s/task" % pid):
            with open("/proc/%s/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() == "evloop":
                    loop_tid = int(tid)
        assert loop_tid, "no evloop thread"
        before = json.loads(molt("status", pid, "--json", check=0).out)
        assert before["old_code"] == [], before["old_code"]
        r = molt("apply", pid, tool.path("fix.so"), check=0)
        assert re.search(r"molt: warning: thread %d \(evloop\) is still running version 0 of "
                         r"serve, entered before this patch" % loop_tid, r.err), r.err
        st = json.loads(molt("status", pid, "--json", check=0).out)
        fn = [f for f in st["functions"] if f["name"] == "serve"][0]
        assert fn["entry"] in ("dispatch", "patch") and fn["version"] != "base", fn
        old = [o for o in st["old_code"] if o["function"] == "serve"]
        assert len(old) == 1, st["old_code"]
        assert old[0]["tid"] == loop_tid and old[0]["thread"] == "evloop"
        assert old[0]["version"] == 0 and old[0]["static"] is False
        assert old[0]["never_returns"] is False        # 10 s threshold not reached
        # the functions it calls switch; it does not: still seen after a while
        time.sleep(1.5)
        env = dict(__import__("os").environ, MOLT_OLD_CODE_SECONDS="1")
        st = json.loads(molt("status", pid, "--json", check=0, env=env).out)
        old = [o for o in st["old_code"] if o["function"] == "serve"]
        assert len(old) == 1 and old[0]["never_returns"] is True, st["old_code"]
        assert old[0]["seconds"] >= 1.0
        human = molt("status", pid, check=0, env=env).out
        assert re.search(r"serve: still running version 0 on thread %d \(evloop\) since .*: "
                         r"a loop that never returns; a full update replaces it" % loop_tid,
                         human), human
        # tick, which it calls, is not patched and is not reported
        assert not [o for o in st["old_code"] if o["function"] == "tick"]
        p.send("x")
        assert p.expect(r"^ticks (\d+)")
        p.finish(rc=0)
