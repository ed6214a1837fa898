# A hostile sandbox racing the host's `verify` (which walks the tree while the sandbox runs):
# it swaps checkpointed regular files with a FIFO and with a device node (/dev/kmsg, when
# mknod is allowed) with renameat2(RENAME_EXCHANGE) in a tight loop. A writer blocked on
# the FIFO (through a hard link the swaps do not touch) records in /tmp/v-opened if anything
# ever opens the FIFO for reading: only the host's verify could.
import ctypes, os, platform, stat, sys, time

d = "/tmp/v"
if sys.argv[1:] == ["setup"]:
    os.makedirs(d, exist_ok=True)
    os.makedirs("/tmp/vhold", exist_ok=True)
    for name in ("f", "g"):
        with open(d + "/" + name, "w") as f:
            f.write(name * 4096)
    sys.exit(0)

os.mkfifo("/tmp/vhold/fifo")
os.link("/tmp/vhold/fifo", d + "/x")
try:
    os.mknod(d + "/k", 0o644 | stat.S_IFCHR, os.makedev(1, 11))  # /dev/kmsg
    kind = "device"
except OSError:
    os.mkfifo(d + "/k")
    kind = "fifo"
print(kind, flush=True)
if os.fork():
    sys.exit(0)
os.setsid()
for fd in (0, 1, 2):
    os.close(fd)
if os.fork() == 0:
    fd = os.open("/tmp/vhold/fifo", os.O_WRONLY)  # blocks until a reader opens the FIFO
    with open("/tmp/v-opened", "w") as f:
        f.write("opened\n")
    os._exit(0)
nr = {"x86_64": 316, "aarch64": 276}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
pairs = [((d + "/f").encode(), (d + "/x").encode()), ((d + "/g").encode(), (d + "/k").encode())]
deadline = time.time() + 120
while time.time() < deadline:
    for a, b in pairs:
        libc.syscall(nr, -100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE
