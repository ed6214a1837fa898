# A REPL driven through a pipe: it reads lines from stdin with os.read (a blocking read(2)),
# evaluates each (exec for statements) and writes repr(result) to stdout, one line each.
import os, sys
buf = b""
g = {}
while True:
    while b"\n" not in buf:
        chunk = os.read(0, 4096)
        if not chunk:
            sys.exit(0)
        buf += chunk
    line, buf = buf.split(b"\n", 1)
    try:
        r = eval(line.decode(), g)
    except SyntaxError:
        try:
            exec(line.decode(), g); r = "ok"
        except Exception as e:
            r = type(e).__name__
    except Exception as e:
        r = type(e).__name__
    os.write(1, (repr(r) + "\n").encode())
