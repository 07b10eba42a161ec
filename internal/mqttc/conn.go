package mqttc

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// conn is one connection: one paho client, used for it alone.
type conn struct {
	pc paho.Client

	lost     chan struct{} // closed once paho reports the connection lost
	lostOnce sync.Once
	lostErr  error // why; read after lost is closed

	nc atomic.Pointer[cutConn] // the network connection, with Options.Abortable
}

func (cn *conn) markLost(err error) {
	if err == nil {
		err = ErrNotConnected
	}
	cn.lostOnce.Do(func() {
		cn.lostErr = err
		close(cn.lost)
	})
}

func (cn *conn) cut() {
	if nc := cn.nc.Load(); nc != nil {
		nc.cut()
	}
}

// newConn sets up a paho client for one connection: paho neither
// retries nor reconnects (the Client does), the session is clean unless
// Options.Persistent, and paho's own resubscription is off (the Client
// makes its subscriptions).
func (c *Client) newConn() *conn {
	o := &c.opts
	cn := &conn{lost: make(chan struct{})}
	po := paho.NewClientOptions().
		AddBroker(o.Broker).
		SetClientID(o.ClientID).
		SetCleanSession(!o.Persistent).
		// MQTT 3.1.1 only: paho otherwise retries a failed CONNECT as
		// 3.1, which brokers such as nats-server refuse, and the retry
		// costs a connection attempt.
		SetProtocolVersion(4).
		SetResumeSubs(false).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetOrderMatters(o.Ordered).
		SetConnectTimeout(o.ConnectTimeout).
		SetDialer(&net.Dialer{Timeout: o.ConnectTimeout}).
		SetWriteTimeout(o.Timeout).
		SetKeepAlive(o.KeepAlive).
		SetPingTimeout(min(o.KeepAlive/3, 10*time.Second)).
		SetConnectionLostHandler(func(_ paho.Client, err error) { cn.markLost(err) })
	if o.Username != "" {
		po.SetUsername(o.Username).SetPassword(o.Password)
	}
	if o.TLS != nil {
		po.SetTLSConfig(o.TLS)
	}
	if w := o.Will; w != nil {
		po.SetBinaryWill(w.Topic, w.Payload, w.QoS, w.Retained)
	}
	if o.Abortable {
		po.SetCustomOpenConnectionFn(cn.open)
	}
	cn.pc = paho.NewClient(po)
	if o.Persistent {
		// What the session queued arrives right after CONNACK, before
		// this connection subscribes: without a route paho would take
		// it, ack it, and hand it to no one.
		c.mu.Lock()
		for _, t := range c.subs {
			cn.pc.AddRoute(t.filter, c.route(t))
		}
		c.mu.Unlock()
	}
	return cn
}

// open is paho's connection function with Options.Abortable: it keeps
// the network connection so that Abort can cut it.
func (cn *conn) open(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
	d := &net.Dialer{Timeout: o.ConnectTimeout}
	var nc net.Conn
	var err error
	switch uri.Scheme {
	case "tcp", "mqtt":
		nc, err = d.Dial("tcp", uri.Host)
	case "ssl", "tls", "mqtts", "mqtt+ssl", "tcps":
		nc, err = tls.DialWithDialer(d, "tcp", uri.Host, o.TLSConfig)
	default:
		return nil, fmt.Errorf("broker scheme %q: an abortable client dials tcp and tls only", uri.Scheme)
	}
	if err != nil {
		return nil, err
	}
	cc := &cutConn{Conn: nc}
	cn.nc.Store(cc)
	return cc, nil
}

var errCut = errors.New("connection cut")

// cutConn is a connection that can be cut. paho ignores read errors that
// say the connection was closed locally (it assumes it closed it
// itself) and would notice the loss only at the next ping; reads on a
// cut connection say it was cut instead, so paho reports the loss at
// once.
type cutConn struct {
	net.Conn
	isCut atomic.Bool
}

func (c *cutConn) cut() {
	c.isCut.Store(true)
	_ = c.Close() // the cut is the point; the reader reports it
}

func (c *cutConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && c.isCut.Load() {
		err = errCut
	}
	return n, err
}

// backoff is the wait before retry n (from 0): doubling from first up to
// most, its upper half random so that clients that lost the same broker
// do not all come back at the same instant.
func backoff(n int, first, most time.Duration) time.Duration {
	d := most
	if n < 30 && first<<n < most {
		d = first << n
	}
	half := d / 2
	return half + rand.N(half+1)
}
