# Run inside a sandbox: find the processes stopped for a tracer (state "t": the daemon's
# process templates) and try to read, write, trace and signal each. Prints one JSON line:
# {"templates": [ns pids], "results": {pid: {attempt: outcome}}}. SIGKILL is sent to the
# pid given as argv[1] only (if any).
import ctypes, json, os, signal, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_DETACH = 16, 0x4206, 17

def state(pid):
    try:
        s = open("/proc/%d/stat" % pid).read()
    except OSError:
        return "gone"
    return s[s.rindex(")") + 2]

def attempt(f):
    try:
        r = f()
        return "ok" if r is None else str(r)
    except Exception as e:
        return type(e).__name__

def trace(req, pid):
    r = libc.ptrace(req, pid, None, None)
    if r == 0:
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        return "ok"
    return os.strerror(ctypes.get_errno())

tpls = [int(p) for p in os.listdir("/proc") if p.isdigit() and state(int(p)) == "t"]
res = {}
for t in tpls:
    r = {}
    r["read_mem"] = attempt(lambda: open("/proc/%d/mem" % t, "rb").read(1) and None)
    r["write_mem"] = attempt(lambda: open("/proc/%d/mem" % t, "r+b").close())
    r["environ"] = attempt(lambda: open("/proc/%d/environ" % t, "rb").read() and None)
    r["attach"] = trace(PTRACE_ATTACH, t)
    r["seize"] = trace(PTRACE_SEIZE, t)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGSTOP, signal.SIGCONT, signal.SIGUSR1, signal.SIGSEGV):
        r[sig.name] = attempt(lambda: os.kill(t, sig))
    r["state_after"] = state(t)
    res[t] = r
if len(sys.argv) > 1:
    os.kill(int(sys.argv[1]), signal.SIGKILL)
print(json.dumps({"templates": tpls, "results": res}))
