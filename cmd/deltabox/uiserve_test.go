package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestUIServerRefuses: the page's proxy answers only its own host, with the token, and only
// the API calls the page makes.
func TestUIServerRefuses(t *testing.T) {
	s := &uiServer{token: "t0k", host: "127.0.0.1:7878"}
	cases := []struct {
		name, method, host, path, token string
		want                            int
	}{
		{"page", "GET", "127.0.0.1:7878", "/", "", http.StatusOK},
		{"other host (DNS rebinding)", "GET", "evil.example:7878", "/", "", http.StatusForbidden},
		{"no token", "GET", "127.0.0.1:7878", "/v1/sandboxes", "", http.StatusForbidden},
		{"wrong token", "GET", "127.0.0.1:7878", "/v1/sandboxes", "nope", http.StatusForbidden},
		{"release is not the page's", "POST", "127.0.0.1:7878", "/v1/sandboxes/sb-1/release", "t0k", http.StatusForbidden},
		{"pools are not the page's", "DELETE", "127.0.0.1:7878", "/v1/pools/p", "t0k", http.StatusForbidden},
		{"traversal", "GET", "127.0.0.1:7878", "/v1/sandboxes/../pools", "t0k", http.StatusForbidden},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, "http://"+c.host+c.path, strings.NewReader("{}"))
		r.Host = c.host
		if c.token != "" {
			r.Header.Set("X-Deltabox-Token", c.token)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s: %d, want %d (%s)", c.name, w.Code, c.want, w.Body)
		}
	}
}
