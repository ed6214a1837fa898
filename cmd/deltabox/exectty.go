package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/deltabox/deltabox/orchestrator/api"
)

// runExecTTY runs exec -t: the command gets a terminal in the sandbox. With -i the local
// terminal is put into raw mode, so every key (Ctrl-C and Ctrl-D included) goes to the
// sandbox's terminal, which handles it like a local one would; the mode is restored when the
// command ends and when deltabox is told to stop (SIGTERM, SIGHUP). Window size changes
// (SIGWINCH) follow the command.
func runExecTTY(c *cli.Context, id string, req api.ExecRequest) error {
	if jsonOutput(c) {
		return usagef("exec -t shows a terminal, not JSON lines: drop -o json (or -t)")
	}
	interactive := c.Bool("interactive")
	inFd := int(os.Stdin.Fd())
	if interactive && !term.IsTerminal(inFd) {
		return usagef("exec -it: standard input is not a terminal; use -i without -t to pipe input")
	}
	req.TTY, req.Stdin = localSize(), interactive
	ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	if interactive {
		old, err := term.MakeRaw(inFd)
		if err != nil {
			return fmt.Errorf("exec -it: raw mode on the local terminal: %w", err)
		}
		defer term.Restore(inFd, old)
	}
	input := make(chan api.TTYInput)
	done := make(chan struct{})
	defer close(done)
	go watchSize(input, done)
	if interactive {
		go readKeys(os.Stdin, input, done)
	}
	st, err := newClient(c).ExecTTY(ctx, id, req, input, c.App.Writer)
	if err != nil {
		if ctx.Err() != nil && c.Context.Err() == nil {
			return errors.New("exec -t: stopped by a signal; the command was killed")
		}
		return err
	}
	if st.Error != "" || st.TimedOut {
		// the terminal may be in raw mode still: start the message on a fresh line
		io.WriteString(c.App.ErrWriter, "\r\n")
	}
	if st.Error != "" {
		fmt.Fprintf(c.App.ErrWriter, "deltabox: %s\n", st.Error)
	} else if st.TimedOut {
		fmt.Fprintf(c.App.ErrWriter, "deltabox: command timed out after %gms and was killed\n", req.TimeoutMS)
	}
	reportTruncation(c.App.ErrWriter, st, req.OutputCap)
	if st.Code != 0 {
		return exitCodeError{code: st.Code}
	}
	return nil
}

// localSize is the size of the local terminal (stdout's, else stdin's); {} lets the sandbox
// take 24x80 when neither is a terminal.
func localSize() *api.TTYSize {
	for _, f := range []*os.File{os.Stdout, os.Stdin} {
		if cols, rows, err := term.GetSize(int(f.Fd())); err == nil && rows > 0 && cols > 0 {
			return &api.TTYSize{Rows: uint16(min(rows, 0xffff)), Cols: uint16(min(cols, 0xffff))}
		}
	}
	return &api.TTYSize{}
}

// watchSize sends the local terminal's new size on every SIGWINCH until done.
func watchSize(input chan<- api.TTYInput, done <-chan struct{}) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		select {
		case <-winch:
		case <-done:
			return
		}
		size := localSize()
		if size.Rows == 0 {
			continue
		}
		select {
		case input <- api.TTYInput{Resize: size}:
		case <-done:
			return
		}
	}
}

// readKeys sends what is typed until r ends (then the input ends) or done. The read in
// progress when the command ends is abandoned: deltabox exits right after.
func readKeys(r io.Reader, input chan<- api.TTYInput, done <-chan struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			select {
			case input <- api.TTYInput{Stdin: append([]byte(nil), buf[:n]...)}:
			case <-done:
				return
			}
		}
		if err != nil {
			select {
			case input <- api.TTYInput{EOF: true}:
			case <-done:
			}
			return
		}
	}
}
