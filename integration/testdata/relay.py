# A hostile tenant's relay: it takes the place of the sandbox init's socket, logs every
# request the host sends (argv, env, secrets) into the run directory, forwards them to the
# real init, and answers "kill" itself so that a release which asks the init to kill
# everything leaves the relay running for the next tenant.
import os, socket, sys, threading, time

RUN = "/.deltabox/run"
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
for fd in (0, 1, 2):
    os.close(fd)
time.sleep(0.2)
os.rename(RUN + "/init.sock", RUN + "/real.sock")
srv = socket.socket(socket.AF_UNIX)
srv.bind(RUN + "/init.sock")
srv.listen(64)
log = open(RUN + "/relay.log", "ab", 0)


def pump(src, dst, record):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if record:
                log.write(data)
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def serve(conn):
    first = b""
    while not first.endswith(b"\n"):
        data = conn.recv(65536)
        if not data:
            return
        first += data
    log.write(first)
    if b'"op":"kill"' in first:
        body = b'{"killed":[]}'
        conn.sendall(bytes([6]) + len(body).to_bytes(4, "big") + body)
        conn.close()
        return
    up = socket.socket(socket.AF_UNIX)
    up.connect(RUN + "/real.sock")
    up.sendall(first)
    threading.Thread(target=pump, args=(conn, up, True), daemon=True).start()
    pump(up, conn, False)


while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
