// Package log carries a *slog.Logger in a context, in the style of containerd's log.G(ctx),
// so that every layer logs with the fields (sandbox, checkpoint, ...) its callers attached.
// It owns no configuration beyond the process-wide default logger.
package log

import (
	"context"
	"log/slog"
)

type loggerKey struct{}

// L returns the logger carried by ctx, or slog's default logger.
func L(ctx context.Context) *slog.Logger {
	if ctx != nil {
		if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
			return l
		}
	}
	return slog.Default()
}

// With returns a context whose logger has the given attributes added.
func With(ctx context.Context, args ...any) context.Context {
	return WithLogger(ctx, L(ctx).With(args...))
}

// WithLogger returns a context carrying l.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}
