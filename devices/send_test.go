package devices_test

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
)

// A test sends a command the way the driver's handler does (Post, park,
// Collect when OnChange names the command's ack key): dial installs a
// waker on every client for it.

// waker turns OnChange calls into one-shot channels per key.
type waker struct {
	mu         sync.Mutex
	waits      map[string][]chan struct{}
	ackTimeout time.Duration
}

var (
	wakersMu sync.Mutex
	wakers   = map[*devices.Client]*waker{}
)

func newWaker(ackTimeout time.Duration) *waker {
	return &waker{waits: map[string][]chan struct{}{}, ackTimeout: ackTimeout}
}

// wait returns a channel closed at the next wake of key.
func (w *waker) wait(key string) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	w.waits[key] = append(w.waits[key], ch)
	w.mu.Unlock()
	return ch
}

func (w *waker) wake(key string) {
	w.mu.Lock()
	chs := w.waits[key]
	delete(w.waits, key)
	w.mu.Unlock()
	for _, ch := range chs {
		close(ch)
	}
}

// send is send with the client's ack timeout.
func send(ctx context.Context, c *devices.Client, device string, cmd wire.Command) (wire.Ack, error) {
	return sendTimeout(ctx, c, device, cmd, 0)
}

// sendTimeout sends cmd to device and waits for its outcome, at most
// until the earlier of ctx's deadline and ackTimeout (the client's when
// zero): the ack and nil when the device applied it, the ack and a
// *devices.RejectedError when it refused, an error wrapping
// driver.ErrAckTimeout when no ack came in time. While the connection
// is down it waits for it to come back.
func sendTimeout(ctx context.Context, c *devices.Client, device string, cmd wire.Command, ackTimeout time.Duration) (wire.Ack, error) {
	wakersMu.Lock()
	w := wakers[c]
	wakersMu.Unlock()
	if w == nil { // a client dialed without dial: nothing wakes it
		w = newWaker(time.Second)
	}
	if ackTimeout <= 0 {
		ackTimeout = w.ackTimeout
	}
	giveUp := time.Now().Add(ackTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(giveUp) {
		giveUp = d
	}
	timer := time.NewTimer(time.Until(giveUp))
	defer timer.Stop()
	key := devices.AckKey(device, cmd.ID)
	for {
		acked := w.wait(key)
		ack, done, err := c.Post(device, cmd, giveUp, nil)
		if errors.Is(err, devices.ErrNotConnected) {
			connected := w.wait(devices.ConnectedKey)
			if c.Connected() {
				continue // back between the Post and the wait
			}
			select {
			case <-connected:
				continue
			case <-timer.C:
			case <-ctx.Done():
			}
			return ack, err
		}
		if err != nil || done {
			return ack, err
		}
		for {
			select {
			case <-acked:
				acked = w.wait(key)
				if ack, done, err := c.Collect(device, cmd.ID, false); done {
					return ack, err
				}
				continue
			case <-timer.C:
			case <-ctx.Done():
			}
			ack, _, err := c.Collect(device, cmd.ID, true)
			return ack, err
		}
	}
}
