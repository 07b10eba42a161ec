package hub

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestAPIGzipsWhatTheClientAcceptsButNotTheEventStream: the JSON and
// the dashboard's files come gzipped to a client that says it accepts
// gzip, and decode to what a client that does not is sent plain; the
// event stream is never gzipped (each event must reach the page when
// sent).
func TestAPIGzipsWhatTheClientAcceptsButNotTheEventStream(t *testing.T) {
	e := newEnv(t, "home", "cellar")
	// A transport that leaves encodings alone, so the test sees them.
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	get := func(ctx context.Context, path, accept string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", e.http.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+testToken)
		if accept != "" {
			req.Header.Set("Accept-Encoding", accept)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if path == "/api/stream?token="+testToken {
			return res, nil
		}
		defer func() { _ = res.Body.Close() }() // read to the end below
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res, body
	}
	for _, path := range []string{"/api/gateways", "/api/missions?limit=10", "/app.js", "/", "/api/outcomes?range=30d"} {
		t.Run(path, func(t *testing.T) {
			plainRes, plain := get(t.Context(), path, "")
			if enc := plainRes.Header.Get("Content-Encoding"); enc != "" {
				t.Fatalf("without Accept-Encoding: Content-Encoding %q", enc)
			}
			res, zipped := get(t.Context(), path, "br;q=1.0, gzip;q=0.8")
			if res.StatusCode != http.StatusOK || res.Header.Get("Content-Encoding") != "gzip" || res.Header.Get("Vary") != "Accept-Encoding" {
				t.Fatalf("status %d, Content-Encoding %q, Vary %q: want 200, gzip, Accept-Encoding", res.StatusCode, res.Header.Get("Content-Encoding"), res.Header.Get("Vary"))
			}
			zr, err := gzip.NewReader(bytes.NewReader(zipped))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(zr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, plain) {
				t.Errorf("gunzipped body differs from the plain one:\n%s\n%s", got, plain)
			}
		})
	}
	// gzip;q=0 refuses it.
	if res, _ := get(t.Context(), "/api/gateways", "gzip;q=0"); res.Header.Get("Content-Encoding") != "" {
		t.Errorf("gzip;q=0: Content-Encoding %q", res.Header.Get("Content-Encoding"))
	}
	// An error is sent as it is, plain.
	if res, body := get(t.Context(), "/api/nothing", "gzip"); res.StatusCode != http.StatusNotFound || res.Header.Get("Content-Encoding") != "" || !bytes.Contains(body, []byte("not_found")) {
		t.Errorf("404: Content-Encoding %q, body %s", res.Header.Get("Content-Encoding"), body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, _ := get(ctx, "/api/stream?token="+testToken, "gzip")
	defer func() { _ = res.Body.Close() }() // the stream is cut by cancel
	if enc := res.Header.Get("Content-Encoding"); enc != "" || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: Content-Encoding %q, Content-Type %q", enc, res.Header.Get("Content-Type"))
	}
	hello := make([]byte, 64)
	n, err := io.ReadAtLeast(res.Body, hello, len("retry: 2000\nevent: hello"))
	if err != nil || !bytes.Contains(hello[:n], []byte("event: hello")) {
		t.Fatalf("stream's first bytes %q (%v), want the hello event, plain", hello[:n], err)
	}
}
