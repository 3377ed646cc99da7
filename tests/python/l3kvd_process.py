"""A real l3kvd for the Python tests.

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
