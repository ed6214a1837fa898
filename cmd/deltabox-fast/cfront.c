//go:build cgo

// The C front of bin/deltabox: why it exists and what runs where is in main.go's package
// comment. In short: an ELF constructor, which libc runs before main and so before the Go
// runtime starts, runs the command lines an agent runs at every step,
//
//   deltabox [--address PATH] lease --pool NAME   (or --pool=NAME; -a PATH, --address=PATH)
//   deltabox [--address PATH] exec ID [--] CMD [ARGS...]   (no exec flags; without --, CMD
//                                                           does not start with '-')
//   deltabox [--address PATH] checkpoint create ID [--level V] [-m|--message V] [--name V]
//                                                  [--pin] [--processes] [--async]
//   deltabox [--address PATH] rollback ID [--to CKPT] [--force] [--replay]
//   deltabox [--address PATH] release ID   (one ID; checkpoint's and rollback's flags may come
//                                           before or after the ID, as parse.go's leaf reads them)
//
// in text output against a unix socket (--address, else DELTABOX_ADDRESS, else the default),
// arguments in ASCII, and _exit()s. On this VM class every page a process touches first
// costs 17-45 us, and the Go runtime's start alone is ~180 such faults; this path touches a
// few dozen.
//
// It sends the very request the Go front sends (wire.go roundTrip, run.go), and prints only
// what it knows the Go front would print: the sandbox ID of a 200 lease whose body is a JSON
// object it can read, the lines of a 200 checkpoint or rollback whose body it reads in full
// (strings without escapes, numbers as written), the ID of a 200 release, and exec's output
// events ({"o"|"e":"BASE64"}) up to a plain exit status ({"exit":{...}} without error, timeout
// or truncation notices). For any other command line it returns at once, before sending
// anything, and the Go front runs as if this file did not exist. Once it has sent the request
// it never returns to a state where Go would send it again: on anything it does not fully know
// (a status other than 200, a header or a JSON shape it does not read, an unknown event, a read
// or write error) it leaves the connection and every byte it read and did not use in cfront_h
// (cfront.h) and returns; the Go front (cfront.go, handover.go) goes on from that point with
// its own code, which prints the result or the error exactly as it does for a request of its
// own.

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cfront.h"

struct cfront_handover cfront_h;

#define DEFAULT_ADDRESS "/run/deltabox/deltabox.sock" // parse.go defaultAddress
#define COMPLETION_FLAG "--generate-bash-completion"

// Buffers are static (zero pages until touched): a call touches what it uses.
static char body[64 << 10];                 // the request's body, then
static char req[sizeof body + 512];         // the request
static char rbuf[64 << 10];                 // bytes read from the connection: rbuf[rpos:rlen] unused
static size_t rpos, rlen;
static char lbuf[1 << 20];                  // exec: decoded body bytes from an event boundary
static size_t llen;
static char obuf[sizeof lbuf / 4 * 3 + 3];  // exec: an event's decoded output
static const char *trace;                   // DELTABOX_FRONT_TRACE: a file the tests read

// note appends a line to the trace file, when there is one (tests only).
static void note(const char *line) {
	if (!trace)
		return;
	int fd = open(trace, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		if (write(fd, line, strlen(line)) < 0) {
		}
		close(fd);
	}
}

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int hex_val(int c) {
	if (is_digit(c))
		return c - '0';
	c = lower(c);
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

// same_fold: a[:n] is s, ASCII letters compared without case.
static int same_fold(const char *a, size_t n, const char *s) {
	if (strlen(s) != n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (lower((unsigned char)a[i]) != s[i])
			return 0;
	return 1;
}

// safe_name is parse.go's safeName.
static int safe_name(const char *s) {
	if (!*s || *s == '-' || !strcmp(s, ".") || !strcmp(s, ".."))
		return 0;
	for (; *s; s++) {
		int b = (unsigned char)*s;
		if (!(b >= 'a' && b <= 'z') && !(b >= 'A' && b <= 'Z') && !is_digit(b) && !strchr("-_.~", b))
			return 0;
	}
	return 1;
}

// An append-only buffer that notes when it would overflow.
struct buf {
	char *p;
	size_t n, cap;
	int over;
};

static void put(struct buf *b, const char *s, size_t n) {
	if (b->over || n > b->cap - b->n) {
		b->over = 1;
		return;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

// put_json appends s as a JSON string escaped as json.go's appendJSONString (encoding/json)
// does; 0 for a byte above 0x7f (UTF-8 checks and U+2028/9 are left to Go).
static int put_json(struct buf *b, const char *s) {
	static const char hex[] = "0123456789abcdef";
	put(b, "\"", 1);
	for (; *s; s++) {
		unsigned char c = *s;
		char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
		if (c >= 0x80)
			return 0;
		if (c == '"' || c == '\\') {
			e[1] = c;
			put(b, e, 2);
		} else if (c == '\n') {
			put(b, "\\n", 2);
		} else if (c == '\r') {
			put(b, "\\r", 2);
		} else if (c == '\t') {
			put(b, "\\t", 2);
		} else if (c < 0x20 || c == '<' || c == '>' || c == '&') {
			put(b, e, 6);
		} else {
			put(b, (const char *)&c, 1);
		}
	}
	put(b, "\"", 1);
	return 1;
}

// write_all writes all of p; 0, or the errno of a failed write (after part of p, perhaps).
static int write_all(int fd, const char *p, size_t n, int flags) {
	while (n > 0) {
		ssize_t k = flags ? send(fd, p, n, flags) : write(fd, p, n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		p += k;
		n -= k;
	}
	return 0;
}

// fill reads more of the answer into rbuf; 0 at its end, on a read error (noted for Go) or
// with rbuf full. Every caller hands over when it returns 0.
static int fill(int fd) {
	for (;;) {
		if (rlen == sizeof rbuf)
			return 0;
		ssize_t k = read(fd, rbuf + rlen, sizeof rbuf - rlen);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			cfront_h.read_err = errno; // a socket reports it once: Go gets it from cfront_h
		if (k <= 0)
			return 0;
		rlen += k;
		return 1;
	}
}

// line_at finds the line at rbuf[pos:] as wire.go's readLine reads it (up to '\n', without
// it and one '\r' before it); 0 when its end has not come yet.
static int line_at(size_t pos, const char **l, size_t *n, size_t *next) {
	char *e = memchr(rbuf + pos, '\n', rlen - pos);
	if (!e)
		return 0;
	*l = rbuf + pos;
	*n = e - *l;
	*next = e + 1 - rbuf;
	if (*n > 0 && (*l)[*n - 1] == '\r')
		(*n)--;
	return 1;
}

// head reads the answer's status line and headers from rbuf[0:rlen] as wire.go's
// readResponse does: 1 for a 200 whose headers it knows (*body: the body's offset; *clen:
// Content-Length or -1; *chunked), 0 when more bytes are needed, -1 for anything else.
static int head(size_t *body_at, long long *clen, int *chunked) {
	const char *l;
	size_t n, next;
	if (!line_at(0, &l, &n, &next))
		return 0;
	const char *sp = memchr(l, ' ', n);
	if (!sp || sp - l < 7 || memcmp(l, "HTTP/1.", 7))
		return -1;
	size_t i = sp - l;
	while (i < n && l[i] == ' ')
		i++;
	if (n - i < 3 || memcmp(l + i, "200", 3) || (n - i > 3 && l[i + 3] != ' '))
		return -1;
	*clen = -1;
	*chunked = 0;
	for (;;) {
		if (!line_at(next, &l, &n, &next))
			return 0;
		if (n == 0)
			break;
		// Go reads the key up to the first ':' (the whole line without one) and trims the
		// value's spaces; it reads only these two headers.
		const char *colon = memchr(l, ':', n);
		size_t kn = colon ? (size_t)(colon - l) : n;
		const char *v = colon ? colon + 1 : l + n;
		size_t vn = l + n - v;
		while (vn > 0 && strchr(" \t\v\f\r", v[0]) && v[0])
			v++, vn--;
		while (vn > 0 && strchr(" \t\v\f\r", v[vn - 1]) && v[vn - 1])
			vn--;
		if (same_fold(l, kn, "content-length")) {
			if (*clen >= 0 || vn == 0 || vn > 15)
				return -1;
			*clen = 0;
			for (size_t j = 0; j < vn; j++) {
				if (!is_digit(v[j]))
					return -1;
				*clen = *clen * 10 + v[j] - '0';
			}
		} else if (same_fold(l, kn, "transfer-encoding")) {
			if (*chunked || !same_fold(v, vn, "chunked"))
				return -1;
			*chunked = 1;
		}
	}
	*body_at = next;
	return 1;
}

// A strict JSON reader: it accepts a subset of what json.go's parser accepts (which is lax
// about numbers), so that whatever it accepts reads the same in both.

static const char *ws(const char *p, const char *e) {
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

// jstr reads the string at p (at its quote); the byte after it, or NULL. *esc: it holds an
// escape (its bytes are not its value).
static const char *jstr(const char *p, const char *e, int *esc) {
	*esc = 0;
	for (p++; p < e; p++) {
		unsigned char c = *p;
		if (c == '"')
			return p + 1;
		if (c < 0x20)
			return NULL;
		if (c != '\\')
			continue;
		*esc = 1;
		if (++p >= e)
			return NULL;
		if (*p == 'u') {
			for (int i = 0; i < 4; i++)
				if (++p >= e || hex_val((unsigned char)*p) < 0)
					return NULL;
		} else if (!memchr("\"\\/bfnrt", *p, 8)) {
			return NULL;
		}
	}
	return NULL;
}

static const char *jdigits(const char *p, const char *e) {
	if (p >= e || !is_digit(*p))
		return NULL;
	while (p < e && is_digit(*p))
		p++;
	return p;
}

// jnum reads a number as JSON writes it; NULL when json.go would read a longer one.
static const char *jnum(const char *p, const char *e) {
	if (p < e && *p == '-')
		p++;
	if (p < e && *p == '0')
		p++;
	else if (!(p = jdigits(p, e)))
		return NULL;
	if (p < e && *p == '.' && !(p = jdigits(p + 1, e)))
		return NULL;
	if (p < e && (*p == 'e' || *p == 'E')) {
		p++;
		if (p < e && (*p == '+' || *p == '-'))
			p++;
		if (!(p = jdigits(p, e)))
			return NULL;
	}
	if (p < e && (is_digit(*p) || memchr("+-.eE", *p, 5)))
		return NULL;
	return p;
}

struct member {
	const char *k; // the key, without quotes
	size_t kn;
	int kesc;      // the key holds an escape
	const char *v; // the value, as written
	const char *ve;
};

static const char *jval(const char *p, const char *e, int depth, int (*cb)(struct member *, void *), void *ctx);

// jobj reads the object at p (at its brace), calling cb (when not NULL) for each member in
// order; cb returns 0 to stop (NULL).
static const char *jobj(const char *p, const char *e, int depth, int (*cb)(struct member *, void *), void *ctx) {
	p = ws(p + 1, e);
	if (p < e && *p == '}')
		return p + 1;
	for (;;) {
		struct member m;
		p = ws(p, e);
		if (p >= e || *p != '"')
			return NULL;
		m.k = p + 1;
		if (!(p = jstr(p, e, &m.kesc)))
			return NULL;
		m.kn = p - 1 - m.k;
		p = ws(p, e);
		if (p >= e || *p != ':')
			return NULL;
		m.v = ws(p + 1, e);
		if (!(p = jval(m.v, e, depth + 1, NULL, NULL)))
			return NULL;
		m.ve = p;
		if (cb && !cb(&m, ctx))
			return NULL;
		p = ws(p, e);
		if (p < e && *p == '}')
			return p + 1;
		if (p >= e || *p != ',')
			return NULL;
		p++;
	}
}

static const char *jval(const char *p, const char *e, int depth, int (*cb)(struct member *, void *), void *ctx) {
	int esc;
	p = ws(p, e);
	if (p >= e || depth > 64)
		return NULL;
	switch (*p) {
	case '"':
		return jstr(p, e, &esc);
	case '{':
		return jobj(p, e, depth, cb, ctx);
	case '[':
		p = ws(p + 1, e);
		if (p < e && *p == ']')
			return p + 1;
		for (;;) {
			if (!(p = jval(p, e, depth + 1, NULL, NULL)))
				return NULL;
			p = ws(p, e);
			if (p < e && *p == ']')
				return p + 1;
			if (p >= e || *p != ',')
				return NULL;
			p++;
		}
	case 't':
		return e - p >= 4 && !memcmp(p, "true", 4) ? p + 4 : NULL;
	case 'f':
		return e - p >= 5 && !memcmp(p, "false", 5) ? p + 5 : NULL;
	case 'n':
		return e - p >= 4 && !memcmp(p, "null", 4) ? p + 4 : NULL;
	}
	return jnum(p, e);
}

static int key_is(struct member *m, const char *k) { return !m->kesc && m->kn == strlen(k) && !memcmp(m->k, k, m->kn); }
static int value_is(struct member *m, const char *v) {
	return (size_t)(m->ve - m->v) == strlen(v) && !memcmp(m->v, v, m->ve - m->v);
}

// A lease's "sandbox" member: a string without escapes, printed as it is (run.go lease).
struct lease_result {
	const char *id;
	size_t n;
};

static int lease_member(struct member *m, void *ctx) {
	struct lease_result *r = ctx;
	if (m->kesc)
		return 0; // a key with escapes may read "sandbox"
	if (key_is(m, "sandbox")) {
		int esc;
		if (*m->v != '"' || jstr(m->v, m->ve, &esc) != m->ve || esc)
			return 0;
		r->id = m->v + 1; // the last one wins, as in json.go's map
		r->n = m->ve - m->v - 2;
	}
	return 1;
}

// An exit status C reports as run.go's execText would: no error, no timeout, nothing cut;
// its code (getInt) an integer of up to 9 digits.
static int exit_member(struct member *m, void *ctx) {
	int *code = ctx;
	if (m->kesc)
		return 0;
	if (key_is(m, "error"))
		return value_is(m, "\"\"");
	if (key_is(m, "timed_out") || key_is(m, "stdout_truncated") || key_is(m, "stderr_truncated"))
		return value_is(m, "false");
	if (key_is(m, "code")) {
		const char *p = m->v;
		int neg = p < m->ve && *p == '-';
		p += neg;
		if (m->ve - p < 1 || m->ve - p > 9)
			return 0;
		*code = 0;
		for (; p < m->ve; p++) {
			if (!is_digit(*p))
				return 0;
			*code = *code * 10 + *p - '0';
		}
		if (neg)
			*code = -*code;
	}
	return 1;
}

static int b64_val(int c) {
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (is_digit(c))
		return c - '0' + 52;
	return c == '+' ? 62 : c == '/' ? 63 : -1;
}

// b64 decodes s as base64.StdEncoding.DecodeString does (padded; stray bits ignored); the
// decoded length, or -1 for what Go would refuse or C does not read (a quote, an escape).
static long b64(const char *s, size_t n, char *out) {
	size_t o = 0;
	if (n % 4)
		return -1;
	for (size_t i = 0; i < n; i += 4) {
		int last = i + 4 == n;
		int a = b64_val((unsigned char)s[i]), b = b64_val((unsigned char)s[i + 1]);
		if (a < 0 || b < 0)
			return -1;
		out[o++] = a << 2 | b >> 4;
		if (last && s[i + 2] == '=' && s[i + 3] == '=')
			break;
		int c = b64_val((unsigned char)s[i + 2]);
		if (c < 0)
			return -1;
		out[o++] = b << 4 | c >> 2;
		if (last && s[i + 3] == '=')
			break;
		int d = b64_val((unsigned char)s[i + 3]);
		if (d < 0)
			return -1;
		out[o++] = c << 6 | d;
	}
	return o;
}

// event runs one exec event line (l[n-1] is its '\n'), as run.go's readExecEvents: 1 done
// (output written), 2 the exit status (*code), 0 one C does not know (nothing written).
static int event(const char *l, size_t n, int *code) {
	const char *e = l + n - 1;
	if (n >= 9 && (!memcmp(l, "{\"o\":\"", 6) || !memcmp(l, "{\"e\":\"", 6)) && !memcmp(e - 2, "\"}", 2)) {
		long k = b64(l + 6, e - 2 - (l + 6), obuf);
		if (k < 0 || write_all(l[2] == 'o' ? 1 : 2, obuf, k, 0))
			return 0; // a failed write: Go writes the event again and reports the error
		return 1;
	}
	if (n >= 11 && !memcmp(l, "{\"exit\":{", 9)) {
		*code = 0; // getInt of a missing code
		const char *p = jobj(l + 8, e, 1, exit_member, code);
		return p && p + 1 == e && *p == '}' ? 2 : 0;
	}
	return 0;
}

// Chunked framing (RFC 9112 7.1) as wire.go's chunkedReader reads it.
enum { S_SIZE, S_DATA, S_CRLF };
static int state = S_SIZE;
static long long left; // bytes left in the current chunk

// decode moves body bytes from rbuf to lbuf: 1 when it moved or read something, 0 when it
// needs more bytes, -1 for framing C does not read (or the body's end: Go reports it).
static int decode(void) {
	const char *l;
	size_t n, next, i;
	switch (state) {
	case S_SIZE:
		if (!line_at(rpos, &l, &n, &next))
			return 0;
		left = 0;
		for (i = 0; i < n && i < 15 && hex_val((unsigned char)l[i]) >= 0; i++)
			left = left * 16 + hex_val((unsigned char)l[i]);
		if (i == 0 || (i < n && l[i] != ';') || left == 0)
			return -1;
		rpos = next;
		state = S_DATA;
		return 1;
	case S_DATA:
		n = rlen - rpos;
		if ((long long)n > left)
			n = left;
		if (n > sizeof lbuf - llen)
			n = sizeof lbuf - llen;
		if (n == 0)
			return 0;
		memcpy(lbuf + llen, rbuf + rpos, n);
		llen += n;
		rpos += n;
		left -= n;
		if (left == 0)
			state = S_CRLF;
		return 1;
	}
	if (rlen - rpos < 2)
		return 0;
	if (memcmp(rbuf + rpos, "\r\n", 2))
		return -1;
	rpos += 2;
	state = S_SIZE;
	return 1;
}

// hand_over leaves the connection and the unused bytes to Go.
static void hand_over(int kind, int fd, const char *what) {
	cfront_h.kind = kind;
	cfront_h.fd = fd;
	cfront_h.raw = rbuf + rpos;
	cfront_h.rawlen = rlen - rpos;
	cfront_h.pending = lbuf;
	cfront_h.pendlen = llen;
	cfront_h.left = state == S_DATA ? left : 0;
	cfront_h.crlf = state == S_CRLF;
	note(what);
}

// read_head reads the answer's head; 1 with a 200 C reads, else 0 (handed over).
static int read_head(int fd, const char *verb, size_t *at, long long *clen, int *chunked) {
	int h;
	while (!(h = head(at, clen, chunked)) && fill(fd)) {
	}
	if (h <= 0) {
		hand_over(CFRONT_RESPONSE, fd, verb);
		return 0;
	}
	return 1;
}

// read_body reads a 200 answer with a Content-Length body that fits rbuf, in full: 1 with the
// body at rbuf[*at:*e], else 0 (handed over).
static int read_body(int fd, const char *verb, size_t *at, const char **e) {
	long long clen;
	int chunked;
	if (!read_head(fd, verb, at, &clen, &chunked))
		return 0;
	if (!chunked && clen >= 0 && clen <= (long long)(sizeof rbuf - *at))
		while (rlen - *at < (size_t)clen && fill(fd)) {
		}
	if (chunked || clen < 0 || clen > (long long)(sizeof rbuf - *at) || rlen - *at < (size_t)clen) {
		hand_over(CFRONT_RESPONSE, fd, verb);
		return 0;
	}
	*e = rbuf + *at + clen;
	return 1;
}

static void lease(int fd) {
	size_t at;
	const char *e;
	if (!read_body(fd, "lease: handed over (response)\n", &at, &e))
		return;
	struct lease_result r = {0};
	const char *p = ws(rbuf + at, e);
	p = p < e && *p == '{' ? jobj(p, e, 0, lease_member, &r) : NULL;
	if (!p || ws(p, e) != e || !r.id || r.n > sizeof body - 1) {
		hand_over(CFRONT_RESPONSE, fd, "lease: handed over (response)\n");
		return;
	}
	memcpy(body, r.id, r.n);
	body[r.n] = '\n';
	if (write_all(1, body, r.n + 1, 0)) {
		hand_over(CFRONT_RESPONSE, fd, "lease: handed over (response)\n");
		return;
	}
	note("lease: done in C\n");
	_exit(0);
}

static void exec_events(int fd) {
	size_t at;
	long long clen;
	int chunked, code;
	if (!read_head(fd, "exec: handed over (response)\n", &at, &clen, &chunked))
		return;
	if (!chunked || clen >= 0) {
		hand_over(CFRONT_RESPONSE, fd, "exec: handed over (response)\n");
		return;
	}
	rpos = at;
	for (;;) {
		size_t off = 0;
		char *nl;
		int r = 1;
		while (r == 1 && (nl = memchr(lbuf + off, '\n', llen - off))) {
			r = event(lbuf + off, nl + 1 - (lbuf + off), &code);
			if (r == 2) {
				note("exec: done in C\n");
				_exit(code);
			}
			if (r == 1)
				off = nl + 1 - lbuf;
		}
		memmove(lbuf, lbuf + off, llen - off);
		llen -= off;
		int d = r == 1 && llen < sizeof lbuf ? decode() : -1;
		if (d == 0) {
			memmove(rbuf, rbuf + rpos, rlen - rpos);
			rlen -= rpos;
			rpos = 0;
			d = fill(fd) ? 1 : -1;
		}
		if (d < 0) {
			hand_over(CFRONT_EVENTS, fd, "exec: handed over (events)\n");
			return;
		}
	}
}

// Members of a checkpoint's or rollback's answer C prints, as json.go's getString, getNum,
// getMS and getArray read them; any other shape (a string with an escape or a byte above
// 0x7f, a value of another type, a key with an escape) is left to Go.
enum { F_STR, F_NUM, F_ARR };
struct field {
	const char *k;
	int type;
	const char *v; // NULL: absent or null (getString "", getNum "0", getArray none)
	size_t n;      // F_STR: without quotes; else the value as written
};

static int field_member(struct member *m, void *ctx) {
	struct field *f = ctx;
	int esc;
	if (m->kesc)
		return 0;
	for (; f->k && !key_is(m, f->k); f++) {
	}
	if (!f->k)
		return 1;
	f->v = NULL; // the last one wins, as in json.go's map
	if (value_is(m, "null"))
		return 1;
	if (f->type == F_STR) {
		if (*m->v != '"' || jstr(m->v, m->ve, &esc) != m->ve || esc)
			return 0;
		for (const char *p = m->v; p < m->ve; p++)
			if ((unsigned char)*p >= 0x80)
				return 0; // json.go's UTF-8 checks are left to Go
	} else if (f->type == F_NUM ? *m->v != '-' && !is_digit(*m->v) : *m->v != '[') {
		return 0;
	}
	f->v = m->v + (f->type == F_STR);
	f->n = m->ve - m->v - (f->type == F_STR ? 2 : 0);
	return 1;
}

// put_field appends a string or a number member as getString / getNum print it.
static void put_field(struct buf *b, struct field *f) {
	if (f->v)
		put(b, f->v, f->n);
	else if (f->type == F_NUM)
		puts_(b, "0");
}

// put_ms appends a number member as getMS does (strconv.FormatFloat(f, 'f', 2, 64) of
// ParseFloat: glibc's strtod and printf round exactly too); 0 for an exponent (and so an
// infinity) or a long number, left to Go.
static int put_ms(struct buf *b, struct field *f) {
	char in[32], o[48];
	size_t n = f->v ? f->n : 1;
	if (n >= sizeof in - 8)
		return 0;
	memcpy(in, f->v ? f->v : "0", n);
	in[n] = 0;
	if (strpbrk(in, "eE"))
		return 0;
	int k = snprintf(o, sizeof o, "%.2f", strtod(in, NULL));
	if (k <= 0 || (size_t)k >= sizeof o)
		return 0;
	put(b, o, k);
	return 1;
}

// each_obj calls line for each object of the array at p (as written, through e), its
// members in f; 0 for an element that is not an object, or when line returns 0.
static int each_obj(const char *p, const char *e, struct field *f, struct buf *b, int (*line)(struct buf *, struct field *)) {
	if (!p)
		return 1; // getArray of null or nothing
	p = ws(p + 1, e);
	if (p < e && *p == ']')
		return 1;
	for (;;) {
		p = ws(p, e);
		if (p >= e || *p != '{')
			return 0;
		for (struct field *g = f; g->k; g++)
			g->v = NULL;
		if (!(p = jobj(p, e, 1, field_member, f)) || !line(b, f))
			return 0;
		p = ws(p, e);
		if (p < e && *p == ']')
			return 1;
		if (p >= e || *p != ',')
			return 0;
		p++;
	}
}

// run.go checkpoint's printProcesses: "process PID (COMM): KEPT[ (REASON)]".
static int process_line(struct buf *b, struct field *f) {
	puts_(b, "process ");
	put_field(b, &f[0]);
	puts_(b, " (");
	put_field(b, &f[1]);
	puts_(b, "): ");
	put_field(b, &f[2]);
	if (f[3].v && f[3].n) {
		puts_(b, " (");
		put_field(b, &f[3]);
		puts_(b, ")");
	}
	puts_(b, "\n");
	return 1;
}

// run.go rollback's lost process: "not restored: pid PID (COMM): REASON".
static int lost_line(struct buf *b, struct field *f) {
	puts_(b, "not restored: pid ");
	put_field(b, &f[0]);
	puts_(b, " (");
	put_field(b, &f[1]);
	puts_(b, "): ");
	put_field(b, &f[3]);
	puts_(b, "\n");
	return 1;
}

// summary reads a 200 checkpoint or rollback answer and prints it as run.go's checkpoint /
// rollback do in text output: fmt holds literal text and, at each '%', the next field of f
// (of type F_STR or F_NUM; '@' for an F_NUM printed by getMS); the last field of f is the
// array of processes whose lines line prints.
static void summary(int fd, const char *verb, struct field *f, const char *fmt, int (*line)(struct buf *, struct field *)) {
	static char hand[64], done[64];
	struct buf h = {hand, 0, sizeof hand - 1, 0}, d = {done, 0, sizeof done - 1, 0};
	puts_(&h, verb);
	puts_(&h, ": handed over (response)\n");
	puts_(&d, verb);
	puts_(&d, ": done in C\n");
	size_t at;
	const char *e;
	if (!read_body(fd, hand, &at, &e))
		return;
	const char *p = ws(rbuf + at, e);
	p = p < e && *p == '{' ? jobj(p, e, 0, field_member, f) : NULL;
	struct buf b = {body, 0, sizeof body, 0}; // the request is sent: its buffer is free
	int ok = p && ws(p, e) == e;
	struct field *g = f;
	for (; ok && *fmt; fmt++) {
		if (*fmt == '%')
			put_field(&b, g++);
		else if (*fmt == '@')
			ok = put_ms(&b, g++);
		else
			put(&b, fmt, 1);
	}
	struct field procs[] = {{"pid", F_NUM, 0, 0}, {"comm", F_STR, 0, 0}, {"kept", F_STR, 0, 0}, {"reason", F_STR, 0, 0}, {0, 0, 0, 0}};
	ok = ok && each_obj(g->v, g->v ? g->v + g->n : NULL, procs, &b, line);
	if (!ok || b.over || write_all(1, body, b.n, 0)) {
		hand_over(CFRONT_RESPONSE, fd, hand);
		return;
	}
	note(done);
	_exit(0);
}

static void checkpoint(int fd) {
	struct field f[] = {{"checkpoint", F_STR, 0, 0}, {"level", F_STR, 0, 0}, {"files_changed", F_NUM, 0, 0}, {"bytes", F_NUM, 0, 0},
	                    {"frozen_ms", F_NUM, 0, 0}, {"total_ms", F_NUM, 0, 0}, {"processes", F_ARR, 0, 0}, {0, 0, 0, 0}};
	summary(fd, "checkpoint", f, "checkpoint % (%): % files, % bytes, frozen @ ms, total @ ms\n", process_line);
}

static void rollback(int fd) {
	struct field f[] = {{"to", F_STR, 0, 0}, {"files_restored", F_NUM, 0, 0}, {"ops_undone", F_NUM, 0, 0},
	                    {"effects_dropped", F_NUM, 0, 0}, {"processes_stopped", F_NUM, 0, 0}, {"processes_restored", F_NUM, 0, 0},
	                    {"frozen_ms", F_NUM, 0, 0}, {"total_ms", F_NUM, 0, 0}, {"processes_lost", F_ARR, 0, 0}, {0, 0, 0, 0}};
	summary(fd, "rollback", f,
	        "rolled back to %: % files restored, % state ops undone, % effects dropped, % processes stopped, % restored, "
	        "frozen @ ms, total @ ms\n",
	        lost_line);
}

// release (one ID): run.go release discards a 200 answer's body and prints the ID.
static void release(int fd, const char *id) {
	size_t at;
	const char *e;
	if (!read_body(fd, "release: handed over (response)\n", &at, &e))
		return;
	size_t n = strlen(id);
	memcpy(body, id, n);
	body[n] = '\n';
	if (write_all(1, body, n + 1, 0)) {
		hand_over(CFRONT_RESPONSE, fd, "release: handed over (response)\n");
		return;
	}
	note("release: done in C\n");
	_exit(0);
}

// A flag of checkpoint create or rollback in the one spelling C reads: value flags
// (--NAME V or --NAME=V; slot: where its value goes, the last one wins) or bare bools.
struct flag {
	const char *s;
	int slot;
};

// leaf reads the arguments after the verb as parse.go's leaf does, for the flags of vals and
// bools: 1 with the one positional ID in *id, the values in val[slot] and the bools in on[];
// 0 for anything else (another spelling, both spellings of one flag, a second ID, --, a
// value that is empty or starts with '-'), left to Go.
static int leaf(int argc, char **argv, const struct flag *vals, const char *const *bools, const char **val, int *on, const char **id) {
	const char *form[3] = {0}; // the spelling that set each slot: -m then --message is a usage error
	*id = NULL;
	for (int j = 0; j < argc; j++) {
		const char *a = argv[j];
		if (a[0] != '-') {
			if (*id || !safe_name(a))
				return 0;
			*id = a;
			continue;
		}
		int k;
		for (k = 0; bools[k] && strcmp(a, bools[k]); k++) {
		}
		if (bools[k]) {
			on[k] = 1;
			continue;
		}
		for (k = 0; vals[k].s; k++) {
			size_t n = strlen(vals[k].s);
			if (!strncmp(a, vals[k].s, n) && (a[n] == '=' || !a[n]))
				break;
		}
		if (!vals[k].s)
			return 0;
		const char *v = strchr(a, '=') ? strchr(a, '=') + 1 : j + 1 < argc ? argv[++j] : "";
		if (!*v || *v == '-' || (form[vals[k].slot] && form[vals[k].slot] != vals[k].s))
			return 0;
		form[vals[k].slot] = vals[k].s;
		val[vals[k].slot] = v;
	}
	return *id != NULL;
}

// put_member appends ,"KEY":"VALUE" (no comma after the brace); 0 as put_json.
static int put_member(struct buf *b, const char *k, const char *v) {
	if (b->n > 1)
		puts_(b, ",");
	put_json(b, k);
	puts_(b, ":");
	return v ? put_json(b, v) : (puts_(b, "true"), 1);
}

// cfront is the constructor: glibc calls it with main's arguments and environment.
__attribute__((constructor)) static void cfront(int argc, char **argv, char **envp) {
	const char *addr = NULL, *flag = NULL;
	int i = 1;
	// An optional --address/-a PATH (or =PATH) first, as the tests and benchmarks run it.
	if (argc > 2 && (!strcmp(argv[1], "--address") || !strcmp(argv[1], "-a"))) {
		flag = argv[2];
		i = 3;
	} else if (argc > 1 && (!strncmp(argv[1], "--address=", 10) || !strncmp(argv[1], "-a=", 3))) {
		flag = strchr(argv[1], '=') + 1;
		i = 2;
	}
	if (flag && (!*flag || *flag == '-')) // parse.go flagValue: left to Go
		return;
	int verb_lease = (argc - i == 2 || argc - i == 3) && !strcmp(argv[i], "lease");
	int verb_exec = argc - i >= 3 && !strcmp(argv[i], "exec");
	int verb_ck = argc - i >= 3 && !strcmp(argv[i], "checkpoint") && !strcmp(argv[i + 1], "create");
	int verb_rb = argc - i >= 2 && !strcmp(argv[i], "rollback");
	int verb_rel = argc - i >= 2 && !strcmp(argv[i], "release");
	if (!verb_lease && !verb_exec && !verb_ck && !verb_rb && !verb_rel)
		return;
	for (char **e = envp; e && *e; e++) { // the first of a name wins, as in Go's syscall.Getenv
		if (!addr && !strncmp(*e, "DELTABOX_ADDRESS=", 17))
			addr = *e + 17;
		else if (!trace && !strncmp(*e, "DELTABOX_FRONT_TRACE=", 21) && (*e)[21])
			trace = *e + 21;
	}
	// parse.go validAddress.
	if (flag)
		addr = flag;
	else if (!addr)
		addr = DEFAULT_ADDRESS;
	if (!strncmp(addr, "unix://", 7))
		addr += 7;
	size_t alen = strlen(addr);
	if (alen == 0 || alen >= sizeof ((struct sockaddr_un *)0)->sun_path || strstr(addr, "://") || addr[0] == '@')
		return;
	argv += i;
	argc -= i;

	struct buf b = {body, 0, sizeof body, 0}, r = {req, 0, sizeof req, 0};
	const char *type, *rel_id = NULL;
	puts_(&r, "POST /v1/");
	if (verb_lease) { // run.go lease: POST /v1/pools/NAME/lease {}
		const char *pool = argc == 2 && !strncmp(argv[1], "--pool=", 7) ? argv[1] + 7
		                   : argc == 3 && !strcmp(argv[1], "--pool")   ? argv[2]
		                                                               : "";
		if (!safe_name(pool))
			return;
		puts_(&r, "pools/");
		puts_(&r, pool);
		puts_(&r, "/lease");
		puts_(&b, "{}");
		type = "application/json";
	} else if (!verb_exec) { // parse.go parseCheckpoint, parseRollback, parseRelease
		static const struct flag ck_vals[] = {{"--level", 0}, {"--message", 1}, {"-m", 1}, {"--name", 2}, {0, 0}};
		static const struct flag rb_vals[] = {{"--to", 0}, {0, 0}}, no_vals[] = {{0, 0}};
		static const char *const ck_bools[] = {"--pin", "--processes", "--async", 0}, *const rb_bools[] = {"--force", "--replay", 0},
		                         *const no_bools[] = {0}, *const ck_keys[] = {"level", "message", "name"},
		                         *const ck_on[] = {"pin", "processes", "async"}, *const rb_on[] = {"force", "replay"};
		const char *val[3] = {0}, *id;
		int on[3] = {0};
		if (verb_ck ? !leaf(argc - 2, argv + 2, ck_vals, ck_bools, val, on, &id)
		            : !leaf(argc - 1, argv + 1, verb_rb ? rb_vals : no_vals, verb_rb ? rb_bools : no_bools, val, on, &id))
			return;
		puts_(&r, "sandboxes/");
		puts_(&r, id);
		puts_(&r, verb_ck ? "/checkpoints" : verb_rb ? "/rollback" : "/release");
		if (!verb_rel)
			puts_(&b, "{");
		for (int j = 0; j < 3 && !verb_rel; j++) { // the values, then the bools, in parse.go's order
			const char *k = verb_ck ? ck_keys[j] : j ? NULL : "to";
			if (k && val[j] && !put_member(&b, k, val[j]))
				return;
		}
		for (int j = 0; j < 3 && !verb_rel; j++) {
			const char *on_k = verb_ck ? ck_on[j] : j < 2 ? rb_on[j] : NULL;
			if (on_k && on[j])
				put_member(&b, on_k, NULL);
		}
		if (!verb_rel)
			puts_(&b, "}");
		rel_id = id;
		type = "application/json";
	} else { // run.go exec: POST /v1/sandboxes/ID/exec {"argv":[...]}\n
		int cmd = strcmp(argv[2], "--") ? 2 : 3; // CMD, or -- CMD
		if (!safe_name(argv[1]) || cmd >= argc || (cmd == 2 && argv[2][0] == '-') || !strcmp(argv[argc - 1], COMPLETION_FLAG))
			return;
		puts_(&r, "sandboxes/");
		puts_(&r, argv[1]);
		puts_(&r, "/exec");
		puts_(&b, "{\"argv\":[");
		for (int j = cmd; j < argc; j++) {
			if (j > cmd)
				puts_(&b, ",");
			if (!put_json(&b, argv[j]))
				return;
		}
		puts_(&b, "]}\n");
		type = "application/x-ndjson";
	}
	// wire.go roundTrip's request.
	char num[24];
	int k = sizeof num;
	size_t v = b.n;
	num[--k] = 0;
	do
		num[--k] = '0' + v % 10;
	while (v /= 10);
	puts_(&r, " HTTP/1.1\r\nHost: deltabox\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: ");
	puts_(&r, num + k);
	puts_(&r, "\r\nContent-Type: ");
	puts_(&r, type);
	puts_(&r, "\r\n\r\n");
	put(&r, body, b.n);
	if (b.over || r.over)
		return;

	// wire.go dial: a blocking socket; when it cannot connect Go dials again and says why.
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, addr, alen);
	int c;
	while ((c = connect(fd, (struct sockaddr *)&sa, offsetof(struct sockaddr_un, sun_path) + alen + 1)) < 0 && errno == EINTR) {
	}
	if (c < 0 && errno != EISCONN) {
		close(fd);
		return;
	}
	int err = write_all(fd, req, r.n, MSG_NOSIGNAL);
	if (err) {
		cfront_h.kind = CFRONT_WRITE_ERR;
		cfront_h.err = err;
		note(verb_lease ? "lease: handed over (write)\n"
		     : verb_exec ? "exec: handed over (write)\n"
		     : verb_ck   ? "checkpoint: handed over (write)\n"
		     : verb_rb   ? "rollback: handed over (write)\n"
		                 : "release: handed over (write)\n");
		return;
	}
	if (verb_lease)
		lease(fd);
	else if (verb_exec)
		exec_events(fd);
	else if (verb_ck)
		checkpoint(fd);
	else if (verb_rb)
		rollback(fd);
	else
		release(fd, rel_id);
}
