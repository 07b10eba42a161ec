package api

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// resetSecondRequest is an agent whose kept-alive connections are reset
// when their second request arrives, as when the agent closes an idle
// connection the client has just picked to send on; it counts the
// submissions it answers, by request ID.
type resetSecondRequest struct {
	mu       sync.Mutex
	perConn  map[string]int // requests seen per client address
	answered map[string]int // submissions answered per request ID
}

func (s *resetSecondRequest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.perConn[r.RemoteAddr]++
	n := s.perConn[r.RemoteAddr]
	s.mu.Unlock()
	if n == 2 {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = conn.(*net.TCPConn).SetLinger(0) // close with RST, the request unanswered
		_ = conn.Close()
		return
	}
	var req SubmitRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	s.mu.Lock()
	s.answered[req.RequestID]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"outcome":"accepted"}`))
}

// TestSubmitWithARequestIDIsSentAgainWhenItsConnectionIsReset: a
// submission that names its request ID survives a kept-alive connection
// reset under it (it is sent again, and the agent answers a repeated ID
// with the mission it made); one without an ID is not sent twice.
func TestSubmitWithARequestIDIsSentAgainWhenItsConnectionIsReset(t *testing.T) {
	for _, c := range []struct {
		name, id string
		again    bool
	}{{"with a request ID", "app-42", true}, {"without", "", false}} {
		t.Run(c.name, func(t *testing.T) {
			s := &resetSecondRequest{perConn: map[string]int{}, answered: map[string]int{}}
			srv := httptest.NewServer(s)
			defer srv.Close()
			cl := &Client{Base: srv.URL, HTTP: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}}
			ctx := context.Background()
			if _, err := cl.Call(ctx, http.MethodPost, "/api/missions", SubmitRequest{Scene: "s", RequestID: "first"}, nil); err != nil {
				t.Fatalf("first submission: %v", err)
			}
			_, err := cl.Call(ctx, http.MethodPost, "/api/missions", SubmitRequest{Scene: "s", RequestID: c.id}, nil)
			switch {
			case c.again && err != nil:
				t.Fatalf("submission on a reset connection: %v", err)
			case c.again && s.answered[c.id] != 1:
				t.Errorf("answered %d times, want once on a new connection", s.answered[c.id])
			case !c.again && err == nil:
				t.Errorf("a submission without a request ID was sent again after a reset (answered %d times)", s.answered[c.id])
			}
		})
	}
}
