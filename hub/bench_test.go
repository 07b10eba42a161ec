package hub

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/uplink"
)

const (
	benchGateways = 100
	// benchBatch is the events per message: a gateway's outbox sends
	// its backlog in batches, so one MQTT message carries many events.
	benchBatch = 20
	// benchWindow is how many unacknowledged QoS 1 publishes a gateway
	// keeps in flight (mochi's receive maximum is 1024).
	benchWindow = 32
)

// BenchmarkIngest measures the hub's ingest: 100 gateways (paho clients
// with their own credentials, ACL on) publish batches of mission events
// at QoS 1 to the embedded broker; the hub stores each group of batches
// in one fsynced bbolt transaction and acknowledges it. b.N is the
// number of messages (batches) in total; each carries benchBatch events.
//
// The baselines, measured first in the same run on the same broker, are
// the raw broker: the same 100 clients publish at QoS 1 and one
// subscriber (the hub identity) only counts.
//
// Metrics (events are mission events; msgs are MQTT messages):
//
//	events/s, msgs/s     through the hub, from the first publish to the last ack
//	raw-msgs/s           raw broker, one event per message
//	raw-batch-msgs/s     raw broker, the hub's payloads (benchBatch events each)
//	events/raw-msg       hub events/s ÷ raw-msgs/s: the goal (≥ 0.5) compares
//	                     batched ingest with sending each event on its own
//	msgs/raw-batch-msg   hub msgs/s ÷ raw-batch-msgs/s: the hub's cost over
//	                     the bare broker for the very same messages
//	p99-lag-ms           publish → the ack saying the batch is stored
//
// The publishers, broker and hub share the machine's CPUs.
func BenchmarkIngest(b *testing.B) {
	ids := make([]string, benchGateways)
	for i := range ids {
		ids[i] = fmt.Sprintf("gw%03d", i)
	}
	broker := testBroker(b, ids...)
	gws := make([]*fakeGateway, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { gws[i] = newGateway(b, broker.URL(), id) })
	}
	wg.Wait()
	perGW := max(1, (b.N+benchGateways-1)/benchGateways)
	msgs := perGW * benchGateways

	// Raw baselines: a subscriber (the hub identity) only counts. They
	// send a bounded number of messages: a bare subscriber has no flow
	// control, and past mochi's pending-writes limit the broker drops what
	// it cannot deliver, so a long raw run would never complete.
	rawN := min(perGW, 20)
	rawSingle := rawRate(b, broker.URL(), gws, rawN, 1)
	rawBatch := rawRate(b, broker.URL(), gws, rawN, benchBatch)

	// The hub, with a real (fsynced) store.
	st, err := Open(filepath.Join(b.TempDir(), "hub.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			b.Error(err)
		}
	}()
	svc := NewService(st, ServiceOptions{Broker: broker.URL(), ClientID: hubClientID, Username: hubUser, Password: hubPassword})
	runService(b, svc, wait)
	lags := make([][]time.Duration, len(gws))
	b.StartTimer()
	start := time.Now()
	publishAll(b, gws, perGW, "hub", benchBatch, lags)
	hubElapsed := time.Since(start)
	b.StopTimer()

	all := slices.Concat(lags...)
	slices.Sort(all)
	p99 := all[min(len(all)-1, len(all)*99/100)]
	events := float64(msgs * benchBatch)
	hubEvents := events / hubElapsed.Seconds()
	hubRate := float64(msgs) / hubElapsed.Seconds()
	b.ReportMetric(hubEvents, "events/s")
	b.ReportMetric(hubRate, "msgs/s")
	b.ReportMetric(rawSingle, "raw-msgs/s")
	b.ReportMetric(rawBatch, "raw-batch-msgs/s")
	b.ReportMetric(hubEvents/rawSingle, "events/raw-msg")
	b.ReportMetric(hubRate/rawBatch, "msgs/raw-batch-msg")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-lag-ms")
	b.ReportMetric(benchBatch, "events/msg")
	if got, _ := st.Gateway(b.Context(), ids[0]); got.Events != uint64(perGW*benchBatch) {
		b.Fatalf("gateway %s stored %d events, want %d", ids[0], got.Events, perGW*benchBatch)
	}
}

// rawRate is the broker's QoS 1 rate in messages per second for n
// messages of size events from each gateway, with one subscriber
// counting them. It runs with the benchmark timer stopped.
func rawRate(b *testing.B, url string, gws []*fakeGateway, n, size int) float64 {
	b.StopTimer()
	defer b.StartTimer()
	total := n * len(gws)
	done := make(chan struct{})
	var mu sync.Mutex
	count := 0
	obs := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID(fmt.Sprintf("raw-counter-%d", size)).
		SetUsername(hubUser).SetPassword(hubPassword).SetOrderMatters(false))
	if tok := obs.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
	defer obs.Disconnect(0)
	tok := obs.Subscribe(uplink.Topics{}.Wildcard("events"), 1, func(paho.Client, paho.Message) {
		mu.Lock()
		defer mu.Unlock()
		if count++; count == total {
			close(done)
		}
	})
	if !tok.WaitTimeout(wait) || tok.Error() != nil {
		b.Fatal(tok.Error())
	}
	start := time.Now()
	publishAll(b, gws, n, fmt.Sprint("raw", size), size, nil)
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatal("raw subscriber did not get every message")
	}
	return float64(total) / time.Since(start).Seconds()
}

// publishAll has every gateway publish n batches on its events topic.
// With lags set, each gateway also waits for the hub's acks and records
// the delay from publishing a batch to the ack that covers it.
func publishAll(b *testing.B, gws []*fakeGateway, n int, tag string, size int, lags [][]time.Duration) {
	var wg sync.WaitGroup
	errs := make(chan error, len(gws))
	for gi, g := range gws {
		wg.Go(func() {
			sent := make([]time.Time, n)
			var window []paho.Token
			for k := range n {
				payload := benchPayload(g.id, tag, k, size)
				sent[k] = time.Now()
				window = append(window, g.c.Publish(g.topics.Events(g.id), 1, false, payload))
				if len(window) == benchWindow {
					if err := mqttc.Wait(b.Context(), window[0], wait); err != nil {
						errs <- fmt.Errorf("%s: publish: %w", g.id, err)
						return
					}
					window = window[1:]
				}
			}
			for _, t := range window {
				if err := mqttc.Wait(b.Context(), t, wait); err != nil {
					errs <- fmt.Errorf("%s: publish: %w", g.id, err)
					return
				}
			}
			if lags == nil {
				return
			}
			acked := 0 // batches covered by acks so far
			deadline := time.After(time.Minute)
			for acked < n {
				select {
				case a := <-g.acks:
					now := time.Now()
					for acked < n && uint64((acked+1)*benchBatch) <= a.Upto {
						lags[gi] = append(lags[gi], now.Sub(sent[acked]))
						acked++
					}
				case <-deadline:
					errs <- fmt.Errorf("%s: %d of %d batches acknowledged", g.id, acked, n)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// benchPayload is batch k of a gateway: size events, four per mission,
// outbox seqs k*size+1 onwards.
func benchPayload(gw, tag string, k, size int) []byte {
	now := time.Now()
	es := make([]uplink.Entry, size)
	const perMission = 4
	for i := range es {
		mission := fmt.Sprintf("%s-%d-%d", tag, k, i/perMission)
		step := i % perMission
		es[i] = uplink.Entry{
			Seq: uint64(k*size + i + 1),
			Event: driver.Event{
				MissionID: mission, Seq: uint64(step + 1), Type: "transition", Input: driver.InBeginStep,
				From: driver.StateRunning, To: driver.StateStepRunning, Step: step, StepID: "step-" + fmt.Sprint(step), Attempt: 1, Time: now,
			},
			Mission: driver.Summary{
				Scene: "go_home", State: driver.StateStepRunning, Step: step, Steps: perMission, Created: now, Updated: now,
				StepIDs: []string{"step-0", "step-1", "step-2", "step-3"}, TraceID: "0123456789abcdef",
			},
		}
	}
	p, _ := json.Marshal(uplink.Batch{Gateway: gw, Entries: es})
	return p
}
