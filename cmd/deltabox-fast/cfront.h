// The C front's hand-over to the Go front (cfront.c, cfront.go).

#ifndef DELTABOX_CFRONT_H
#define DELTABOX_CFRONT_H

#include <stddef.h>

enum {
	CFRONT_NONE = 0,      // the C front sent nothing: Go runs the command line as it would anyway
	CFRONT_RESPONSE = 1,  // request sent; raw holds the answer's first bytes (from its status line)
	CFRONT_EVENTS = 2,    // exec: 200 and chunked; pending holds the body from an event boundary
	CFRONT_WRITE_ERR = 3, // writing the request failed with err (part of it may have been sent)
};

struct cfront_handover {
	int kind;
	int fd;              // the connection (kinds 1 and 2)
	int err;             // kind 3: errno
	int read_err;        // kinds 1 and 2: the errno of the read that made C stop (0: none)
	const char *raw;     // bytes read from fd and not yet consumed (chunk framing included)
	size_t rawlen;
	const char *pending; // kind 2: decoded body bytes, starting at an event line's start
	size_t pendlen;
	long long left;      // kind 2: bytes left in the current chunk
	int crlf;            // kind 2: the current chunk's data is read, its CRLF is not
};

extern struct cfront_handover cfront_h;

#endif
