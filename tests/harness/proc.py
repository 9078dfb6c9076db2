"""Running programs in tests: a program started with its output read by
threads, the molt CLI against it, its control socket, its end.

  run(cmd)          a command to completion -> Result (rc, out, err)
  molt(*args)       the build tree's molt CLI; molt_json(...) parses --json;
                    status(pid) and log(pid) are the common two
  Program(argv)     a started program: send() lines to its stdin, line() /
                    expect() its stdout, stderr() so far, wait_control()
                    until its control socket answers, finish() (stdin
                    closed, exit status checked), stop() / kill()
  Lines(stream)     any pipe read line by line by a thread
  poll(get, pred), wait_until(pred)  polling with a timeout
  maps(pid) / mapped(pid, name)
  sanitizer_reports(text), killed_midway(argv) (stopped_first(argv))
"""
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time

from harness.tree import molt_cli

SANITIZER_REPORT = ("ERROR: AddressSanitizer", "WARNING: ThreadSanitizer", "ERROR: LeakSanitizer",
                    "runtime error:", "ERROR: ThreadSanitizer")


def sanitizer_reports(text):
    """Lines of a sanitizer report in a program's stderr."""
    return [l for l in (text or "").splitlines() if any(m in l for m in SANITIZER_REPORT)]


class Result:
    """A finished command.  rc, out, err; the same under subprocess's
    names (returncode, stdout, stderr); its repr shows all of it."""

    def __init__(self, p, cmd):
        self.rc, self.out, self.err = p.returncode, p.stdout, p.stderr
        self.cmd = [str(c) for c in cmd]

    returncode = property(lambda self: self.rc)
    stdout = property(lambda self: self.out)
    stderr = property(lambda self: self.err)

    def __repr__(self):
        return "<rc=%d cmd=%s\nstdout:\n%s\nstderr:\n%s>" % (
            self.rc, " ".join(shlex.quote(c) for c in self.cmd), self.out, self.err)

    def ok(self):
        assert self.rc == 0, repr(self)
        return self


def run(cmd, cwd=None, env=None, input=None, timeout=300, check=None, merge=False, text=True,
        user=None):
    """Runs cmd to completion.  check: the exit status it must have
    (None: any); merge: stderr into out; text=False: bytes; user: a uid
    (and gid) to run as."""
    kw = {}
    if user is not None:
        def drop():
            os.setgid(user)
            os.setuid(user)
        kw["preexec_fn"] = drop
    p = subprocess.run([str(c) for c in cmd], cwd=None if cwd is None else str(cwd), env=env,
                       input=input, timeout=timeout, text=text, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT if merge else subprocess.PIPE, **kw)
    r = Result(p, cmd)
    if check is not None:
        assert r.rc == check, r
    return r


def molt(*args, check=None, timeout=60, **kw):
    """`molt ARGS...` (the build tree's CLI); check: the exit status it must
    have.  Keyword arguments as for run()."""
    r = run([molt_cli(), *args], timeout=timeout, **kw)
    if check is not None:
        assert r.rc == check, (args, r.rc, r.out, r.err)
    return r


def molt_json(*args, **kw):
    """`molt ARGS... --json`, which must succeed, parsed."""
    return json.loads(molt(*args, "--json", check=0, **kw).out)


def status(pid, **kw):
    return molt_json("status", pid, **kw)


def log(pid, **kw):
    return molt_json("log", pid, **kw)


def poll(get, pred=bool, timeout=5.0, what="condition", interval=0.02):
    """Calls get() until pred(value) holds and returns that value; fails
    after timeout s naming `what` and the last value."""
    end = time.monotonic() + timeout
    while True:
        value = get()
        if pred(value):
            return value
        assert time.monotonic() < end, "timed out waiting for %s; last: %s" % (what, value)
        time.sleep(interval)


def wait_until(pred, timeout=5.0, what="condition", interval=0.02):
    """Polls pred() until it is true; fails naming `what` after timeout s."""
    poll(pred, bool, timeout, what, interval)


def maps(pid):
    with open("/proc/%d/maps" % pid) as f:
        return f.read()


def mapped(pid, name):
    """Lines of the process's maps whose path (or memfd name) contains name."""
    return [l for l in maps(pid).splitlines() if name in l]


def stopped_first(argv, first):
    """argv, or (first) argv behind a shell that stops itself before it
    execs the command: killing that one is certain to happen before the
    command has done anything (a CLI killed before it sent a request)."""
    if not first:
        return argv
    return ["/bin/sh", "-c", 'kill -STOP $$; exec "$0" "$@"', *argv]


def killed_midway(argv, first=False, delay=0.0):
    """Starts argv (first: behind stopped_first, so that it is killed
    before it does anything), lets it run `delay` seconds and kills it."""
    p = subprocess.Popen([str(a) for a in stopped_first(argv, first)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if delay:
        time.sleep(delay)
    p.kill()
    p.wait()


class Lines:
    """A pipe read line by line by a thread: the program never blocks on a
    full pipe, and a test waits for a line with a timeout (select() would
    not see what a file object has already buffered).  .all holds every
    line read so far (without its newline); next() and expect() consume
    them in order."""

    def __init__(self, stream):
        self.all = []
        self.eof = False
        self.pos = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        while True:
            raw = stream.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            with self._cond:
                self.all.append(line[:-1] if line.endswith("\n") else line)
                self._cond.notify_all()
        with self._cond:
            self.eof = True
            self._cond.notify_all()

    def next(self, timeout=10.0):
        """The next unread line, or None at the end of the stream or after
        timeout seconds."""
        end = time.monotonic() + timeout
        with self._cond:
            while self.pos >= len(self.all):
                left = end - time.monotonic()
                if self.eof or left <= 0:
                    return None
                self._cond.wait(left)
            self.pos += 1
            return self.all[self.pos - 1]

    def wait(self, pred, timeout=10.0):
        """Waits until pred(all lines so far) holds, the stream ends or
        timeout seconds pass; returns whether pred held."""
        end = time.monotonic() + timeout
        with self._cond:
            while not pred(self.all):
                left = end - time.monotonic()
                if self.eof or left <= 0:
                    return pred(self.all)
                self._cond.wait(left)
            return True

    def wait_line(self, pred, timeout=10.0):
        """Waits until some line read so far satisfies pred(line) (looking
        at each line once), the stream ends or timeout seconds pass;
        returns whether one did."""
        end = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                while seen < len(self.all):
                    if pred(self.all[seen]):
                        return True
                    seen += 1
                left = end - time.monotonic()
                if self.eof or left <= 0:
                    return False
                self._cond.wait(left)

    def text(self):
        with self._cond:
            return "".join(l + "\n" for l in self.all)

    def join(self, timeout=10.0):
        """Waits for the end of the stream (the program has exited)."""
        self._thread.join(timeout)
        return self.text()


class Program:
    """A program started for a test, its stdin a pipe and its stdout and
    stderr read by threads (Lines).  Usable as a context manager: it is
    killed on the way out if it still runs."""

    def __init__(self, argv, cwd=None, env=None, name=None):
        self.argv = [str(a) for a in argv]
        self.name = name or os.path.basename(self.argv[0])
        self.p = subprocess.Popen(self.argv, cwd=None if cwd is None else str(cwd), env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        self.pid = self.p.pid
        self.out = Lines(self.p.stdout)
        self.err = Lines(self.p.stderr)

    # -- talking to it --------------------------------------------------------------
    def send(self, line):
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def stderr(self, tail=4000):
        return self.err.text()[-tail:]

    def describe(self):
        """Its state and the end of its stderr, for failure messages."""
        return "%s (pid %d, %s); stderr:\n%s" % (
            self.name, self.pid, "running" if self.alive() else "exit %s" % self.p.poll(),
            self.stderr())

    def line(self, timeout=10.0):
        """The next line of its stdout; fails when none comes in time."""
        line = self.out.next(timeout)
        if line is None:
            if self.out.eof:
                raise AssertionError("%s closed its stdout; %s" % (self.name, self.describe()))
            raise AssertionError("no answer within %.0f s from %s" % (timeout, self.describe()))
        return line

    def expect(self, pattern, timeout=10.0):
        """Reads stdout up to the first line matching pattern (re.search);
        returns the match, fails naming the last lines seen otherwise."""
        end = time.monotonic() + timeout
        while True:
            line = self.out.next(max(0.0, end - time.monotonic()))
            if line is None:
                raise AssertionError("no line matching %r; saw %s; %s" % (
                    pattern, self.out.all[-20:], self.describe()))
            m = re.search(pattern, line)
            if m:
                return m

    def wait_control(self, timeout=20.0):
        """Waits until its control socket answers `molt status`."""
        end = time.time() + timeout
        while True:
            r = molt("status", self.pid, "--json")
            if r.rc == 0:
                return json.loads(r.out)
            assert self.alive(), "%s exited before its control socket answered; %s" % (
                self.name, self.describe())
            assert time.time() < end, "the control socket of %s did not answer: %s" % (
                self.describe(), r)
            time.sleep(0.05)

    # -- its end --------------------------------------------------------------------
    def alive(self):
        return self.p.poll() is None

    def _wait(self, timeout):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not exit within %s s; %s" % (
                self.name, timeout, self.describe()))

    def finish(self, rc=0, timeout=10.0, quiet=False):
        """Closes its stdin (its signal to end) and waits for it to exit.
        rc: the exit status it must have (None: any; a crash is a negative
        status); quiet: its stderr must be empty.  Returns the status."""
        if self.p.stdin and not self.p.stdin.closed:
            try:
                self.p.stdin.close()
            except BrokenPipeError:
                pass
        got = self._wait(timeout)
        err = self.err.join()
        if rc is not None:
            assert got == rc, (got, err[-3000:])
        if quiet:
            assert err == "", err
        return got

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL after timeout s; returns the exit status."""
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.p.returncode

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        return False
