package hubsync

import (
	"context"
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/internal/mqttc"
)

// firstReconnect is the first wait between connection attempts; it
// doubles at each failure up to Options.MaxReconnectInterval.
const firstReconnect = 500 * time.Millisecond

// dialLogEvery spaces the logs of failed connection attempts.
const dialLogEvery = 30 * time.Second

// brokers is every address of the hub, Broker first, each once.
func (o *Options) brokers() []string {
	out := []string{o.Broker}
	for _, b := range o.Brokers {
		if b != "" && !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out
}

// dial keeps a connection to the hub until ctx ends: one mqttc.Client
// per connection (mqttc.Options.Once), each attempt, and each
// reconnection after a loss, to the next of the hub's addresses, with a
// jittered wait that doubles while attempts fail. A node that dies thus
// costs its gateways one wait, not its whole outage. The connection up
// when ctx ends is left to goodbye.
func (u *Uplink) dial(ctx context.Context, will []byte) {
	addrs := u.opts.brokers()
	var (
		fails    int
		loggedAt time.Time
	)
	for i := 0; ; i++ {
		addr := addrs[i%len(addrs)]
		c, lost, err := u.connect(ctx, addr, will)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if c != nil {
				c.Close()
			}
			fails++
			if now := time.Now(); now.Sub(loggedAt) >= dialLogEvery {
				loggedAt = now
				u.log.Warn("cannot connect to the hub; trying its next address", "broker", redact(addr), "attempts", fails, "err", err)
			}
		} else {
			fails = 0
			select {
			case <-lost:
			case <-ctx.Done():
				return
			}
			u.log.Warn("hub connection lost", "broker", redact(addr))
			c.Close()
		}
		t := time.NewTimer(reconnectWait(max(fails-1, 0), u.opts.MaxReconnectInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// connect makes one connection to addr, with the uplink's subscriptions
// and hooks, and makes it the uplink's current one; lost is closed when
// it ends.
func (u *Uplink) connect(ctx context.Context, addr string, will []byte) (*mqttc.Client, <-chan struct{}, error) {
	o := u.opts
	lost := make(chan struct{})
	var once sync.Once
	c, err := mqttc.New(mqttc.Options{
		Broker: addr, ClientID: o.ClientID, Username: o.Username, Password: o.Password, TLS: o.TLS,
		Will:           &mqttc.Will{Topic: u.topics.Status(o.Gateway), Payload: will, QoS: 1, Retained: !o.NoRetain},
		ConnectTimeout: o.Timeout, Timeout: o.Timeout, Once: true,
		// The subscriptions below are in place when this runs; the sync
		// loop announces the gateway and sends.
		OnConnect: func() {
			u.connGen.Add(1)
			signal(u.connEv)
		},
		OnConnectionLost: func(error) {
			once.Do(func() { close(lost) })
			signal(u.connEv)
		},
		Logger: u.log,
	})
	if err != nil {
		return nil, nil, err
	}
	// QoS 0: an ack lost is made up by the resend, a control request
	// lost by the hub sending it again, and a QoS 1 subscription costs a
	// clustered broker a consumer per gateway (see uplink.Protocol).
	for filter, handle := range map[string]func(string, []byte){u.topics.Ack(o.Gateway): u.onAck, u.topics.Control(o.Gateway): u.onControl} {
		if _, err := c.SubscribeQoS(filter, 0, handle); err != nil {
			return c, nil, err
		}
	}
	u.addr.Store(redact(addr))
	if old := u.conn.Swap(c); old != nil {
		old.Close() // ended already; Close only waits for its goroutine
	}
	return c, lost, c.Connect(ctx)
}

// broker is the address of the current connection, without a password.
func (u *Uplink) broker() string {
	s, _ := u.addr.Load().(string)
	return s
}

// redact drops a password from a broker URL, for logs and stats.
func redact(addr string) string {
	if p, err := url.Parse(addr); err == nil && p.User != nil {
		return p.Redacted()
	}
	return addr
}

// reconnectWait is the wait after fails failed attempts in a row: a
// random time in the upper half of a bound that starts at
// firstReconnect and doubles, capped at most.
func reconnectWait(fails int, most time.Duration) time.Duration {
	bound := most
	if fails < 16 {
		bound = min(most, firstReconnect*time.Duration(1<<fails))
	}
	return bound - rand.N(bound/2+1)
}
