"""Running untrusted, model-written Python: one throwaway process per call, several fences deep.

``run_function(code, "transform", inputs)`` executes ``code`` and calls ``transform(x)`` on every
input in a fresh child process; to this process the model's code is data and is never executed
here. The request goes in as a ``marshal`` file (parent to child only: never unmarshal what the
child wrote); results come back as JSON lines, so only plain values cross the boundary (numpy
arrays and numpy scalars are converted with ``tolist``/``__index__``).

The child is this very file run as a script, ``python -I -S sandbox.py`` (isolated mode and no
``site``: no ``PYTHON*`` variables, no user site, no ``.pth`` code), in a fresh temporary
directory that is deleted afterwards, with a scrubbed environment (no tokens or keys). Before the
model's code runs it:

1. imports the allowed modules the code's import lines mention (``ALLOWED_MODULES``: numpy and
   common stdlib modules); every other import is refused later, on every machine alike;
2. when started as root: enters new network and mount namespaces (``unshare``): the network is a
   downed loopback only, so there is none, and every mount is remounted read-only, noexec,
   nosuid and nodev inside the namespace (~2 ms): no file can be written anywhere (``/tmp``
   included) and no program can be ``exec``-ed; then drops to uid/gid 65534 (``nobody``): every
   capability is gone, root's files (``/root``, the trainer's checkpoints, ``/proc/<pid>/mem``)
   are out of reach, and ``RLIMIT_NPROC`` takes effect (the kernel ignores it for root);
3. sets ``PR_SET_NO_NEW_PRIVS`` (no setuid binary can raise privileges again);
4. sets resource limits: ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory), ``RLIMIT_NPROC=0`` (no fork, no
   threads), ``RLIMIT_FSIZE`` (1 MB), ``RLIMIT_NOFILE`` and ``RLIMIT_CORE=0``;
5. installs an audit hook (``sys.addaudithook``; Python code cannot remove it) that refuses
   imports of new modules, opening any file by name (reading too: no dataset on disk to look
   answers up in, no ``/proc``; writing anywhere), every file-system change, sockets, ``ctypes``,
   process creation and ``exec`` (``os.system``, ``subprocess``, ``os.fork``, ``os.exec*``,
   ``os.spawn*``, ``os.posix_spawn``, ``pty``), signals to other processes, and the ``gc`` walks
   that could reach the hook's own state.

The parent enforces a wall-clock deadline: the child runs in its own session, and its whole
process group is killed with ``SIGKILL`` on timeout and after every normal exit; it reads at most
``max_output_bytes``. Results travel on a private duplicate of the child's stdout, one JSON line
per input; fds 0-2 point at ``/dev/null`` first, so ``print`` and C-level noise cannot corrupt
them. The child never sees expected outputs, so tampering with the channel cannot earn a reward.

Not covered: a non-root run (or a container that refuses namespaces) gets fences 1 and 3-5
(``RLIMIT_NPROC=0`` still blocks fork: it then counts all of the user's processes). A CPU-bound
C call runs until the deadline. Seccomp would filter system calls in the kernel; the stdlib has
no binding for it.

Cost, measured on an idle core: ~20 ms per call (a bare ``python -I -S`` takes ~9 ms); code that
imports ``typing``/``collections`` pays ~10 ms more and code that imports numpy ~70 ms more.
"""

from __future__ import annotations

import os
import sys

#: Modules the code may import: those it mentions are imported before the fences go up.
ALLOWED_MODULES = (
    "numpy", "collections", "copy", "itertools", "math", "functools", "heapq", "operator",
    "typing", "re", "bisect", "string", "dataclasses", "enum", "random", "statistics",
    "fractions", "array", "abc",
)
# Audit events refused outright (exact names) and by prefix.
_BLOCKED_EVENTS = frozenset({
    "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.startfile",
    "signal.pthread_kill", "os.chdir", "os.fchdir",
    "os.chmod", "os.chown", "os.chflags", "os.link", "os.symlink", "os.mkdir", "os.mkfifo",
    "os.mknod", "os.remove", "os.rename", "os.rmdir", "os.truncate", "os.utime",
    "os.setxattr", "os.removexattr", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
})
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
                     "pty.", "shutil.", "_posixsubprocess.")
_NOBODY = 65534
_CLONE_NEWNET, _CLONE_NEWNS = 0x40000000, 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38
_REQUEST_FILE = "request.marshal"


class SandboxResult:
    """The outcome of one ``run_function`` call.

    ``values[i]`` is what the function returned for input ``i`` (decoded from JSON) when
    ``errors[i]`` is ``None``; otherwise ``errors[i]`` says why that call failed. ``error`` is set
    when the run as a whole failed (syntax error, timeout, crash...), and is then also the reason
    of every input left without a result. ``seconds`` is the wall time, start-up included;
    ``pid`` the child's process id (= its process group id, gone by the time the call returns).
    """

    def __init__(self, n: int):
        self.values: list = [None] * n
        self.errors: list[str | None] = ["no result"] * n
        self.error: str | None = None
        self.seconds = 0.0
        self.pid: int | None = None

    @property
    def ok(self) -> bool:
        """True when every call returned a value."""
        return self.error is None and not any(self.errors)

    def __repr__(self) -> str:
        return f"SandboxResult(values={self.values!r:.200}, errors={self.errors}, error={self.error!r})"


# ----- parent side ----------------------------------------------------------------------------

def run_function(
    code: str,
    function: str,
    inputs: list,
    *,
    timeout: float = 5.0,
    memory_mb: int = 512,
    max_output_bytes: int = 1 << 20,
) -> SandboxResult:
    """Run ``code`` in a sandboxed child process and call ``function(x)`` for each ``x`` in ``inputs``.

    Args:
        code: the untrusted source; it must define ``function``.
        inputs: arguments made of lists, tuples, dicts, ints, floats, strings, bools and
            ``None``; each call gets its own fresh copy.
        timeout: wall-clock seconds for the whole run (start-up, definition and every call).
        memory_mb: the child's address-space limit.
        max_output_bytes: most bytes of results read back; a run that sends more fails.

    A caller's ``SIGALRM`` (the batch scorer's per-item timer) is held back until the child is
    dead and its directory deleted, so it cannot interrupt the clean-up; ``timeout`` bounds the
    wait instead.
    """
    import marshal
    import select
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

    result = SandboxResult(len(inputs))
    start = time.monotonic()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    workdir = tempfile.mkdtemp(prefix="llm_envs_sandbox_")
    proc = None
    try:
        request = {
            "code": code, "function": function, "inputs": [marshal.dumps(x) for x in inputs],
            "cpu_seconds": max(1, int(timeout + 1)), "memory_bytes": int(memory_mb) << 20,
            "max_output_bytes": int(max_output_bytes),
            "paths": [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))],
        }
        with open(os.path.join(workdir, _REQUEST_FILE), "wb") as f:
            marshal.dump(request, f)
        # No secrets in the environment; numeric libraries must not start thread pools.
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)],
            cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        result.pid = proc.pid
        out = bytearray()
        fd = proc.stdout.fileno()
        deadline = start + timeout
        while True:  # read until EOF (the child closed its channel), the deadline or the size cap
            left = deadline - time.monotonic()
            if left <= 0:
                result.error = "timeout"
                break
            if not select.select([fd], [], [], left)[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            out += chunk
            if len(out) > max_output_bytes:
                result.error = f"output larger than {max_output_bytes} bytes"
                break
        if result.error is None:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                result.error = "timeout"
        _collect(result, bytes(out[:max_output_bytes]), proc.returncode)
    finally:
        if proc is not None:
            # The whole group dies whatever happened. The leader is not reaped before the kill,
            # so its pid (= the group id) cannot have been reused by then.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            proc.stdout.close()
        shutil.rmtree(workdir, ignore_errors=True)
        result.seconds = time.monotonic() - start
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending SIGALRM fires here
    return result


def _collect(result: SandboxResult, out: bytes, returncode: int | None) -> None:
    """Fill ``result`` from the child's JSON lines (anything else is skipped)."""
    import json

    for line in out.split(b"\n"):
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        i, error = msg.get("i"), msg.get("error")
        if i is None:
            if isinstance(error, str) and result.error is None:
                result.error = error
        elif type(i) is int and 0 <= i < len(result.values):
            if "value" in msg:
                result.values[i], result.errors[i] = msg["value"], None
            elif isinstance(error, str):
                result.errors[i] = error
    missing = [i for i, e in enumerate(result.errors) if e == "no result"]
    if missing and result.error is None:
        result.error = _exit_reason(returncode)
    for i in missing:
        result.errors[i] = result.error


def _exit_reason(returncode: int | None) -> str:
    import signal

    if returncode is not None and returncode < 0:
        sig = -returncode
        if sig == signal.SIGXCPU:
            return "timeout (CPU limit)"
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return f"sandbox killed by {name}"
    return f"sandbox exited (code {returncode}) before returning every result"


# ----- child side (this file run as a script) -------------------------------------------------
# It imports nothing beyond what Python has loaded at start-up (``marshal``, ``os``, ``sys``) plus
# ``resource`` and ``ctypes``: ``json`` alone (through ``re``) would double the start-up time.

def _child_main() -> None:
    """Read the request, fence the process in, run the code, send one JSON line per input."""
    import marshal

    if not os.path.isfile(_REQUEST_FILE):  # run by hand: say what this file is instead of a traceback
        sys.stderr.write(f"{__file__} is the sandbox's child process, started by llm_envs.sandbox.run_function in "
                         f"a directory holding {_REQUEST_FILE}; it has nothing to run here.\n")
        sys.exit(2)
    with open(_REQUEST_FILE, "rb") as f:
        req = marshal.load(f)  # written by the parent: trusted
    os.remove(_REQUEST_FILE)
    channel = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    limit = req["max_output_bytes"]

    def send(i: int | None, value=None, error: str | None = None) -> None:
        head = "{" if i is None else '{"i": %d, ' % i
        if error is None:
            try:
                body = '"value": ' + _dump(value, limit)
            except BaseException as exc:  # noqa: BLE001 -- the value's own code may raise anything
                body = '"error": ' + _dump(f"bad return value: {_describe(exc)}", limit)
        else:
            body = '"error": ' + _dump(error, limit)
        os.write(channel, (head + body + "}\n").encode())

    code = req["code"]
    sys.path.extend(req["paths"])
    words = set()
    for line in code.splitlines():
        if "import" in line:
            words.update("".join(c if c.isalnum() or c == "_" else " " for c in line).split())
    for name in ALLOWED_MODULES:
        if set(name.split(".")) <= words:
            try:
                __import__(name)
            except Exception:  # not installed: the code's own import will say so
                pass
    import warnings

    warnings.simplefilter("ignore")  # formatting a warning reads source files, which is refused
    try:
        confine(req["cpu_seconds"], req["memory_bytes"])
        sys.addaudithook(_make_hook())
    except Exception as exc:
        send(None, error=f"sandbox setup failed: {_describe(exc)}")
        os._exit(1)

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<model code>", "exec"), namespace)
    except SyntaxError as exc:
        send(None, error=f"syntax error: {exc.msg} (line {exc.lineno})")
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 -- SystemExit too: the run must report
        send(None, error=f"exception while defining: {_describe(exc)}")
        os._exit(0)
    func = namespace.get(req["function"])
    if not callable(func):
        send(None, error=f"code defines no function {req['function']!r}")
        os._exit(0)
    for i, arg in enumerate(req["inputs"]):
        try:
            value = func(marshal.loads(arg))  # a fresh copy per call
        except BaseException as exc:  # noqa: BLE001
            send(i, error=f"exception: {_describe(exc)}")
        else:
            send(i, value)
    os._exit(0)  # skips atexit handlers the code may have registered


def confine(cpu_seconds: int, memory_bytes: int) -> None:
    """Fences 2-4 of the module docstring, applied to the calling process (the child; tests call
    it too, to see what the kernel enforces here)."""
    import resource

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except Exception:  # no ctypes: the other fences still stand
        libc = None
    if os.geteuid() == 0:
        # Best effort (a container may refuse namespaces): the audit hook also refuses sockets
        # and writes.
        if libc is not None and libc.unshare(_CLONE_NEWNET | _CLONE_NEWNS) == 0:
            _read_only_mounts(libc)
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
    if libc is not None:
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for which, soft, hard in [
        (resource.RLIMIT_CPU, cpu_seconds, cpu_seconds + 1),
        (resource.RLIMIT_AS, memory_bytes, memory_bytes),
        (resource.RLIMIT_FSIZE, 1 << 20, 1 << 20),
        (resource.RLIMIT_NOFILE, 32, 32),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, 0, 0),
    ]:
        resource.setrlimit(which, (soft, hard))


def _read_only_mounts(libc) -> None:
    """In a fresh mount namespace: make every mount private, then read-only and noexec (local to
    this namespace; the rest of the machine keeps its mounts as they were). No new mount is
    created, and nothing happens unless the namespace is private, so nothing propagates out."""
    import codecs

    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return
    with open("/proc/self/mountinfo", "rb") as f:
        points = [codecs.escape_decode(line.split()[4])[0] for line in f]  # octal escapes: \040
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    for point in points:
        libc.mount(None, point, None, flags, None)


def _make_hook():
    """The audit hook. It never calls back into objects the code made (no ``__fspath__``, no
    ``__eq__`` of a ``str`` subclass), so the code cannot run inside it or reach its state."""
    blocked, prefixes = _BLOCKED_EVENTS, _BLOCKED_PREFIXES

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            if type(args[0]) is not int:  # fds already open (/dev/null, the channel) are fine
                raise PermissionError("sandbox: opening files is not allowed")
        elif event == "import":
            raise ModuleNotFoundError(f"sandbox: module {args[0]!r} is not available; "
                                      f"allowed: {', '.join(ALLOWED_MODULES)}")
        elif event in blocked or event.startswith(prefixes):
            raise PermissionError(f"sandbox: {event} is not allowed")

    return hook


def _dump(obj, limit: int, depth: int = 0) -> str:
    """A minimal JSON encoder (the ``json`` module is too slow to import): nested lists and tuples
    of ints, finite floats, bools, ``None`` and strings; numpy arrays and scalars through
    ``tolist``/``__index__``. Raises ``ValueError`` past ``limit`` characters or 100 levels."""
    if depth > 100:
        raise ValueError("nested too deeply")
    if obj is None or obj is True or obj is False:
        return {None: "null", True: "true", False: "false"}[obj]
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        if obj != obj or obj in (float("inf"), float("-inf")):
            raise ValueError("non-finite float")
        return float.__repr__(obj)
    if isinstance(obj, str):
        text = str.__str__(obj)
        if len(text) > limit:
            raise ValueError("result too large")
        return '"' + "".join(c if " " <= c <= "~" and c not in '"\\' else "\\u%04x" % ord(c)
                             if ord(c) < 0x10000 else "?" for c in text) + '"'
    if isinstance(obj, (list, tuple)):
        parts, size = [], 0
        for item in obj:
            part = _dump(item, limit, depth + 1)
            size += len(part) + 1
            if size > limit:
                raise ValueError("result too large")
            parts.append(part)
        return "[" + ",".join(parts) + "]"
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return _dump(obj.tolist(), limit, depth + 1)
    if hasattr(obj, "__index__"):
        return _dump(int(obj.__index__()), limit, depth + 1)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _describe(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except BaseException:  # noqa: BLE001 -- a hostile __str__
        text = "exception"
    return text[:300]


if __name__ == "__main__":
    _child_main()
