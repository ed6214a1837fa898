// Package s3test starts a real S3-compatible server for tests: versitygw serving a temp
// directory (posix backend) on a free loopback port, with one bucket created. The objectstore
// tests and the daemon's integration tests share it. It owns the server process only: it
// must not be imported by non-test code paths of the daemon.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/deltabox/deltabox/internal/testutil"
)

// Binary is the server executable looked up on PATH (hack/install-deps.sh installs it).
const Binary = "versitygw"

// Server is a running (or stopped) versitygw. Its fields stay the same across Restart.
type Server struct {
	Endpoint  string // host:port, plain HTTP
	AccessKey string
	SecretKey string
	Bucket    string // created by Start
	Region    string
	Dir       string // the directory served; buckets are its subdirectories

	tb      testing.TB
	bin     string
	logPath string
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Start starts versitygw for the test and creates the bucket; the server is killed when the
// test ends. Without the binary the test is skipped, or failed under CI=true.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := testutil.RequiresBinary(tb, Binary)
	tmp := tb.TempDir()
	s := &Server{
		Endpoint:  net.JoinHostPort("127.0.0.1", freePort(tb)),
		AccessKey: "deltabox-test",
		SecretKey: randomHex(tb, 16),
		Bucket:    "deltabox-test",
		Region:    "us-east-1",
		Dir:       filepath.Join(tmp, "gw"),
		tb:        tb,
		bin:       bin,
		logPath:   filepath.Join(tmp, "versitygw.log"),
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	tb.Cleanup(s.cleanup)
	s.start()
	s.createBucket()
	return s
}

// URI returns the objectstore URI of prefix in the server's bucket (credentials excluded).
func (s *Server) URI(prefix string) string {
	u := url.URL{Scheme: "s3", Host: s.Bucket, Path: "/" + prefix,
		RawQuery: url.Values{"endpoint": {s.Endpoint}, "tls": {"false"}}.Encode()}
	return u.String()
}

// Env returns the environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) that give a
// process such as the daemon the server's credentials.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}

// Running reports whether the server process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Stop kills the server (SIGKILL: it goes away as in a crash) and waits for it to exit.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart stops the server if it runs and starts it again on the same address and directory.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

func (s *Server) start() {
	s.tb.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.tb.Fatalf("s3test: %v", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "--access", s.AccessKey, "--secret", s.SecretKey,
		"--region", s.Region, "--port", s.Endpoint, "--keep-alive", "--quiet", "posix", s.Dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("s3test: start %s: %v", s.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	s.waitReady(exited)
}

// waitReady polls until the server answers HTTP; a server that exits first fails the test.
func (s *Server) waitReady(exited <-chan struct{}) {
	s.tb.Helper()
	client := &http.Client{Timeout: time.Second}
	testutil.WaitFor(s.tb, 20*time.Second, 20*time.Millisecond, "versitygw at "+s.Endpoint, func() bool {
		select {
		case <-exited:
			s.tb.Fatalf("s3test: versitygw exited during start:\n%s", s.logTail())
		default:
		}
		resp, err := client.Get("http://" + s.Endpoint + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
}

// Client returns a minio-go client for the server, for tests that inspect the bucket
// directly.
func (s *Server) Client() *minio.Client {
	s.tb.Helper()
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region: s.Region, BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		s.tb.Fatalf("s3test: client: %v", err)
	}
	return c
}

func (s *Server) createBucket() {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Client().MakeBucket(ctx, s.Bucket, minio.MakeBucketOptions{Region: s.Region}); err != nil {
		s.tb.Fatalf("s3test: create bucket %s: %v\n%s", s.Bucket, err, s.logTail())
	}
}

func (s *Server) cleanup() {
	s.Stop()
	if s.tb.Failed() {
		s.tb.Logf("versitygw log:\n%s", s.logTail())
	}
}

// logTail returns the last 4 KiB of the server's output.
func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

func freePort(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("s3test: free port: %v", err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

func randomHex(tb testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	return hex.EncodeToString(b)
}
