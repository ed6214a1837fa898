package s3_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/minio/minio-go/v7"

	"github.com/deltabox/deltabox/objectstore"
	"github.com/deltabox/deltabox/objectstore/s3"
	"github.com/deltabox/deltabox/objectstore/s3test"
)

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.NewChaCha8([32]byte{42}).Read(b)
	return b
}

// callAfter calls fn once, the first time more than n bytes have been read through it.
type callAfter struct {
	r    io.Reader
	n    int
	fn   func()
	done bool
}

func (c *callAfter) Read(p []byte) (int, error) {
	if c.n < 0 && !c.done {
		c.done = true
		c.fn()
	}
	m, err := c.r.Read(p)
	c.n -= m
	return m, err
}

// TestServerGoesAwayMidUpload kills the server after two parts of a five-part upload: the
// Put must fail as unavailable within its bounded retries, leave nothing under the key, and
// succeed once the server is back.
func TestServerGoesAwayMidUpload(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "away", s3.WithRetry(3, 20*time.Millisecond), s3.WithConcurrency(2))
	ctx := context.Background()
	b := randomBytes(25 << 20)
	r := &callAfter{r: bytes.NewReader(b), n: 10 << 20, fn: srv.Stop}
	start := time.Now()
	err := s.Put(ctx, "snap/blob", r, int64(len(b)))
	t.Logf("Put with the server gone: %v after %v", err, time.Since(start))
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Put with the server gone: error %v, want ErrUnavailable", err)
	}
	if !r.done {
		t.Fatal("the server was never stopped: the upload did not reach the third part")
	}
	srv.Restart()
	if _, err := s.Stat(ctx, "snap/blob"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stat after the failed Put: %v, want ErrNotFound (no partial object)", err)
	}
	if err := s.Put(ctx, "snap/blob", bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatalf("retried Put after restart: %v", err)
	}
	rc, err := s.Get(ctx, "snap/blob", objectstore.Range{})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("Get after retry: %d bytes, %v; want the %d bytes put", len(got), err, len(b))
	}
}

// TestRetryRidesOutRestart stops the server and restarts it while a Stat is retrying.
func TestRetryRidesOutRestart(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "ride", s3.WithRetry(20, 50*time.Millisecond))
	ctx := context.Background()
	if err := s.Put(ctx, "k", bytes.NewReader([]byte("hello")), 5); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		time.Sleep(300 * time.Millisecond)
		srv.Restart()
	}()
	info, err := s.Stat(ctx, "k")
	<-restarted
	if err != nil || info.Size != 5 {
		t.Fatalf("Stat across a restart = %+v, %v; want size 5", info, err)
	}
}

func TestDeadServerIsUnavailable(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "dead", s3.WithRetry(3, 10*time.Millisecond))
	srv.Stop()
	start := time.Now()
	_, err := s.Stat(context.Background(), "k")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Stat on a dead server: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("3 bounded attempts took %v", d)
	}
}

// TestFailedUploadIsAborted checks that a Put whose reader fails leaves no multipart upload
// behind on the server.
func TestFailedUploadIsAborted(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "abort")
	boom := errors.New("boom")
	r := io.MultiReader(bytes.NewReader(randomBytes(12<<20)), errReader{boom})
	if err := s.Put(context.Background(), "k", r, -1); !errors.Is(err, boom) {
		t.Fatalf("Put: %v, want %v", err, boom)
	}
	core := minio.Core{Client: srv.Client()}
	res, err := core.ListMultipartUploads(context.Background(), srv.Bucket, "abort/", "", "", "", 100)
	if err != nil {
		t.Fatalf("ListMultipartUploads: %v", err)
	}
	if len(res.Uploads) != 0 {
		t.Fatalf("%d multipart uploads left behind: %+v", len(res.Uploads), res.Uploads)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestDownloadResumesAcrossRestart kills the server in the middle of a download and starts
// it again: the reader resumes where it stopped and delivers exactly the object.
func TestDownloadResumesAcrossRestart(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "resume", s3.WithRetry(20, 50*time.Millisecond))
	ctx := context.Background()
	b := randomBytes(48 << 20)
	if err := s.Put(ctx, "blob", bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	for _, rng := range []objectstore.Range{{}, {Offset: 3 << 20, Length: 40 << 20}} {
		rc, err := s.Get(ctx, "blob", rng)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		head := make([]byte, 1<<20)
		if _, err := io.ReadFull(rc, head); err != nil {
			t.Fatalf("read head: %v", err)
		}
		srv.Restart()
		rest, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("read across restart (range %+v): %v", rng, err)
		}
		end := int64(len(b))
		if rng.Length > 0 {
			end = rng.Offset + rng.Length
		}
		if got := append(head, rest...); !bytes.Equal(got, b[rng.Offset:end]) {
			t.Fatalf("range %+v across restart: got %d bytes, want %d (contents differ)", rng, len(got), end-rng.Offset)
		}
	}
}

// TestDownloadRefusesReplacedObject replaces the object while a broken download waits to
// resume: the reader must fail, not splice two versions.
func TestDownloadRefusesReplacedObject(t *testing.T) {
	srv := s3test.Start(t)
	s := newStore(t, srv, "replace", s3.WithRetry(20, 50*time.Millisecond))
	ctx := context.Background()
	b := randomBytes(48 << 20)
	if err := s.Put(ctx, "blob", bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Get(ctx, "blob", objectstore.Range{})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	other := bytes.Repeat([]byte{7}, len(b))
	if err := s.Put(ctx, "blob", bytes.NewReader(other), int64(len(other))); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(rc)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("read after the object was replaced: %v, want ErrFailedPrecondition", err)
	}
}
