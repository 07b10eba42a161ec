package simulator

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sortie-edge/sortie/internal/mqttc"
)

// Conn is where a simulated device of another ecosystem connects; a
// home fills it from its own broker and credentials.
type Conn struct {
	Broker   string `toml:"-"`
	Username string `toml:"-"`
	Password string `toml:"-"`
}

// WiFiFaults are the faults of a device that is its own MQTT client (a
// Tasmota, a Shelly), as they show on a home's Wi-Fi.
type WiFiFaults struct {
	// Delay (plus up to Jitter) before a command is answered.
	Delay  time.Duration `toml:"delay"`
	Jitter time.Duration `toml:"jitter"`
	// Loss is the chance a command is lost on the way: nothing done,
	// nothing answered.
	Loss float64 `toml:"loss"`
	// AnswerLoss is the chance that a command is carried out and its
	// answer lost.
	AnswerLoss float64 `toml:"answer_loss"`
	// Travel is a cover's or shutter's full travel time.
	Travel time.Duration `toml:"travel"`
}

func (f WiFiFaults) check() error {
	switch {
	case f.Loss < 0 || f.Loss > 1 || f.AnswerLoss < 0 || f.AnswerLoss > 1:
		return errors.New("loss and answer_loss are probabilities 0..1")
	case f.Delay < 0 || f.Jitter < 0 || f.Travel < 0:
		return errors.New("delay, jitter and travel must not be negative")
	}
	return nil
}

// wifiDevice is what a Tasmota and a Shelly have in common: one MQTT
// connection, commands carried out one at a time in order after their
// delay, the faults above, and a position that travels.
type wifiDevice struct {
	client *mqttc.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// queue hands commands from the MQTT handler to the worker.
	queue chan queued
	// serve carries out one command after its delay; answerLost says
	// its answer must not go out.
	serve func(topic string, payload []byte, answerLost bool)
	// retainStates publishes a moving device's reports retained (an
	// ESPHome's states are).
	retainStates bool

	mu     sync.Mutex
	faults WiFiFaults
	rng    *rand.Rand
	pos    int
	move   *move
}

type queued struct {
	topic      string
	payload    []byte
	delay      time.Duration
	answerLost bool
}

// start starts the worker and connects with opts, subscribed to filters.
func (w *wifiDevice) start(ctx context.Context, opts mqttc.Options, filters ...string) error {
	w.queue = make(chan queued, 64)
	w.ctx, w.cancel = context.WithCancel(context.WithoutCancel(ctx))
	w.wg.Go(w.work)
	c, err := mqttc.New(opts)
	if err == nil {
		w.client = c
		err = subscribeAndConnect(ctx, c, w.onMessage, filters...)
	}
	if err != nil {
		w.cancel()
		w.wg.Wait()
	}
	return err
}

// onMessage draws the command's fate and queues it; it never blocks.
func (w *wifiDevice) onMessage(topic string, payload []byte) {
	w.mu.Lock()
	lost := w.rng.Float64() < w.faults.Loss
	delay := w.faults.Delay
	if w.faults.Jitter > 0 {
		delay += time.Duration(w.rng.Int64N(int64(w.faults.Jitter)))
	}
	answerLost := w.rng.Float64() < w.faults.AnswerLoss
	w.mu.Unlock()
	if lost {
		return
	}
	select {
	case w.queue <- queued{topic: topic, payload: payload, delay: delay, answerLost: answerLost}:
	default: // a flood beyond the device's buffer is dropped, as on a busy ESP
	}
}

func (w *wifiDevice) work() {
	for {
		select {
		case q := <-w.queue:
			if !sleepCtx(w.ctx, q.delay) {
				return
			}
			w.serve(q.topic, q.payload, q.answerLost)
		case <-w.ctx.Done():
			return
		}
	}
}

// travelTo sets the position moving to to; report is called with mu
// held at every tenth of the travel and at the arrival, and what it
// returns (payloads by topic) published. Caller holds mu.
func (w *wifiDevice) travelTo(to int, report func() map[string][]byte) {
	now := time.Now()
	from := w.pos
	if w.move != nil {
		from = w.move.at(now)
	}
	dist := float64(to - from)
	if dist < 0 {
		dist = -dist
	}
	mv := &move{from: from, to: to, start: now, end: now.Add(time.Duration(dist / 100 * float64(w.faults.Travel)))}
	w.move = mv
	tick := max(w.faults.Travel/10, 10*time.Millisecond)
	w.wg.Go(func() {
		for {
			if !sleepCtx(w.ctx, tick) {
				return
			}
			w.mu.Lock()
			if w.move != mv {
				w.mu.Unlock()
				return // a newer command took over
			}
			arrived := !time.Now().Before(mv.end)
			if arrived {
				w.pos, w.move = mv.to, nil
			}
			msgs := report()
			w.mu.Unlock()
			for topic, b := range msgs {
				w.client.PublishAsync(topic, b, w.retainStates, 0)
			}
			if arrived {
				return
			}
		}
	})
}

// moving reports the position now, where it is going, and in which
// direction (0 stopped, 1 up, -1 down). Caller holds mu.
func (w *wifiDevice) moving() (pos, target, dir int) {
	if w.move == nil {
		return w.pos, w.pos, 0
	}
	now := time.Now()
	pos, target = w.move.at(now), w.move.to
	if now.Before(w.move.end) {
		dir = -1
		if w.move.to > w.move.from {
			dir = 1
		}
	}
	return pos, target, dir
}

// Position reports the device's position (a cover's, a shutter's).
func (w *wifiDevice) Position() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	pos, _, _ := w.moving()
	return pos
}

// SetLoss changes the command and answer loss.
func (w *wifiDevice) SetLoss(loss, answerLoss float64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults.Loss, w.faults.AnswerLoss = loss, answerLoss
}

// Kill drops the connection without a goodbye, so that the broker
// publishes the device's will, and stops the device.
func (w *wifiDevice) Kill() {
	w.client.Abort()
	w.Close()
}

// Close stops the device.
func (w *wifiDevice) Close() {
	w.cancel()
	w.wg.Wait()
	w.client.Close()
}

// subscribeAndConnect subscribes a simulated device's client to the
// topics it takes commands on and connects it; on failure it closes it.
func subscribeAndConnect(ctx context.Context, c *mqttc.Client, handle func(string, []byte), filters ...string) error {
	for _, f := range filters {
		if _, err := c.Subscribe(f, handle); err != nil {
			c.Close()
			return err
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Connect(cctx); err != nil {
		c.Close()
		return err
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
