package hub

import (
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sortie-edge/sortie/uplink"
)

// TestFeedReloadsWhenAReplicaJoinsOrLeaves: a replica killed between
// its commit and its feed message leaves no gap in any sequence, so
// the watchers of the others reload when a new replica is heard (a
// restarted one takes a new ID) or one is no longer heard; not for the
// replicas a starting one hears in its first beats.
func TestFeedReloadsWhenAReplicaJoinsOrLeaves(t *testing.T) {
	l := newNATSLink(ClusterOptions{}, uplink.Topics{}, slog.New(slog.DiscardHandler), time.Now)
	var reloads int
	l.resync = func() { reloads++ }
	feed := func(r string, seq uint64) {
		b, err := json.Marshal(feedMsg{R: r, Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		l.onFeed(&nats.Msg{Data: b})
	}
	l.heard = time.Now()
	feed("a", 5) // heard in the first beats: no reload
	if reloads != 0 {
		t.Fatalf("%d reloads for a replica heard at start", reloads)
	}
	l.heard = time.Now().Add(-time.Minute)
	feed("b", 1)
	if reloads != 1 {
		t.Fatalf("%d reloads after a new replica was heard, want 1", reloads)
	}
	feed(l.id, 1) // itself
	l.mu.Lock()
	l.peers["a"] = peer{seq: 5, seen: time.Now().Add(-2 * feedForget)}
	l.mu.Unlock()
	feed("b", 1)
	if reloads != 2 {
		t.Fatalf("%d reloads after a replica was no longer heard, want 2", reloads)
	}
}
