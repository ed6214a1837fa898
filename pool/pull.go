package pool

import (
	"context"
	"fmt"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"

	"github.com/deltabox/deltabox/internal/log"
)

// pullTimeout bounds pulling a pool's image from its registry.
const pullTimeout = 10 * time.Minute

// pull fetches ref from its registry into containerd and unpacks it for the snapshotter, as
// `ctr images pull` would: anonymous access, HTTPS except for localhost registries (plain
// HTTP, the usual local test registry). Credentials are not configured yet: a private image is
// imported with ctr instead (docs/images.md).
func (r *runtime) pull(ctx context.Context, ref string) (containerd.Image, error) {
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	start := time.Now()
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost),
			docker.WithAuthorizer(docker.NewDockerAuthorizer())),
	})
	img, err := r.client.Pull(ctx, ref, containerd.WithResolver(resolver), containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(r.snapshotter))
	if err != nil {
		return nil, fmt.Errorf("image %q is not in containerd and pulling it failed (import it with ctr, see docs/images.md): %v: %w",
			ref, err, errdefs.ErrNotFound)
	}
	log.L(ctx).Info("image pulled", "image", ref, "digest", img.Target().Digest, "ms", time.Since(start).Milliseconds())
	return img, nil
}
