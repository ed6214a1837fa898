package integration

import (
	"context"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/objectstore/s3test"
)

// TestS3BadCredentialsArePermissionDenied: an object store that refuses the daemon's
// credentials reaches the client as permission denied (it used to become "internal").
func TestS3BadCredentialsArePermissionDenied(t *testing.T) {
	s3 := s3test.Start(t)
	t.Setenv("AWS_ACCESS_KEY_ID", s3.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3.SecretKey+"-wrong")
	d := startDaemon(t)
	_, err := d.client().Snapshots(context.Background(), s3.URI("denied"))
	if !errdefs.IsPermissionDenied(err) {
		t.Fatalf("list snapshots with a wrong secret key: want permission denied, got %v", err)
	}
	if _, errOut, code := d.cliRaw("snapshot", "ls", s3.URI("denied")); code != 1 || !strings.Contains(errOut, "permission denied") {
		t.Errorf("snapshot ls with a wrong secret key: exit %d, %q; want exit 1 saying permission denied", code, errOut)
	}
}
