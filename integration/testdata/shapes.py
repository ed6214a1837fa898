# Process shapes for the L3 suite (integration/l3_shapes_test.go). `python3 shapes.py NAME...`
# starts each shape as its own process tree and returns; every shape reports
# "<count> ok" (or "<count> FAIL <why>") in /tmp/shapes/<name> about every 50 ms, checking
# its own invariant (sequence numbers through a pipe, echoes over a connection, the content
# of a deleted file, ...). A shape that breaks stops counting and says why.
import ctypes
import mmap
import os
import pty
import signal
import socket
import struct
import sys
import threading
import time

D = "/tmp/shapes"
TICK = 0.05
libc = ctypes.CDLL(None, use_errno=True)


def name_process(name):
    libc.prctl(15, ("shape-" + name)[:15].encode(), 0, 0, 0)  # PR_SET_NAME


def report(name, n, state="ok"):
    tmp = "%s/.%s" % (D, name)
    with open(tmp, "w") as f:
        f.write("%d %s\n" % (n, state))
    os.rename(tmp, "%s/%s" % (D, name))


def fail(name, n, why):
    report(name, n, "FAIL " + str(why).replace("\n", " "))
    while True:
        time.sleep(1)


def devnull_stdio():
    fd = os.open("/dev/null", os.O_RDWR)
    for i in (0, 1, 2):
        os.dup2(fd, i)
    if fd > 2:
        os.close(fd)


def daemonize(name, fn):
    """Double fork: the first child calls setsid and exits, the shape is reparented to init
    in a session whose leader is gone."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull_stdio()
            name_process(name)
            try:
                fn(name)
            except Exception as e:  # a broken shape says why
                fail(name, -1, repr(e))
            os._exit(0)
        os._exit(0)
    os.wait()


def counter(name, step=None):
    n = 0
    while True:
        n += 1
        if step:
            step(n)
        report(name, n)
        time.sleep(TICK)


# --- shapes that restore ---------------------------------------------------------------

def shape_daemon(name):
    counter(name)


def shape_pgroup(name):
    # a process whose process group leader exited (CRIU adds a group helper)
    if os.fork() == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            name_process(name)
            counter(name)
        os._exit(0)
    os.wait()
    while True:
        time.sleep(1)


def shape_session(name):
    # a live session leader with a child in its own process group and a grandchild in it
    os.setsid()
    sid = os.getsid(0)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            name_process(name)
            counter(name, lambda n: os.getsid(0) == sid or fail(name, n, "sid changed"))
        os.wait()
        os._exit(0)
    os.waitpid(pid, 0)


def shape_pipe(name):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        i = 0
        while True:
            i += 1
            os.write(w, struct.pack("<Q", i))
            time.sleep(TICK)
    os.close(w)
    last = 0
    while True:
        b = os.read(r, 8)
        if len(b) != 8:
            fail(name, last, "short read %r" % b)
        (v,) = struct.unpack("<Q", b)
        if v != last + 1:
            fail(name, last, "pipe gave %d after %d" % (v, last))
        last = v
        report(name, v)


def shape_socketpair(name):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.fork() == 0:
        a.close()
        while True:
            data = b.recv(8)
            if not data:
                os._exit(0)
            (v,) = struct.unpack("<Q", data)
            b.sendall(struct.pack("<Q", v * 2))
    b.close()
    i = 0
    while True:
        i += 1
        a.sendall(struct.pack("<Q", i))
        (v,) = struct.unpack("<Q", a.recv(8))
        if v != 2 * i:
            fail(name, i, "echo %d for %d" % (v, i))
        report(name, i)
        time.sleep(TICK)


def echo_server(listener):
    def serve(c):
        f = c.makefile("rwb", buffering=0)
        for line in f:
            f.write(line)
    while True:
        c, _ = listener.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def exchange_loop(name, connect):
    conn = connect()
    f = conn.makefile("rwb", buffering=0)
    i = 0
    while True:
        i += 1
        f.write(b"%d\n" % i)
        got = f.readline()
        if got != b"%d\n" % i:
            fail(name, i, "established connection answered %r to %d" % (got, i))
        if i % 10 == 0:  # the listener still accepts
            c = connect()
            c.sendall(b"new\n")
            if c.makefile("rb").readline() != b"new\n":
                fail(name, i, "new connection not served")
            c.close()
        report(name, i)
        time.sleep(TICK)


def shape_tcp(name):
    # a listening socket and an established loopback connection between two processes
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 7007))
    srv.listen(16)
    if os.fork() == 0:
        echo_server(srv)
    srv.close()
    exchange_loop(name, lambda: socket.create_connection(("127.0.0.1", 7007)))


def shape_unix(name):
    # a daemonized server on a path-bound unix socket and a client process
    path = "/tmp/shape-unix.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(16)
    if os.fork() == 0:
        echo_server(srv)
    srv.close()

    def connect():
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        return c
    exchange_loop(name, connect)


def shape_deleted(name):
    data = bytes(range(256)) * 1024  # 256 KiB, under CRIU's ghost file limit
    fd = os.open("/tmp/shape-deleted", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, data)
    os.unlink("/tmp/shape-deleted")

    def check(n):
        if os.pread(fd, len(data) + 1, 0) != data:
            fail(name, n, "content of the deleted file changed")
    counter(name, check)


def shape_pty(name):
    # a pty pair: a child with the slave as controlling terminal and stdio, the parent reads
    # the master; plus /dev/null fds (every daemonized shape has those)
    master, slave = pty.openpty()
    if os.fork() == 0:
        os.close(master)
        os.setsid()
        import fcntl
        import termios
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for i in (0, 1, 2):
            os.dup2(slave, i)
        i = 0
        while True:
            i += 1
            os.write(1, b"%d\n" % i)
            time.sleep(TICK)
    os.close(slave)
    last, buf = 0, b""
    while True:
        buf += os.read(master, 1024)
        *lines, buf = buf.split(b"\n")
        for line in lines:
            v = int(line.strip())
            if v != last + 1:
                fail(name, last, "tty gave %d after %d" % (v, last))
            last = v
        report(name, last)


def shape_threads(name):
    counts = [0] * 4

    def run(i):
        while True:
            counts[i] += 1
            time.sleep(TICK)
    for i in range(4):
        threading.Thread(target=run, args=(i,), daemon=True).start()
    while True:
        report(name, min(counts))
        time.sleep(TICK)


class itimerspec(ctypes.Structure):
    _fields_ = [("interval_sec", ctypes.c_long), ("interval_nsec", ctypes.c_long),
                ("value_sec", ctypes.c_long), ("value_nsec", ctypes.c_long)]


def shape_timers(name):
    # a periodic timerfd and a setitimer(ITIMER_REAL) with a SIGALRM handler
    alarms = [0]
    signal.signal(signal.SIGALRM, lambda *_: alarms.__setitem__(0, alarms[0] + 1))
    signal.setitimer(signal.ITIMER_REAL, TICK, TICK)
    tfd = libc.timerfd_create(1, 0)  # CLOCK_MONOTONIC
    spec = itimerspec(0, int(TICK * 1e9), 0, int(TICK * 1e9))
    if tfd < 0 or libc.timerfd_settime(tfd, 0, ctypes.byref(spec), None) != 0:
        fail(name, 0, "timerfd: errno %d" % ctypes.get_errno())
    fired = 0
    while True:
        (k,) = struct.unpack("<Q", os.read(tfd, 8))
        fired += k
        report(name, min(fired, alarms[0]))


def shape_shm(name):
    # a memfd, a SysV and a POSIX shared memory segment written by a child, read by the parent
    mfd = os.memfd_create("shape")
    os.ftruncate(mfd, 4096)
    memfd = mmap.mmap(mfd, 4096)
    libc.shmat.restype = ctypes.c_void_p
    shmid = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    addr = libc.shmat(shmid, None, 0)
    if shmid < 0 or addr in (None, ctypes.c_void_p(-1).value):
        fail(name, 0, "shmget/shmat: errno %d" % ctypes.get_errno())
    sysv = ctypes.c_uint64.from_address(addr)
    pfd = os.open("/dev/shm/shape-posix", os.O_RDWR | os.O_CREAT, 0o600)  # what shm_open does
    os.ftruncate(pfd, 4096)
    posix = mmap.mmap(pfd, 4096)
    if os.fork() == 0:
        i = 0
        while True:
            i += 1
            memfd[0:8] = struct.pack("<Q", i)
            sysv.value = i
            posix[0:8] = struct.pack("<Q", i)
            time.sleep(TICK)
    while True:
        vals = (struct.unpack("<Q", memfd[0:8])[0], sysv.value, struct.unpack("<Q", posix[0:8])[0])
        report(name, min(vals))
        time.sleep(TICK)


def shape_cwd(name):
    os.makedirs("/tmp/shape-cwd/deep", exist_ok=True)
    os.chdir("/tmp/shape-cwd/deep")

    def check(n):
        if os.getcwd() != "/tmp/shape-cwd/deep":
            fail(name, n, "cwd is " + os.getcwd())
        with open("here", "w") as f:
            f.write(str(n))
    counter(name, check)


# --- shapes the dump refuses -----------------------------------------------------------

def shape_inotify(name):
    fd = libc.inotify_init()
    if fd < 0 or libc.inotify_add_watch(fd, b"/tmp", 0x100) < 0:  # IN_CREATE
        fail(name, 0, "inotify: errno %d" % ctypes.get_errno())
    counter(name)


def shape_unixgroup(name):
    # a unix socket server started as `server &` from a shell that exited: its process group
    # leader is gone, so CRIU 4.1.1 would fork a group helper from it
    if os.fork() == 0:
        os.setpgid(0, 0)
        if os.fork() == 0:
            devnull_stdio()
            name_process(name)
            srv = socket.socket(socket.AF_UNIX)
            srv.bind("/tmp/shape-unixgroup.sock")
            srv.listen(1)
            counter(name)
        os._exit(0)
    os.wait()


def main():
    os.makedirs(D, exist_ok=True)
    for name in sys.argv[1:]:
        fn = globals()["shape_" + name]
        if name in ("pgroup", "unixgroup"):
            if os.fork() == 0:  # keep the launcher's session: only the group leader is gone
                devnull_stdio()
                name_process(name + "-p")
                try:
                    fn(name)
                finally:
                    os._exit(0)
            continue
        daemonize(name, fn)


if __name__ == "__main__":
    main()
