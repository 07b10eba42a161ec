package hub

import (
	"encoding/json"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sortie-edge/sortie/internal/clustertest"
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

// TestHalfFailedSetupLeavesNothingSubscribed: a cluster set-up that
// fails after its consumers and first subscription are in place (here
// the feed's subscription, refused) leaves nothing consuming or
// subscribed on a real NATS server, and the next attempt sets up whole.
// Before, the control results' subscription outlived the failed attempt.
func TestHalfFailedSetupLeavesNothingSubscribed(t *testing.T) {
	u := hubNATSUser()
	srv := clustertest.StartNATS(t, 1, clustertest.NATSOptions{Users: []clustertest.User{u}})
	l := newNATSLink(ClusterOptions{NATS: srv.ClientURLs(), User: u.Name, Password: u.Password, Replicas: 1, AckWait: 5 * time.Second},
		uplink.Topics{}, testLogger(t), time.Now)
	nc, err := nats.Connect(srv.ClientURLs(), nats.UserInfo(u.Name, u.Password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// The connection's own subscription for replies, which the first
	// JetStream request makes and every request after shares.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Fatal(err)
	}
	base := nc.NumSubscriptions()
	refused := errors.New("refused by the test")
	l.subscribe = func(nc *nats.Conn, subj string, cb nats.MsgHandler) (*nats.Subscription, error) {
		if subj == l.feedSubject() {
			return nil, refused
		}
		return nc.Subscribe(subj, cb)
	}
	deliver := func(inboundRaw) {}
	if err := l.trySetup(t.Context(), nc, deliver); !errors.Is(err, refused) {
		t.Fatalf("set-up with the feed refused: %v, want the refusal", err)
	}
	if n := nc.NumSubscriptions() - base; n != 0 {
		t.Errorf("%d subscriptions left by the failed set-up, want 0", n)
	}
	l.subscribe = (*nats.Conn).Subscribe
	if err := l.trySetup(t.Context(), nc, deliver); err != nil {
		t.Fatalf("set-up again: %v", err)
	}
	// Two consumers, the control results, the bundle statuses and the
	// feed.
	if n := nc.NumSubscriptions() - base; n != 5 {
		t.Errorf("%d subscriptions after a whole set-up, want 5", n)
	}
	l.stopAll()
	if n := nc.NumSubscriptions() - base; n != 0 {
		t.Errorf("%d subscriptions after stopping, want 0", n)
	}
}
