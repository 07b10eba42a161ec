package devices_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
)

// BenchmarkRoundTrip measures command round trips per second through the
// embedded broker: the client's production path (Post, park, Collect
// when OnChange names the ack, as the command handler does) against a
// raw paho requester that
// publishes and correlates acks by ID itself, both answered by the same
// echo responder, with 1 and 64 commands in flight. The two alternate in
// ten slices of each run, so load from elsewhere on the machine hits both
// alike; the run reports each one's ops/s and client/raw as x_raw.
func BenchmarkRoundTrip(b *testing.B) {
	br := brokertest.Start(b)
	topics := wire.Topics{}
	startEcho(b, br.URL(), topics, "bench")
	raw := newRawRequester(b, br.URL(), topics)
	c := dial(b, br, func(o *devices.Options) { o.AckTimeout = 10 * time.Second })

	var seq atomic.Int64
	rawOp := func(ctx context.Context) error {
		return raw.roundTrip(ctx, "bench", fmt.Sprintf("r%d", seq.Add(1)))
	}
	clientOp := func(ctx context.Context) error {
		_, err := send(ctx, c, "bench", wire.Command{ID: fmt.Sprintf("c%d", seq.Add(1)), Action: "turn_on"})
		return err
	}
	for _, inflight := range []int{1, 64} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			const slices = 10
			var rawTime, clientTime time.Duration
			n := max(b.N/slices, 1)
			for range slices {
				rawTime += run(b, inflight, n, rawOp)
				clientTime += run(b, inflight, n, clientOp)
			}
			total := float64(n * slices)
			rawRate, clientRate := total/rawTime.Seconds(), total/clientTime.Seconds()
			b.ReportMetric(clientRate, "client_ops/s")
			b.ReportMetric(rawRate, "raw_ops/s")
			b.ReportMetric(clientRate/rawRate, "x_raw")
		})
	}
}

// run calls op n times from inflight goroutines and returns the time it
// took.
func run(b *testing.B, inflight, n int, op func(context.Context) error) time.Duration {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range inflight {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := op(ctx); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return elapsed
}

// startEcho runs a device that acks every command at once. Its handler
// only hands commands to workers, which publish and check the tokens.
func startEcho(b *testing.B, url string, topics wire.Topics, id string) {
	in := make(chan []byte, 4096)
	done := make(chan struct{})
	var wg sync.WaitGroup
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID("echo-" + id).SetOrderMatters(false)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		b.Fatalf("echo connect: %v", tok.Error())
	}
	if tok := c.Subscribe(topics.Command(id), 1, func(_ mqtt.Client, m mqtt.Message) {
		select {
		case in <- m.Payload():
		case <-done:
		}
	}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		b.Fatalf("echo subscribe: %v", tok.Error())
	}
	for range 64 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case p := <-in:
					var cmd struct {
						ID string `json:"id"`
					}
					if err := json.Unmarshal(p, &cmd); err != nil {
						b.Errorf("echo: %v", err)
						continue
					}
					ack, _ := json.Marshal(wire.Ack{ID: cmd.ID, OK: true})
					tok := c.Publish(topics.Ack(id), 1, false, ack)
					select {
					case <-tok.Done():
					case <-done:
						return
					}
				}
			}
		})
	}
	b.Cleanup(func() {
		close(done)
		c.Disconnect(0)
		wg.Wait()
	})
}

// rawRequester is the baseline: plain paho, one map of waiters by ID.
type rawRequester struct {
	c       mqtt.Client
	topics  wire.Topics
	mu      sync.Mutex
	waiters map[string]chan struct{}
}

func newRawRequester(b *testing.B, url string, topics wire.Topics) *rawRequester {
	r := &rawRequester{topics: topics, waiters: map[string]chan struct{}{}}
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID("raw-requester").SetOrderMatters(false)
	r.c = mqtt.NewClient(o)
	if tok := r.c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		b.Fatalf("raw connect: %v", tok.Error())
	}
	if tok := r.c.Subscribe(topics.Wildcard("ack"), 1, func(_ mqtt.Client, m mqtt.Message) {
		var ack struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(m.Payload(), &ack) != nil {
			return
		}
		r.mu.Lock()
		ch := r.waiters[ack.ID]
		delete(r.waiters, ack.ID)
		r.mu.Unlock()
		if ch != nil {
			close(ch)
		}
	}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		b.Fatalf("raw subscribe: %v", tok.Error())
	}
	b.Cleanup(func() { r.c.Disconnect(0) })
	return r
}

func (r *rawRequester) roundTrip(ctx context.Context, device, id string) error {
	ch := make(chan struct{})
	r.mu.Lock()
	r.waiters[id] = ch
	r.mu.Unlock()
	payload, _ := json.Marshal(struct {
		ID     string `json:"id"`
		Action string `json:"action"`
	}{id, "turn_on"})
	tok := r.c.Publish(r.topics.Command(device), 1, false, payload)
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		if err := tok.Error(); err != nil {
			return fmt.Errorf("raw round trip %s: no ack, publish failed: %w", id, err)
		}
		return fmt.Errorf("raw round trip %s: no ack", id)
	}
}
