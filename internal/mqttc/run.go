package mqttc

import (
	"errors"
	"fmt"
	"time"
)

// run is the Client's goroutine: it connects, makes the subscriptions,
// calls the hooks and logs, and after a loss waits its backoff and
// connects again, until Close (or, with Options.Once, the end of the
// one connection).
func (c *Client) run() {
	var (
		fails    int       // attempts failed since the last connection was up
		wasUp    bool      // a connection has been up before
		lostAt   time.Time // when the last one ended
		loggedAt time.Time // of the last failed attempt logged
	)
	for {
		err := c.connectOnce(&wasUp, &lostAt, fails)
		switch {
		case errors.Is(err, ErrClosed):
			return
		case err == nil: // it was up, and is lost
			fails = 0
			if c.opts.Once {
				return
			}
		default:
			fails++
			c.mu.Lock()
			c.lastErr = err
			c.mu.Unlock()
			if c.opts.Once {
				c.answer(false)
				return
			}
			if now := time.Now(); now.Sub(loggedAt) >= FailureLogInterval {
				loggedAt = now
				c.log.Warn("cannot connect to the broker; retrying", "broker", c.opts.Broker, "attempts", fails, "err", err)
			}
		}
		t := time.NewTimer(backoff(max(fails-1, 0), min(firstBackoff, c.opts.MaxReconnectInterval), c.opts.MaxReconnectInterval))
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// connectOnce makes one connection and serves it until it ends. It
// returns nil once a connection that was up is lost, ErrClosed at Close,
// and otherwise why the connection could not be made (or made ready).
func (c *Client) connectOnce(wasUp *bool, lostAt *time.Time, fails int) error {
	cn := c.newConn()
	c.last.Store(cn)
	// paho bounds the dial and the handshake by ConnectTimeout each; this
	// bounds the whole, should paho not.
	tok := cn.pc.Connect()
	if err := Wait(c.ctx, tok, 2*c.opts.ConnectTimeout+time.Second); err != nil {
		select {
		case <-tok.Done(): // a failed attempt: paho has cleaned up
		default:
			cn.pc.Disconnect(0) // abandons the attempt; paho ends it within ConnectTimeout
		}
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		return err
	}
	if err := c.resubscribe(cn); err != nil {
		cn.pc.Disconnect(uint(quiesce / time.Millisecond))
		if c.ctx.Err() != nil {
			return ErrClosed
		}
		return err
	}
	if !c.opts.Once {
		if *wasUp {
			c.log.Info("broker connection restored", "broker", c.opts.Broker, "down_for", time.Since(*lostAt).Round(time.Millisecond), "attempts", fails+1)
		} else {
			c.log.Info("connected to the broker", "broker", c.opts.Broker)
		}
	}
	*wasUp = true
	if c.opts.OnConnect != nil {
		c.opts.OnConnect()
	}
	c.answer(true)
	select {
	case <-cn.lost:
		c.down()
		c.mu.Lock()
		c.lastErr = fmt.Errorf("connection lost: %w", cn.lostErr)
		c.mu.Unlock()
		*lostAt = time.Now()
		if !c.opts.Once {
			c.log.Warn("broker connection lost", "broker", c.opts.Broker, "err", cn.lostErr)
		}
		if c.opts.OnConnectionLost != nil {
			c.opts.OnConnectionLost(cn.lostErr)
		}
		return nil
	case <-c.ctx.Done():
		c.down()
		cn.pc.Disconnect(uint(quiesce / time.Millisecond))
		return ErrClosed
	}
}

// resubscribe makes every subscription on a new connection, retrying
// while the connection lasts, and then declares the connection up. A
// subscription added meanwhile is made too before that: Subscribe makes
// its own only once the connection is up.
func (c *Client) resubscribe(cn *conn) error {
	// made holds the QoS each filter was made at: a handler added since
	// at a higher one has it asked again.
	made := make(map[*topic]byte)
	for n := 0; ; {
		c.mu.Lock()
		var todo, optional []*topic
		for _, t := range c.subs {
			if q, ok := made[t]; ok && q >= t.qos() {
				continue
			}
			if t.optional() {
				optional = append(optional, t)
			} else {
				todo = append(todo, t)
			}
		}
		if len(todo) == 0 && len(optional) == 0 {
			c.cur.Store(cn)
			close(c.up)
			c.lastErr, c.loggedSubErr = nil, ""
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		var err error
		// Optional ones one by one: a refusal names its filter, and is
		// not asked again on this connection.
		for _, t := range optional {
			q := t.qos()
			switch e := c.subscribe(cn, []*topic{t}); {
			case e == nil:
				made[t] = q
			case errors.Is(e, ErrRefused):
				made[t] = q
				c.log.Warn("optional subscription refused; going on without it", "broker", c.opts.Broker, "err", e)
			default:
				err = e // the connection's trouble: waited out below
			}
		}
		if err == nil && len(todo) > 0 {
			qs := make([]byte, len(todo))
			for i, t := range todo {
				qs[i] = t.qos()
			}
			if err = c.subscribe(cn, todo); err == nil {
				for i, t := range todo {
					made[t] = qs[i]
				}
			}
		}
		if err == nil {
			n = 0
			continue
		}
		// Connect keeps waiting: a refusal may pass (an ACL put right, a
		// broker's packet identifier conflict), and Problem says why the
		// Client is not up meanwhile.
		c.mu.Lock()
		c.lastErr = err
		logIt := c.loggedSubErr != err.Error()
		c.loggedSubErr = err.Error()
		c.mu.Unlock()
		select {
		case <-cn.lost:
			return cn.lostErr
		case <-c.ctx.Done():
			return ErrClosed
		default:
		}
		wait := backoff(n, subBackoff, maxSubBackoff)
		n++
		if logIt {
			c.log.Warn("subscribe failed; retrying until it succeeds", "broker", c.opts.Broker, "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-cn.lost:
			t.Stop()
			return cn.lostErr
		case <-c.ctx.Done():
			t.Stop()
			return ErrClosed
		}
	}
}

// down marks the connection down: Publish and Subscribe wait for the
// next one.
func (c *Client) down() {
	c.mu.Lock()
	c.cur.Store(nil)
	c.up = make(chan struct{})
	c.mu.Unlock()
}

// answer tells Connect how the first connection went, once.
func (c *Client) answer(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.first:
	default:
		c.firstOK = ok
		close(c.first)
	}
}
