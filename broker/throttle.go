package broker

import (
	"net"
	"sync"
	"time"
)

// Login throttle: a host that has failed throttleFree logins in a row
// (paho, by default, tries each refused login twice, as MQTT 3.1.1 then
// 3.1, so that is five mistyped passwords)
// waits before its next one is even checked, twice as long at each
// further failure, up to throttleMax. Checking a password costs a key
// derivation (passwd), so without it a client could have ~60 guesses a
// second checked, and take the CPU of a small gateway with them.
const (
	throttleFree    = 10
	throttleMax     = time.Minute
	throttleEntries = 4096
)

type strike struct {
	fails int
	until time.Time // no login from the host is checked before then
	last  time.Time
}

// throttle keeps the strikes of hosts that failed to log in. Safe for
// concurrent use.
type throttle struct {
	mu  sync.Mutex
	m   map[string]*strike
	now func() time.Time
}

func newThrottle() *throttle {
	return &throttle{m: map[string]*strike{}, now: time.Now}
}

// host is the throttle's key: the remote address without its port, so
// that a new connection is no new start.
func host(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// wait says how long the host must still wait before a login of its is
// checked (zero: go ahead).
func (t *throttle) wait(remote string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[host(remote)]
	if s == nil {
		return 0
	}
	return max(s.until.Sub(t.now()), 0)
}

// failed counts a failed login of the host.
func (t *throttle) failed(remote string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	h := host(remote)
	s := t.m[h]
	if s == nil {
		if len(t.m) >= throttleEntries {
			t.evict(now)
		}
		s = &strike{}
		t.m[h] = s
	}
	s.fails++
	s.last = now
	if n := s.fails - throttleFree; n > 0 {
		s.until = now.Add(min(time.Second<<min(n-1, 10), throttleMax))
	}
}

// succeeded forgets the host's strikes.
func (t *throttle) succeeded(remote string) {
	t.mu.Lock()
	delete(t.m, host(remote))
	t.mu.Unlock()
}

// evict makes room: first the hosts whose wait is over and who have
// been quiet for throttleMax, else the one quiet longest. t.mu is held.
func (t *throttle) evict(now time.Time) {
	var oldest string
	for h, s := range t.m {
		if now.Sub(s.last) > throttleMax && !s.until.After(now) {
			delete(t.m, h)
		}
		if oldest == "" || s.last.Before(t.m[oldest].last) {
			oldest = h
		}
	}
	if len(t.m) >= throttleEntries {
		delete(t.m, oldest)
	}
}
