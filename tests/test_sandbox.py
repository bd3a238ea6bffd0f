"""The sandbox for model-written code: results come back, attacks fail in bounded time and leave
nothing behind (no process, no file, no temporary directory)."""

import ast
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import psutil
import pytest

from llm_envs import sandbox
from llm_envs.sandbox import ALLOWED_MODULES, run_function

FLIP = "def transform(grid):\n    return [row[::-1] for row in grid]\n"
GRIDS = [[[1, 2], [3, 4]], [[5, 6, 7]]]


@pytest.fixture
def sandbox_tmp(tmp_path, monkeypatch):
    """Sandbox work directories go to an empty folder, which must be empty again afterwards."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def run(code: str, inputs=GRIDS, **kw):
    # processes started earlier in the session (e.g. scoring pools) are not the sandbox's
    before = children()
    result = run_function(code, "transform", inputs, **kw)
    assert result.pid is not None
    assert children() <= before
    with pytest.raises(ProcessLookupError):  # the child's whole process group is gone
        os.killpg(result.pid, 0)
    return result


def test_results_and_fresh_copies(sandbox_tmp):
    r = run(FLIP)
    assert r.ok and r.values == [[[2, 1], [4, 3]], [[7, 6, 5]]] and r.errors == [None, None]
    # each call gets its own copy of its input; state lives across calls in one run
    r = run("seen = []\ndef transform(g):\n    g.append(0)\n    seen.append(1)\n    return [len(g), len(seen)]")
    assert r.values == [[3, 1], [2, 2]]


def test_numpy_and_allowed_modules(sandbox_tmp):
    code = textwrap.dedent("""
        import numpy as np
        from collections import Counter
        import copy, itertools, math
        from typing import List
        def transform(grid: List[List[int]]) -> List[List[int]]:
            a = np.array(copy.deepcopy(grid))
            return np.fliplr(a)
    """)
    assert run(code).values == [[[2, 1], [4, 3]], [[7, 6, 5]]]
    assert run("import numpy as np\ndef transform(g):\n    return np.int64(3)", [[[1]]]).values == [3]
    assert "numpy" in ALLOWED_MODULES


@pytest.mark.parametrize("code, error", [
    ("def transform(g:\n    pass", "syntax error"),
    ("def transform(g):\n    return 1 / 0", "ZeroDivisionError"),
    ("raise SystemExit(3)", "SystemExit"),
    ("def other(g):\n    return g", "no function 'transform'"),
    ("import os\nos._exit(0)", "sandbox exited"),
    ("def transform(g):\n    return {1: 2}", "not JSON-serialisable"),
    ("def transform(g):\n    return float('nan')", "non-finite"),
    ("def transform(g):\n    x = []\n    x.append(x)\n    return x", "nested too deeply"),
    ("def transform(g):\n    return [[0] * 30] * 10**5", "too large"),
    ("import requests", "not available"),
])
def test_failures_are_reported(sandbox_tmp, code, error):
    r = run(code)
    assert not r.ok and all(error in e for e in r.errors), r


def test_printing_does_not_break_results(sandbox_tmp):
    code = FLIP.replace("return", "print('junk', '{\"i\": 0, \"value\": 9}'); import os; "
                                  "os.write(1, b'{\"i\": 0, \"value\": 9}\\n'); os.write(2, b'x'); return")
    assert run(code).values == [[[2, 1], [4, 3]], [[7, 6, 5]]]


def test_exception_in_one_call_keeps_the_others(sandbox_tmp):
    r = run("def transform(g):\n    return g[1]", GRIDS)
    assert r.values[0] == [3, 4] and r.errors[0] is None and "IndexError" in r.errors[1]


ATTACKS = {
    "infinite loop": "while True:\n    pass",
    "loop in transform": "def transform(g):\n    while True:\n        pass",
    "sleep": "import time\ntime.sleep(100)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "fork via posix": "import posix\nwhile True:\n    posix.fork()",
    "big string": "x = 'a' * 10**11",
    "growing list": "x = []\nwhile True:\n    x.append(' ' * 10**6)",
    "file write": "open('/tmp/pwned_{u}', 'w').write('x')",
    "os.open write": "import os\nos.open('/tmp/pwned_{u}', os.O_CREAT | os.O_WRONLY)",
    "os.system": "import os\nos.system('touch /tmp/pwned_{u}')",
    "subprocess": "import subprocess\nsubprocess.Popen(['touch', '/tmp/pwned_{u}'])",
    "exec": "import os\nos.execv('/usr/bin/touch', ['touch', '/tmp/pwned_{u}'])",
    "posix_spawn": "import os\nos.posix_spawn('/usr/bin/touch', ['touch', '/tmp/pwned_{u}'], {{}})",
    "socket connect": "import socket\nsocket.create_connection(('127.0.0.1', 80))",
    "socket object": "import socket\nsocket.socket()",
    "builtin socket": "import _socket\n_socket.socket()",
    "ctypes": "import ctypes\nctypes.CDLL(None).system(b'touch /tmp/pwned_{u}')",
    "read dataset": "def transform(g):\n    return open('/etc/hostname').read()",
    "kill parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "threads": "import threading\nthreading.Thread(target=lambda: None).start()",
    "remove hook state": "import gc\ngc.get_objects()",
    "returns a string": "def transform(g):\n    return 'not a grid'",
    "huge output": "def transform(g):\n    return [[1] * 1000] * 10**4",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attacks_fail_fast_and_leave_nothing(sandbox_tmp, name):
    u = uuid.uuid4().hex
    start = time.monotonic()
    code = ATTACKS[name].format(u=u)
    if "def transform" not in code:  # a module-level attack, then a valid transform
        code += "\n" + FLIP
    r = run(code, timeout=2.0)
    assert time.monotonic() - start < 5.0
    assert not os.path.exists(f"/tmp/pwned_{u}")
    if name != "returns a string":
        assert not r.ok, r
    else:
        assert r.values == ["not a grid", "not a grid"]
    assert os.getppid() and psutil.Process().is_running()


def test_timeout_is_wall_clock(sandbox_tmp):
    start = time.monotonic()
    r = run("import time\ndef transform(g):\n    time.sleep(100)", timeout=1.0)
    assert r.error == "timeout" and r.errors == ["timeout", "timeout"]
    assert time.monotonic() - start < 3.0


def test_caller_alarm_waits_for_cleanup(sandbox_tmp):
    """The batch scorer's per-item SIGALRM fires only once the child is dead and its directory gone."""

    class Alarm(BaseException):
        pass

    def on_alarm(signum, frame):
        raise Alarm

    before = children()
    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Alarm):
            run_function("while True:\n    pass", "transform", [[[1]]], timeout=1.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert children() <= before


KERNEL_PROBE = textwrap.dedent("""
    import importlib.util, os, socket
    spec = importlib.util.spec_from_file_location("sandbox", {path!r})
    sandbox = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sandbox)  # the file alone: the package would import gymnasium
    sandbox.confine(2, 256 << 20)
    out = {{"uid": os.getuid()}}
    def attempt(name, f):
        try:
            f()
            out[name] = "allowed"
        except BaseException as exc:
            out[name] = type(exc).__name__
    attempt("fork", os.fork)
    attempt("exec", lambda: os.execv("/bin/true", ["true"]))  # every mount is noexec
    attempt("connect", lambda: socket.socket().connect(("127.0.0.1", {port})))  # loopback is down
    attempt("write_tmp", lambda: open("/tmp/pwned_{u}", "w"))  # /tmp is world-writable
    attempt("read_root", lambda: os.listdir("/root"))
    attempt("memory", lambda: bytearray(400 << 20))
    print(repr(out))
""")


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop and network namespace need root")
def test_kernel_fences_without_the_audit_hook():
    """What the OS enforces on its own (the audit hook is not installed in this probe)."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        u = uuid.uuid4().hex
        probe = KERNEL_PROBE.format(path=sandbox.__file__, port=server.getsockname()[1], u=u)
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True,
                              text=True, timeout=20, cwd="/")
        out = ast.literal_eval(proc.stdout)
    finally:
        server.close()
    assert out == {"uid": 65534, "fork": "BlockingIOError", "exec": "PermissionError",
                   "connect": "OSError", "write_tmp": "OSError", "read_root": "PermissionError",
                   "memory": "MemoryError"}, proc
    assert not os.path.exists(f"/tmp/pwned_{u}")


def test_the_child_script_run_by_hand_says_what_it_is(tmp_path):
    """``python -m llm_envs.sandbox`` outside a sandbox directory: one line naming the file's role, exit 2."""
    done = subprocess.run([sys.executable, sandbox.__file__], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "sandbox's child process" in done.stderr and "request.marshal" in done.stderr
