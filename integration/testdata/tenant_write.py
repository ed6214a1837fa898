# Tenant A of TestEscapeTenantResidue: leaves a secret everywhere outside the overlay that
# outlives a process: tmpfs files, System V IPC objects, a POSIX message queue, /dev and the
# run directory. Prints "written" when all of it is in place.
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)
try:
    rt = ctypes.CDLL("librt.so.1", use_errno=True)
except OSError:
    rt = libc

def check(r, what):
    if r < 0:
        raise SystemExit("%s: errno %d" % (what, ctypes.get_errno()))
    return r

for p in ["/dev/shm/x", "/run/x", "/tmp/x", "/dev/x", "/.deltabox/run/x"]:
    with open(p, "w") as f:
        f.write("secret")
os.makedirs("/run/d/e", exist_ok=True)
with open("/run/d/e/f", "w") as f:
    f.write("secret")
os.symlink("/", "/dev/shm/rootlink")  # clearing must unlink this, never follow it

KEY, IPC_CREAT = 0x5EC7, 0o1000
shmid = check(libc.shmget(KEY, 4096, IPC_CREAT | 0o666), "shmget")
check(libc.shmget(0, 4096, IPC_CREAT | 0o600), "shmget private")
libc.shmat.restype = ctypes.c_void_p
addr = libc.shmat(shmid, None, 0)
ctypes.memmove(addr, b"secret", 6)

class Msg(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 16)]

msqid = check(libc.msgget(KEY, IPC_CREAT | 0o666), "msgget")
check(libc.msgsnd(msqid, ctypes.byref(Msg(1, b"secret")), 6, 0), "msgsnd")
check(libc.semget(KEY, 1, IPC_CREAT | 0o666), "semget")
mqd = check(rt.mq_open(b"/x", os.O_CREAT | os.O_RDWR, 0o666, None), "mq_open")
check(rt.mq_send(mqd, b"secret", 6, 0), "mq_send")
print("written")
