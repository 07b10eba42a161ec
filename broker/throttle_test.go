package broker

import (
	"fmt"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestAHostThatFailsLoginsWaitsLongerEachTime: ten failures are free;
// each further one makes the host wait twice as long, up to a minute;
// a success forgets it; other hosts are not held up.
func TestAHostThatFailsLoginsWaitsLongerEachTime(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	th := newThrottle()
	th.now = func() time.Time { return now }
	const guesser = "10.0.0.9:51000"
	for i := range throttleFree {
		if w := th.wait(guesser); w != 0 {
			t.Fatalf("failure %d: waits %v before the free ones are used", i, w)
		}
		th.failed(guesser)
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	for _, w := range want {
		th.failed("10.0.0.9:51001") // another connection of the same host
		if got := th.wait(guesser); got != w {
			t.Fatalf("waits %v, want %v", got, w)
		}
		now = now.Add(w)
	}
	for range 20 {
		th.failed(guesser)
	}
	if got := th.wait(guesser); got != throttleMax {
		t.Fatalf("waits %v, want the cap %v", got, throttleMax)
	}
	if got := th.wait("10.0.0.10:4000"); got != 0 {
		t.Fatalf("another host waits %v", got)
	}
	th.succeeded(guesser)
	if got := th.wait(guesser); got != 0 {
		t.Fatalf("after a success the host waits %v", got)
	}
	// Bounded: a flood of hosts does not grow it past its size.
	for i := range throttleEntries + 100 {
		th.failed(fmt.Sprintf("10.1.%d.%d:1", i/256, i%256))
	}
	if len(th.m) > throttleEntries {
		t.Fatalf("%d hosts kept, want at most %d", len(th.m), throttleEntries)
	}
}

// TestAThrottledHostIsRefusedEvenWithTheRightPassword: past its free
// failures, a host's logins are refused as throttled without a password
// check, whatever the password; the process's own identity is not
// throttled.
func TestAThrottledHostIsRefusedEvenWithTheRightPassword(t *testing.T) {
	book := lampBook(t)
	var reasons []string
	a, err := NewAuth(AuthOptions{Users: book, Internal: "self", InternalPassword: "self-password",
		Allow: func(string, string, bool) bool { return true }, Refused: func(r string) { reasons = append(reasons, r) }})
	if err != nil {
		t.Fatal(err)
	}
	login := func(user, pass string) bool {
		cl := &mqtt.Client{Net: mqtt.ClientConnection{Remote: "192.0.2.7:40000"}}
		var pk packets.Packet
		pk.Connect.Username, pk.Connect.Password, pk.Connect.ClientIdentifier = []byte(user), []byte(pass), user+".1"
		return a.OnConnectAuthenticate(cl, pk)
	}
	for range throttleFree + 1 {
		if login("lamp", "guess") {
			t.Fatal("a wrong password let in")
		}
	}
	if login("lamp", "lamp-password") {
		t.Fatal("a throttled host let in")
	}
	if reasons[len(reasons)-1] != RefusedThrottled {
		t.Fatalf("last refusal %q, want %q", reasons[len(reasons)-1], RefusedThrottled)
	}
	if !login("self", "self-password") {
		t.Fatal("the internal identity is throttled")
	}
}
