"""How the code sandbox starts a run: bubblewrap, unshare, or a plain process (``launcher``),
the bwrap mounts (``launch_prefix``), the caller-free environment (``sandbox_env``) and the
per-run uid used when the grader is root (``drop_uid``, ``fresh_uid``, ``sweep_uid``).
See ``evals/code/sandbox.py`` for the whole picture."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

from ...core.errors import UserError

ISOLATIONS = ("auto", "bwrap", "unshare", "none")

# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------

_LAUNCHER: dict[str, str] = {}
_LOCK = threading.Lock()


def interpreter() -> str:
    """The Python the sandbox runs: the real file behind ``sys.executable`` (a virtual
    environment's ``bin/python`` is a link into the checkout, which the sandbox does not show;
    the sandbox runs ``-I -S``, no site-packages, so the base interpreter is all it needs)."""
    return os.path.realpath(sys.executable)


_MOUNTS: list[list[str]] = []
_MOUNTS_LOCK = threading.Lock()


def _shared_libraries() -> set[str]:
    """The shared libraries the interpreter and its standard-library extensions load (``ldd``)."""
    import glob
    import sysconfig

    files = [interpreter()] + glob.glob(os.path.join(sysconfig.get_path("stdlib"), "lib-dynload", "*.so"))
    libs: set[str] = set()
    for i in range(0, len(files), 64):
        try:
            out = subprocess.run(["ldd", *files[i : i + 64]], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else (parts[0] if parts else "")
            if path.startswith("/"):
                libs.add(path)
    return libs


def _root_mounts() -> list[str]:
    """bwrap arguments for a root that holds only the interpreter, its standard library (its
    ``site-packages`` covered by an empty tmpfs) and the shared libraries they load, each folder
    read-only; computed once per process."""
    with _MOUNTS_LOCK:
        if _MOUNTS:
            return _MOUNTS[0]
        import sysconfig

        stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
        dirs = {stdlib, os.path.dirname(interpreter())}
        for lib in _shared_libraries():
            dirs.add(os.path.dirname(os.path.realpath(lib)))
            dirs.add(os.path.realpath(os.path.dirname(lib)))  # /lib64 -> /usr/lib64 holds the loader's link
        args: list[str] = []
        # Top-level links (/lib -> usr/lib on merged-/usr systems) keep the paths the loader knows.
        for name in sorted(os.listdir("/")):
            if os.path.islink("/" + name):
                args += ["--symlink", os.readlink("/" + name), "/" + name]
        for d in sorted(dirs):
            if d == os.path.dirname(interpreter()):
                continue  # only the interpreter itself from its bin/
            args += ["--ro-bind", d, d]
        args += ["--ro-bind", interpreter(), interpreter()]
        if os.path.exists("/etc/ld.so.cache"):
            args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
        for extra in sorted(
            {os.path.realpath(os.path.join(stdlib, "site-packages")), os.path.realpath(os.path.join(stdlib, "dist-packages"))}
        ):
            if os.path.isdir(extra):
                args += ["--tmpfs", extra]
        # bwrap creates the folders leading to a bind 0700 on some versions: open them up.
        parents = set()
        for d in dirs | {stdlib}:
            p = os.path.dirname(d)
            while p != "/":
                parents.add(p)
                p = os.path.dirname(p)
        for p in sorted((parents - dirs) | {os.path.dirname(interpreter())}):
            args += ["--chmod", "0755", p]
        _MOUNTS.append(args)
        return args


def launch_prefix(kind: str, workdir: str, disk_mb: int = 64) -> list[str]:
    """The command in front of the interpreter. bwrap: a root holding only the interpreter and
    its standard library (``_root_mounts``); the run folder is a tmpfs of ``disk_mb`` (writes past
    it fail with ENOSPC), sticky and world-writable for the run's uids."""
    if kind == "bwrap":
        args = ["bwrap", *_root_mounts(), "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
        args += [
            "--perms",
            "01777",
            "--size",
            str(int(disk_mb) << 20),
            "--tmpfs",
            workdir,
            "--chdir",
            workdir,
            "--unshare-net",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--die-with-parent",
            "--new-session",
        ]
        if os.geteuid() != 0:
            args += ["--unshare-user"]
        return args + ["--"]
    if kind == "unshare":
        args = ["unshare", "--net", "--pid", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            args += ["--map-root-user"]
        return args + ["--"]
    return []


def _probe(kind: str) -> bool:
    if shutil.which(kind) is None:
        return False
    workdir = tempfile.mkdtemp(prefix="entropyrl-probe-")
    try:
        cmd = launch_prefix(kind, workdir) + [interpreter(), "-I", "-S", "-c", "pass"]
        return (
            subprocess.run(
                cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20, env=sandbox_env(workdir)
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def launcher(isolation: str = "auto") -> str:
    """The launcher used for ``isolation`` on this machine (probed once per process)."""
    if isolation not in ISOLATIONS:
        raise UserError(f"sandbox.isolation={isolation}: valid: {', '.join(ISOLATIONS)}")
    with _LOCK:
        if isolation in _LAUNCHER:
            return _LAUNCHER[isolation]
        if isolation == "none":
            kind = "none"
        elif isolation != "auto":
            if not _probe(isolation):
                raise UserError(
                    f"sandbox.isolation={isolation} does not work here ({isolation} missing, "
                    f"or the kernel refuses namespaces): install bubblewrap "
                    f"(apt-get install bubblewrap) or use sandbox.isolation=auto"
                )
            kind = isolation
        else:
            kind = next((k for k in ("bwrap", "unshare") if _probe(k)), "none")
            if kind != "bwrap":
                warnings.warn(
                    f"code sandbox: bubblewrap unavailable, using '{kind}': "
                    + (
                        "network and pid namespaces only, the filesystem is not read-only"
                        if kind == "unshare"
                        else "NO network or filesystem isolation, only "
                        "rlimits and a private folder; a program can signal the caller's processes"
                    )
                    + " (apt-get install bubblewrap)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        _LAUNCHER[isolation] = kind
        return kind


def sandbox_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def _others_can_run_python() -> bool:
    """Whether another uid can reach the interpreter and its standard library (bwrap makes it
    reachable itself; without bwrap an interpreter under a 0700 home is not)."""
    for p in {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))}:
        while p != "/":
            try:
                if not os.stat(p).st_mode & 0o001:
                    return False
            except OSError:
                return False
            p = os.path.dirname(p)
    return True


def drop_uid(kind: str) -> bool:
    if os.geteuid() != 0:
        return False
    if kind == "bwrap" or _others_can_run_python():
        return True
    if kind == "none":
        # As root, outside any namespace, kill(-1) alone would take the whole machine down.
        raise UserError(
            f"code sandbox: refusing to run untrusted programs as root without namespaces "
            f"({sys.executable} is not reachable by other users, so no unprivileged uid can "
            f"run it): install bubblewrap (apt-get install bubblewrap) or util-linux unshare"
        )
    if not _WARNED_ROOT:
        _WARNED_ROOT.append(True)
        warnings.warn(
            f"code sandbox ({kind}): the interpreter {sys.executable} is not reachable by other "
            f"users, so programs keep running as root (install bubblewrap, or use a Python "
            f"outside /root)",
            RuntimeWarning,
            stacklevel=3,
        )
    return False


_WARNED_ROOT: list[bool] = []


def fresh_uid() -> int:
    # Far above any real account, below the 32-bit "nobody"/overflow ids.
    return random.SystemRandom().randrange(1_500_000_000, 2_000_000_000)


def sweep_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (anything of the run that left the namespace)."""
    try:
        subprocess.run(
            ["kill", "-KILL", "-1"],
            user=uid,
            group=uid,
            extra_groups=[],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=5,
            env={},
        )
    except (OSError, subprocess.SubprocessError):
        pass
