"""The Python tests' harness: the build under test, and a real l3kvd.

Importing it points the tests at the build: BUILD is $L3KV_BUILD (default
build/, relative to the repository when it is not a directory here),
$L3KV_LIB defaults to BUILD/libl3kv.so, and lib/python goes first on
sys.path, so that `import l3kv` after it loads this tree's client.

Daemon(build, config, prefix) starts BUILD/l3kvd on a socket in a fresh
mkdtemp directory with `config` merged over a socket and log section,
waits until it accepts, and dies with the test process (PR_SET_PDEATHSIG).
stop() sends SIGTERM and returns the exit status; cleanup() removes the
directory. A failed start prints the daemon's log and raises.
"""

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _build_dir():
    b = os.environ.get("L3KV_BUILD") or "build"
    if not os.path.isabs(b) and not os.path.isdir(b):
        b = os.path.join(REPO, b)
    return os.path.abspath(b)


BUILD = _build_dir()
sys.dont_write_bytecode = True      # no __pycache__ left in the source tree
os.environ.setdefault("L3KV_LIB", os.path.join(BUILD, "libl3kv.so"))
sys.path.insert(0, os.path.join(REPO, "lib", "python"))


def _set_pdeathsig():
    """The daemon must not outlive a test process that is killed."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG


class Daemon:
    def __init__(self, build, config, prefix, start_s=5, stop_s=10):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.sock = os.path.join(self.dir, "l3kvd.sock")
        self.stop_s = stop_s
        self.proc = None
        path = os.path.join(self.dir, "l3kvd.json")
        with open(path, "w") as f:
            json.dump(dict({"socket": {"path": self.sock, "mode": "0600"},
                            "log": {"level": "info"}}, **config), f)
        self._log = open(os.path.join(self.dir, "l3kvd.log"), "w")
        try:
            self.proc = subprocess.Popen([os.path.join(build, "l3kvd"), "-f", path],
                                         stdout=self._log, stderr=subprocess.STDOUT,
                                         preexec_fn=_set_pdeathsig)
            self._wait_socket(start_s)
        except BaseException:
            self.fail_start()
            raise

    def fail_start(self):
        """For a start that failed after the process began: stop, show the log, clean."""
        self.stop()
        log = self.log()
        self.cleanup()
        sys.stderr.write("l3kvd's log:\n" + log)

    def _wait_socket(self, seconds):
        deadline = time.monotonic() + seconds
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.sock)
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("l3kvd exited %d at start" % self.proc.returncode)
                if time.monotonic() > deadline:
                    raise RuntimeError("l3kvd did not accept on %s within %d s"
                                       % (self.sock, seconds))
                time.sleep(0.02)
            finally:
                s.close()

    def log(self):
        with open(os.path.join(self.dir, "l3kvd.log")) as f:
            return f.read()

    def stop(self):
        """SIGTERM, then its exit status (None if it was not running)."""
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(self.stop_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        return rc

    def cleanup(self):
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
