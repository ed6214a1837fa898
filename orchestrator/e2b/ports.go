package e2b

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/containerd/errdefs"
)

// TrafficTokenHeader carries a sandbox's access token on requests to its ports (the E2B SDK's
// name for it); X-Access-Token is accepted too.
const TrafficTokenHeader = "E2b-Traffic-Access-Token"

// proxyPort serves a request for a port of a sandbox other than envd's: it is passed to the
// sandbox's own address on that port (never anywhere else), for the sandbox's token holders.
func (g *Gateway) proxyPort(w http.ResponseWriter, r *http.Request, sb *sandbox, port string) {
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		writeEnvdError(w, 0, fmt.Errorf("port %q: %w", port, errdefs.ErrInvalidArgument))
		return
	}
	info, err := g.b.Sandbox(sb.id)
	if err != nil {
		writeEnvdError(w, 0, err)
		return
	}
	ip := net.ParseIP(info.IP)
	if ip == nil {
		writeEnvdError(w, http.StatusBadGateway, fmt.Errorf("sandbox %q has no network address (its pool runs without networking): %w", sb.id, errdefs.ErrFailedPrecondition))
		return
	}
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort(ip.String(), strconv.Itoa(p))}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = r.Host
			for _, h := range []string{"X-Access-Token", TrafficTokenHeader, "E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Api-Key"} {
				pr.Out.Header.Del(h)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeEnvdError(w, http.StatusBadGateway, fmt.Errorf("port %d of sandbox %q: %v", p, sb.id, err))
		},
	}
	rp.ServeHTTP(w, r)
}
