package devices_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/simulator"
)

// ecoDelay is the simulated devices' own answer time in the ecosystem
// benchmarks: a Zigbee round trip, a Wi-Fi device's.
const ecoDelay = 50 * time.Millisecond

// BenchmarkEcosystemStep measures one command step to a device of each
// ecosystem (Zigbee2MQTT, Tasmota, Shelly, ESPHome, a Home Assistant
// MQTT device) through the production path (Handlers.Command, PostState,
// the adapter, the embedded broker, the simulated device, Decode, the
// ack, Collect) against the raw round trip in the same run: a bare MQTT
// client that publishes the ecosystem's own command to the same device
// and waits for its answer. They alternate, the raw command switching
// the device on, the step off; the device answers after ecoDelay. It reports the p50 of
// each and Sortie's overhead (p50 step - p50 raw), whose goal is 2 ms.
func BenchmarkEcosystemStep(b *testing.B) {
	const samples = 30
	for _, eco := range []struct {
		name, registry, device string
		start                  func(b *testing.B, url string)
		// raw is the ecosystem's own command, its answer topic, and what
		// the answer holds.
		raw func(on bool) (topic, payload, answer, holds string)
	}{
		{"zigbee2mqtt", z2mRegistry, "hall-bulb", func(b *testing.B, url string) {
			z, err := simulator.StartZigbee2MQTT(b.Context(), simulator.Z2MConfig{Broker: url,
				Devices: []simulator.Z2MDevice{{Name: "Hall/Bulb", Kind: "light", Delay: ecoDelay}}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(z.Close)
		}, func(on bool) (string, string, string, string) {
			s := map[bool]string{true: "ON", false: "OFF"}[on]
			return "zigbee2mqtt/Hall/Bulb/set", `{"state":"` + s + `"}`, "zigbee2mqtt/Hall/Bulb", `"state":"` + s + `"`
		}},
		{"tasmota", tasmotaRegistry, "desk-lamp", func(b *testing.B, url string) {
			d, err := simulator.StartTasmota(b.Context(), simulator.TasmotaConfig{Conn: simulator.Conn{Broker: url},
				Topic: "tasmota_5E1A2B", Kind: "dimmer", WiFiFaults: simulator.WiFiFaults{Delay: ecoDelay}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(d.Close)
		}, func(on bool) (string, string, string, string) {
			s := map[bool]string{true: "ON", false: "OFF"}[on]
			return "cmnd/tasmota_5E1A2B/POWER", s, "stat/tasmota_5E1A2B/RESULT", `"POWER":"` + s + `"`
		}},
		{"shelly", shellyRegistry, "pump", func(b *testing.B, url string) {
			d, err := simulator.StartShelly(b.Context(), simulator.ShellyConfig{Conn: simulator.Conn{Broker: url},
				ID: "shellyplus1-4855199bc0e8", Kind: "switch", WiFiFaults: simulator.WiFiFaults{Delay: ecoDelay}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(d.Close)
		}, func(on bool) (string, string, string, string) {
			id := map[bool]string{true: "on", false: "off"}[on]
			return "shellyplus1-4855199bc0e8/rpc",
				fmt.Sprintf(`{"id":%q,"src":"bench-raw","method":"Switch.Set","params":{"id":0,"on":%v}}`, id, on), "bench-raw/rpc", `"id":"` + id + `"`
		}},
		{"esphome", esphomeRegistry, "fan", func(b *testing.B, url string) {
			n, err := simulator.StartESPHome(b.Context(), simulator.ESPHomeConfig{Conn: simulator.Conn{Broker: url}, Name: "attic",
				Entities: []simulator.ESPHomeEntity{{Type: "switch", ObjectID: "fan"}}, WiFiFaults: simulator.WiFiFaults{Delay: ecoDelay}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(n.Close)
		}, func(on bool) (string, string, string, string) {
			s := map[bool]string{true: "ON", false: "OFF"}[on]
			return "attic/switch/fan/command", s, "attic/switch/fan/state", s
		}},
		{"homeassistant", haRegistry, "garage-relay", func(b *testing.B, url string) {
			d, err := simulator.StartHA(b.Context(), simulator.HAConfig{Conn: simulator.Conn{Broker: url}, Name: "garage",
				Entities: []simulator.HAEntity{{Type: "switch", ObjectID: "relay"}, {Type: "light", ObjectID: "lamp"},
					{Type: "lock", ObjectID: "door"}, {Type: "cover", ObjectID: "blind"}},
				WiFiFaults: simulator.WiFiFaults{Delay: ecoDelay}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(d.Close)
		}, func(on bool) (string, string, string, string) {
			s := map[bool]string{true: "ON", false: "OFF"}[on]
			return "garage/relay/set", s, "garage/relay/state", `"POWER":"` + s + `"`
		}},
	} {
		b.Run(eco.name, func(b *testing.B) {
			r := newEcoRig(b, nil, eco.registry)
			eco.start(b, r.broker.URL())
			raw := newRawEco(b, r.broker.URL())
			var step, base []time.Duration
			seq := 0
			for range b.N {
				for range samples {
					// The raw command switches the device on, the step off:
					// each changes it (ESPHome reports only changes), and a
					// report left over from the other cannot end it.
					topic, payload, answer, holds := eco.raw(true)
					base = append(base, raw.roundTrip(b, topic, payload, answer, holds))
					// The agent hears the answer too; the step starts once it
					// has (an ESPHome device it believes off would be done
					// without a command).
					waitUntil(b, r.client, eco.device, "on", func() bool { st, _ := r.client.State(eco.device); return st["power"] == "on" })
					seq++
					start := time.Now()
					if _, err := r.run(b, "device.command", z2mCommand(b, fmt.Sprintf("s%d", seq), eco.device, "turn_off", nil, 1)); err != nil {
						b.Fatal(err)
					}
					step = append(step, time.Since(start))
				}
			}
			ps, pb := p50(step), p50(base)
			b.ReportMetric(float64(ps.Microseconds())/1000, "step_p50_ms")
			b.ReportMetric(float64(pb.Microseconds())/1000, "raw_p50_ms")
			b.ReportMetric(float64((ps-pb).Microseconds())/1000, "overhead_ms")
		})
	}
}

// BenchmarkZigbee2MQTTBridgeOf100Bulbs sends one command to each of 100
// bulbs behind one Zigbee2MQTT bridge whose coordinator works on 4 at
// once, all at the same moment, through the handlers (the bridge's
// default link admits 4 in flight), and reports the makespan against the
// ideal ⌈100/4⌉ × the bulbs' round trip, and the commands that failed.
func BenchmarkZigbee2MQTTBridgeOf100Bulbs(b *testing.B) {
	const bulbs, queue = 100, 4
	var reg strings.Builder
	reg.WriteString(z2mRegistry[:strings.Index(z2mRegistry, "[[devices]]")])
	var devs []simulator.Z2MDevice
	for i := range bulbs {
		fmt.Fprintf(&reg, "[[devices]]\nid = \"bulb-%03d\"\ntype = \"light\"\nprotocol = \"zigbee2mqtt\"\naddress = \"Bulb %03d\"\n", i, i)
		devs = append(devs, simulator.Z2MDevice{Name: fmt.Sprintf("Bulb %03d", i), Kind: "light", Delay: ecoDelay})
	}
	r := newEcoRig(b, nil, reg.String())
	z, err := simulator.StartZigbee2MQTT(b.Context(), simulator.Z2MConfig{Broker: r.broker.URL(), Queue: queue, Devices: devs})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(z.Close)
	ideal := time.Duration(math.Ceil(float64(bulbs)/queue)) * ecoDelay
	var worst time.Duration
	failed := 0
	for n := range b.N {
		var wg sync.WaitGroup
		var mu sync.Mutex
		start := time.Now()
		for i := range bulbs {
			wg.Go(func() {
				action := map[bool]string{true: "turn_on", false: "turn_off"}[n%2 == 0]
				_, err := r.run(b, "device.command", z2mCommand(b, fmt.Sprintf("b%d-%d", n, i), fmt.Sprintf("bulb-%03d", i), action, nil, 1))
				if err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		worst = max(worst, time.Since(start))
	}
	b.ReportMetric(worst.Seconds(), "makespan_s")
	b.ReportMetric(ideal.Seconds(), "ideal_s")
	b.ReportMetric(worst.Seconds()/ideal.Seconds(), "x_ideal")
	b.ReportMetric(float64(failed), "failed")
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// rawEco is a bare MQTT client that sends an ecosystem's own command and
// waits for its answer: the baseline of BenchmarkEcosystemStep.
type rawEco struct {
	c    *mqttc.Client
	mu   sync.Mutex
	subs map[string]bool
	want string
	got  chan struct{}
}

func newRawEco(b *testing.B, url string) *rawEco {
	c, err := mqttc.New(mqttc.Options{Broker: url, ClientID: "bench-raw"})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return &rawEco{c: c, subs: map[string]bool{}}
}

// roundTrip publishes payload on topic and returns when a message on
// answer holds the string holds (the answers to Sortie's own commands,
// which come on the same topic, do not).
func (r *rawEco) roundTrip(b *testing.B, topic, payload, answer, holds string) time.Duration {
	r.mu.Lock()
	if !r.subs[answer] {
		r.subs[answer] = true
		r.mu.Unlock()
		if _, err := r.c.Subscribe(answer, r.onAnswer); err != nil {
			b.Fatal(err)
		}
		r.mu.Lock()
	}
	got := make(chan struct{})
	r.want, r.got = holds, got
	r.mu.Unlock()
	start := time.Now()
	if err := r.c.Publish(topic, []byte(payload), false, 1); err != nil {
		b.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		b.Fatalf("no answer holding %s on %s", holds, answer)
	}
	return time.Since(start)
}

func (r *rawEco) onAnswer(_ string, payload []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got != nil && strings.Contains(string(payload), r.want) {
		close(r.got)
		r.got = nil
	}
}
