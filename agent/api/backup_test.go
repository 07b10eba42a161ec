package api

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBackupAPI pins /api/backup: the copy is sent whole with its
// length, a failed copy is an error answer rather than a cut transfer,
// only GET is allowed, and one backup runs at a time.
func TestBackupAPI(t *testing.T) {
	var backup func() (io.ReadCloser, int64, error)
	h := New(Options{Log: slog.New(slog.DiscardHandler), Backup: func() (io.ReadCloser, int64, error) { return backup() }})
	mux := http.NewServeMux()
	h.Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	get := func(method string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, srv.URL+"/api/backup", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }() // read to the end: nothing left to report
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	backup = func() (io.ReadCloser, int64, error) {
		return io.NopCloser(strings.NewReader("whole")), 5, nil
	}
	if resp, b := get("GET"); resp.StatusCode != 200 || string(b) != "whole" || resp.Header.Get("Content-Type") != "application/octet-stream" || resp.ContentLength != 5 {
		t.Errorf("backup: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	// The copy is made locally before a byte is sent: a failure is an
	// error answer, not a cut transfer.
	backup = func() (io.ReadCloser, int64, error) { return nil, 0, errors.New("disk on fire") }
	if resp, b := get("GET"); resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(b), "disk on fire") {
		t.Errorf("failed backup: %d %q", resp.StatusCode, b)
	}
	if resp, _ := get("HEAD"); resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET" {
		t.Errorf("HEAD: %d %v", resp.StatusCode, resp.Header)
	}
	// One at a time: each takes the database's size on disk.
	entered, release := make(chan struct{}), make(chan struct{})
	backup = func() (io.ReadCloser, int64, error) {
		close(entered)
		<-release
		return io.NopCloser(strings.NewReader("whole")), 5, nil
	}
	first := make(chan int, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/api/backup")
		if err != nil {
			first <- -1
			return
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Errorf("first backup: read: %v", err)
		}
		_ = resp.Body.Close() // read to the end: nothing left to report
		first <- resp.StatusCode
	}()
	<-entered
	if resp, b := get("GET"); resp.StatusCode != http.StatusConflict {
		t.Errorf("second backup at once: %d %q, want 409", resp.StatusCode, b)
	}
	close(release)
	if code := <-first; code != 200 {
		t.Errorf("first backup: %d", code)
	}
}
