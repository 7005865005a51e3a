"""The child side of the python sandbox: set up every kernel protection, then run the untrusted program.

Executed as a script (``python -s -P -B child.py CONFIG_JSON``; bubblewrap shows it as
``/.horizonrl/sandbox_child.py``) by :func:`horizonrl.envs.sandbox.run_python`, directly
(``rlimit`` backend) or inside bubblewrap (``bwrap``). Standard library only, imports nothing
from horizonrl. In order:

1. ``PR_SET_PDEATHSIG`` = SIGKILL: the child dies with the thread that started it
   (and exits at once if that parent is already gone);
2. read the program from stdin, then point stdin at ``/dev/null``;
3. private namespaces (mount, plus network/IPC/UTS for ``rlimit``; inside a new user
   namespace when not root) and a size- and inode-capped tmpfs (``nosuid,nodev,noexec``)
   mounted on the working directory: disk bytes and files are kernel-enforced; paths
   Python needs that bwrap bound below the working directory (a venv under ``/tmp``)
   are bound read-only again on top of it, or the launcher exits with code 125;
4. rlimits: CPU (soft = hard under bwrap, where the program is pid 1 and SIGXCPU
   is ignored), address space, file size, open files, core, and ``RLIMIT_NPROC``
   where it binds (a non-root uid, counted in the child's own user namespace);
5. no_new_privs; Landlock (reads only below the paths Python needs, writes only in
   the working directory, no TCP, no abstract sockets or signals out of the domain,
   no device ioctls; as much as the kernel's ABI offers); all capabilities dropped;
6. a seccomp filter (x86-64) that refuses process creation, mode/owner/xattr/time
   changes, sockets other than connected pairs, SysV/POSIX IPC, memfd, mounts,
   namespaces, ptrace, pid-addressed syscalls aimed at other processes, clearing the
   parent-death signal, and (when no thread limit could be set) threads;
7. every file descriptor above 2 closed, then a best-effort audit hook that turns
   refusals into readable errors (not a security boundary: everything it refuses
   is refused by the kernel layers above as well).

The layers that took effect are written to stderr as one ``_MARKER`` line (JSON) just
before the program starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import struct
import sys

_MARKER = "__horizonrl_sandbox__ "
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_THREAD = 0x10000000, 0x40000000, 0x00010000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND = 1, 32, 4096
# Linux statvfs flag (ST_NOSUID, NODEV, NOEXEC, NOATIME, NODIRATIME, RELATIME) -> mount flag: a read-only
# remount restates these (the kernel refuses to clear locked ones); ST_RDONLY is 1
_KEPT_FLAGS = {2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
_SETUP_FAILED = 125  # exit code of a launcher that could not set up the sandbox it was asked for
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 1, 38, 22
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

# x86-64 syscalls a sandboxed program never needs (EPERM)
_DENY_X86_64 = (
    57, 58, 59, 322,  # fork vfork execve execveat
    101, 310, 311, 312, 424, 438, 440, 448,  # ptrace process_vm_* kcmp pidfd_* process_madvise/mrelease
    165, 166, 155, 161, 272, 308, 428, 429, 430, 431, 432, 433, 442,  # mount ... chroot unshare setns
    175, 313, 176, 246, 320, 169, 167, 168, 163, 103,  # modules, kexec, reboot, swap, acct, syslog
    164, 227, 159, 305, 170, 171, 172, 173, 179,  # clocks, host/domain name, iopl/ioperm, quotactl
    321, 298, 323, 250, 248, 249, 303, 304, 135, 212,  # bpf perf userfaultfd keys handles personality
    425, 426, 427, 133, 259, 200,  # io_uring mknod mknodat tkill
    90, 91, 92, 93, 94, 260, 268, 452,  # chmod fchmod chown fchown lchown fchownat fchmodat fchmodat2
    188, 189, 190, 197, 198, 199, 463, 466,  # set/remove xattr (also the *at forms)
    132, 235, 261, 280,  # utime utimes futimesat utimensat
    41, 42, 43, 49, 50, 288, 46, 307,  # socket connect accept bind listen accept4 sendmsg sendmmsg
    29, 30, 31, 67, 64, 65, 66, 220, 68, 69, 70, 71,  # SysV shm, semaphores, message queues
    240, 241, 242, 243, 244, 245, 319,  # POSIX message queues, memfd_create
    251, 256, 279,  # ioprio_set migrate_pages move_pages
)  # fmt: skip
_CLONE, _CLONE3, _PRCTL, _SENDTO, _SETPRIORITY = 56, 435, 157, 44, 141
# syscalls whose pid argument (index 0) must name this process: kill tgkill rt_sigqueueinfo
# rt_tgsigqueueinfo (no 0: that is the process group), prlimit64 and the scheduler calls (0 = self)
_SELF_ONLY_X86_64 = {62: False, 234: False, 129: False, 297: False,
                     302: True, 203: True, 142: True, 144: True, 314: True}  # fmt: skip
# Audit events refused outright, and events whose path arguments must stay inside the working directory:
# event -> ((path argument index, dir_fd argument index or None), ...)
_AUDIT_DENY = frozenset((
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen",
    "os.killpg", "pty.spawn", "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
    "resource.setrlimit", "resource.prlimit",
))  # fmt: skip
_AUDIT_PATHS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
    "os.truncate": ((0, None),), "os.utime": ((0, 3),), "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),), "shutil.rmtree": ((0, 1),), "sqlite3.connect": ((0, None),),
}  # fmt: skip


def main(cfg_json: str) -> None:
    """Set up every protection that this kernel allows, report them on stderr, then run the program.

    ``cfg``: ``workdir``, ``parent`` (pid that must still be our parent, or None), ``host_root``
    (the trainer runs as uid 0 of the host, which ``RLIMIT_NPROC`` never binds),
    ``netns`` (unshare the network here), ``tmpfs`` (mount the capped tmpfs),
    ``read_paths`` (what Python needs, for Landlock), ``rebind`` (those of them below
    ``workdir``, bound there read-only by bwrap, to bind again over the tmpfs),
    ``thread_limit`` (``cgroup`` when the host put us in a pids cgroup) and the
    :class:`SandboxLimits` fields.
    """
    cfg = json.loads(cfg_json)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    active = ["process"]
    if _ccall(libc.prctl, _PR_SET_PDEATHSIG, 9, 0, 0, 0) == 0:
        active.append("proc:pdeathsig")
    if cfg["parent"] is not None and os.getppid() != cfg["parent"]:
        os._exit(_SETUP_FAILED)  # the parent died before the signal was armed
    code = sys.stdin.buffer.read().decode("utf-8", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    workdir = cfg["workdir"]
    own_userns, ns_layers = _namespaces(libc, cfg)
    active += ns_layers
    if cfg["tmpfs"] and _mount_tmpfs(libc, workdir, cfg["max_disk_mb"], cfg["max_files"], cfg["rebind"]):
        active.append("fs:tmpfs")
    os.chdir(workdir)
    limited, layers = _set_rlimits(cfg, own_userns)
    active += layers
    threads = "cgroup" if cfg["thread_limit"] == "cgroup" else "rlimit" if limited else None
    _ccall(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    active += _landlock(libc, workdir, cfg["read_paths"])
    active += ["caps:dropped"] if _drop_capabilities(libc) else []
    if _seccomp(libc, allow_threads=threads is not None):
        active += ["proc:seccomp"] + ([] if threads else ["proc:no-threads"])
    active += [f"proc:threads-{threads}"] if threads else []
    os.closerange(3, 1 << 16)
    _install_audit_hook(workdir)
    active += ["proc:audit", "net:audit", "fs:audit"]
    sys.stderr.write(_MARKER + json.dumps(active) + "\n")
    sys.stderr.flush()
    _exec_program(code)


def _ccall(fn, *args):
    """Call a variadic C function (syscall, prctl, mount) with integer arguments widened to ``long``."""
    return fn(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _namespaces(libc, cfg: dict) -> tuple[bool, list[str]]:
    """Unshare the mount namespace (+ network, IPC, UTS when ``netns``); (own user namespace?, layers).

    Root (or bwrap's user namespace with CAP_SYS_ADMIN) unshares directly; other users
    do it inside a new user namespace that maps only their own uid and gid.
    """
    want = _CLONE_NEWNS | (_CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS if cfg["netns"] else 0)
    got, own_userns = 0, False
    if libc.unshare(want) == 0:
        got = want
    elif os.geteuid() != 0 and libc.unshare(_CLONE_NEWUSER) == 0:
        own_userns = True
        _map_ids(os.getuid(), os.getgid())
        got = want if libc.unshare(want) == 0 else 0
    if got == 0:
        for flag in (_CLONE_NEWNS, _CLONE_NEWNET, _CLONE_NEWIPC, _CLONE_NEWUTS):
            if want & flag and libc.unshare(flag) == 0:
                got |= flag
    names = {_CLONE_NEWNS: "fs:mount-namespace", _CLONE_NEWNET: "net:namespace",
             _CLONE_NEWIPC: "ipc:namespace", _CLONE_NEWUTS: "uts:namespace"}  # fmt: skip
    layers = (["user:namespace"] if own_userns else []) + [n for f, n in names.items() if got & f]
    return own_userns, layers


def _map_ids(uid: int, gid: int) -> None:
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with contextlib.suppress(OSError):
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)


def _mount_tmpfs(libc, workdir: str, disk_mb: int, files: int, rebind: list[str]) -> bool:
    """Mount a tmpfs of ``disk_mb`` MB and ``files`` inodes on ``workdir`` (after making / private).

    ``rebind``: read-only paths below ``workdir`` (bwrap's binds of a venv or an
    interpreter under ``/tmp``) that the tmpfs covers; each is bound again, read-only,
    at the same place on top of it (:func:`_bind_read_only`). Their mount points and
    parent directories are inodes of the tmpfs beyond ``files``.
    """
    if _ccall(libc.mount, None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return False
    held: list[tuple[str, int]] = []
    try:
        for path in rebind:  # a handle on each bind before the tmpfs covers it
            try:
                held.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
            except OSError as e:
                _setup_failed(f"{path} is not in the sandbox ({e.strerror})")
        points = set()  # the mount points and the directories above them, up to workdir
        for path in rebind:
            rel = os.path.relpath(path, workdir).split(os.sep)
            points.update(os.path.join(workdir, *rel[: i + 1]) for i in range(len(rel)))
        opts = f"size={disk_mb << 20},nr_inodes={files + 1 + len(points)},mode=0700".encode()  # + the root
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if _ccall(libc.mount, b"tmpfs", os.fsencode(workdir), b"tmpfs", flags, opts) != 0:
            return False  # bwrap's own tmpfs stays, with the binds on it
        for path, fd in held:
            _bind_read_only(libc, fd, path)
        return True
    finally:
        for _, fd in held:
            os.close(fd)


def _bind_read_only(libc, fd: int, path: str) -> None:
    """Bind what ``fd`` (an ``O_PATH`` handle) is at ``path``, recursively, read-only; exit if that fails.

    The mount point (and its parents) is made in the tmpfs; the bind keeps the
    read-only flag of bwrap's ``--ro-bind`` and is remounted read-only besides. Every
    mount at or below ``path`` must then be read-only, else the launcher exits.
    """
    source = f"/proc/self/fd/{fd}"
    try:
        if os.path.isdir(source):
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    except OSError as e:
        _setup_failed(f"cannot make the mount point {path} ({e.strerror})")
    target = os.fsencode(path)
    if _ccall(libc.mount, os.fsencode(source), target, None, _MS_BIND | _MS_REC, None) != 0:
        _setup_failed(f"cannot bind {path} read-only ({os.strerror(ctypes.get_errno())})")
    kept = sum(m for st, m in _KEPT_FLAGS.items() if os.statvfs(path).f_flag & st)
    _ccall(libc.mount, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | kept, None)
    writable = [p for p, opts in _mounts() if (p == path or p.startswith(path + "/")) and "ro" not in opts]
    if writable or not os.statvfs(path).f_flag & 1:  # ST_RDONLY
        _setup_failed(f"{(writable or [path])[0]} would be writable in the sandbox")


def _mounts() -> list[tuple[str, list[str]]]:
    """(mount point, per-mount options) of every mount in this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split(" ")
            point = fields[4]
            for esc, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
                point = point.replace(esc, char)
            out.append((point, fields[5].split(",")))
    return out


def _setup_failed(why: str) -> None:
    """Say why the sandbox could not be set up (never run the program without it) and exit."""
    sys.stderr.write(f"horizonrl sandbox setup failed: {why}\n")
    sys.stderr.flush()
    os._exit(_SETUP_FAILED)


def _set_rlimits(cfg: dict, own_userns: bool) -> tuple[bool, list[str]]:
    """Lower the soft and hard limits (never above the current hard ones); (threads limited?, names set).

    ``RLIMIT_NPROC`` counts the tasks of the real uid *in the caller's user namespace*
    and never binds uid 0 of the host, so it is set only for other uids: the baseline
    is 1 in a user namespace of our own, else the uid's tasks visible in /proc.
    """
    import resource as r

    mem, fsize, cpu = cfg["memory_mb"] << 20, cfg["max_file_mb"] << 20, cfg["cpu_s"]
    wanted = {
        "cpu": (r.RLIMIT_CPU, cpu, cpu if os.getpid() == 1 else cpu + 1), "as": (r.RLIMIT_AS, mem, mem),
        "fsize": (r.RLIMIT_FSIZE, fsize, fsize), "core": (r.RLIMIT_CORE, 0, 0),
        "nofile": (r.RLIMIT_NOFILE, 256, 256),
    }  # fmt: skip
    if not cfg["host_root"]:
        tasks = 1 if own_userns else _count_tasks(os.getuid())
        wanted["nproc"] = (r.RLIMIT_NPROC, tasks + cfg["max_procs"], tasks + cfg["max_procs"])
    active = []
    for name, (res, soft, hard) in wanted.items():
        cur_hard = r.getrlimit(res)[1]
        if cur_hard != r.RLIM_INFINITY:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        with contextlib.suppress(ValueError, OSError):
            r.setrlimit(res, (soft, hard))
            active.append(f"rlimit:{name}")
    return "rlimit:nproc" in active, active


def _count_tasks(uid: int) -> int:
    tasks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}").st_uid == uid:
                tasks += len(os.listdir(f"/proc/{pid}/task"))
    return tasks


def _landlock(libc, workdir: str, read_paths: list[str]) -> list[str]:
    """Landlock: read only below ``read_paths``, write only in ``workdir``; TCP, scopes, ioctls by ABI."""
    abi = _ccall(libc.syscall, 444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, VERSION)
    if abi < 1:
        return []
    execute, read_file, read_dir = 1 << 0, 1 << 2, 1 << 3
    write_fs = (
        1 << 1 | 0b111_1111 << 4
    )  # WRITE_FILE REMOVE_DIR REMOVE_FILE MAKE_{CHAR,DIR,REG,SOCK,FIFO,BLOCK,SYM}
    write_fs |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)  # REFER TRUNCATE
    ioctl = 1 << 15 if abi >= 5 else 0  # IOCTL_DEV
    read_fs = execute | read_file | read_dir
    handled = read_fs | write_fs | ioctl
    net = 0b11 if abi >= 4 else 0  # BIND_TCP CONNECT_TCP
    scoped = 0b11 if abi >= 6 else 0  # ABSTRACT_UNIX_SOCKET SIGNAL
    attr = struct.pack("<QQQ", handled, net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _ccall(libc.syscall, 444, attr, len(attr), 0)
    if ruleset < 0:
        return []
    file_rights = execute | read_file | 1 << 1 | 1 << 14 | ioctl  # rights that apply to a non-directory
    rules = [(workdir, handled), ("/proc/self", read_file | read_dir)]
    rules += [(p, read_fs) for p in read_paths]
    rules += [(os.devnull, read_file | 1 << 1 | (1 << 14 if abi >= 3 else 0))]
    rules += [(p, read_file) for p in ("/dev/urandom", "/dev/random", "/dev/zero")]
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    access &= file_rights
                rule = struct.pack("<Qi", access, fd)  # struct landlock_path_beneath_attr
                _ccall(libc.syscall, 445, ruleset, 1, rule, 0)  # LANDLOCK_RULE_PATH_BENEATH
            finally:
                os.close(fd)
        if _ccall(libc.syscall, 446, ruleset, 0) != 0:
            return []
    finally:
        os.close(ruleset)
    return (["fs:landlock", "fs:landlock-read"] + (["net:landlock"] if net else [])
            + (["signal:landlock"] if scoped else []))  # fmt: skip


def _drop_capabilities(libc) -> bool:
    """Clear the effective, permitted and inheritable capabilities (also those held in a user namespace)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    return libc.capset(header, data) == 0


def seccomp_program(pid: int, *, allow_threads: bool) -> bytes:
    """The x86-64 BPF filter (see the module docstring); ``pid`` is the only process signals may reach."""
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050001, 0x00050026

    def ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("<HBBI", code, jt, jf, k)

    def args_in(nr: int, checks: list[tuple[int, tuple[int, ...]]]) -> list[bytes]:
        """Allow ``nr`` only if every checked 32-bit word (offset into seccomp_data) is one of its values."""
        body = []
        for offset, values in checks:
            body.append(ins(ld, offset))
            body += [ins(jeq, v, len(values) - j, 0) for j, v in enumerate(values)]
            body.append(ins(ret, eperm))
        body.append(ins(ret, allow))
        return [ins(jeq, nr, 0, len(body)), *body]

    prog = [ins(ld, 4), ins(jeq, 0xC000003E, 1, 0), ins(ret, 0x80000000), ins(ld, 0)]  # arch check, nr
    prog += [ins(0x35, 0x40000000, 0, 1), ins(ret, eperm)]  # jge: the x32 ABI
    for nr in _DENY_X86_64:
        prog += [ins(jeq, nr, 0, 1), ins(ret, eperm)]
    prog += [ins(jeq, _CLONE3, 0, 1), ins(ret, enosys)]  # glibc falls back to clone for threads
    if allow_threads:  # clone: only threads (CLONE_THREAD in the low word of argument 0)
        prog += [ins(jeq, _CLONE, 0, 4), ins(ld, 16), ins(jset, _CLONE_THREAD, 0, 1), ins(ret, allow)]
        prog += [ins(ret, eperm)]
    else:
        prog += [ins(jeq, _CLONE, 0, 1), ins(ret, eperm)]
    for nr, zero_ok in _SELF_ONLY_X86_64.items():
        prog += args_in(nr, [(16, (0, pid) if zero_ok else (pid,))])
    prog += args_in(_SETPRIORITY, [(16, (0,)), (24, (0, pid))])  # PRIO_PROCESS of this process only
    prog += args_in(_SENDTO, [(48, (0,)), (52, (0,))])  # no destination address
    prog += [ins(jeq, _PRCTL, 0, 3), ins(ld, 16), ins(jeq, _PR_SET_PDEATHSIG, 0, 1), ins(ret, eperm)]
    prog.append(ins(ret, allow))
    return b"".join(prog)


def _seccomp(libc, *, allow_threads: bool) -> bool:
    """Install :func:`seccomp_program`; False on other architectures or failure."""
    if os.uname().machine != "x86_64":
        return False
    prog = seccomp_program(os.getpid(), allow_threads=allow_threads)

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    fprog = Fprog(len(prog) // 8, prog)
    return _ccall(libc.prctl, _PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0) == 0  # SECCOMP_MODE_FILTER


def _install_audit_hook(workdir: str) -> None:
    """Refuse process creation, sockets (except local pairs), ctypes calls and writes outside ``workdir``."""
    root, me = os.path.realpath(workdir), os.getpid()

    def inside(path, dir_fd=None) -> bool:
        try:
            if isinstance(path, int):
                full = os.readlink(f"/proc/self/fd/{path}")
            else:
                p = os.fsdecode(path)
                rel = isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(p)
                base = os.readlink(f"/proc/self/fd/{dir_fd}") if rel else os.getcwd()
                full = os.path.realpath(os.path.join(base, p))
        except (OSError, TypeError, ValueError):
            return False
        return full == root or full.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event in _AUDIT_DENY:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event.startswith("socket."):
            if event != "socket.__new__" or args[1] != 1:  # AF_UNIX sockets exist only as connected pairs
                raise PermissionError("sandbox: network access is disabled")
        elif event == "os.kill" and args[0] != me:
            raise PermissionError("sandbox: signals to other processes are not allowed")
        elif event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else (flags or 0) & _WRITE_FLAGS
            if writes and path is not None and not isinstance(path, int) and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} outside the working directory is refused")
        elif event in _AUDIT_PATHS:
            for i, d in _AUDIT_PATHS[event]:
                if not inside(args[i], args[d] if d is not None else None):
                    raise PermissionError(f"sandbox: {event} on {args[i]!r} outside the working directory")

    sys.addaudithook(hook)


def _exec_program(code: str) -> None:
    """Run ``code`` as ``__main__``; on an exception print its traceback (minus sandbox frames) and exit 1."""
    import linecache
    import traceback
    import types

    linecache.cache["<python>"] = (len(code), None, code.splitlines(True), "<python>")
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    sys.argv = ["<python>"]
    try:
        exec(compile(code, "<python>", "exec"), main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        main_module.__dict__.clear()  # release what the program allocated before formatting the traceback
        te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
        sys.stderr.write("".join(te.format()))
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
