package simulator

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// BenchmarkHandle measures the device firmware on one command against a
// raw baseline measured in the same run: decoding the command and
// encoding an ack with encoding/json, the least any device must do.
// x_raw is the ratio.
func BenchmarkHandle(b *testing.B) {
	payloads := make([][]byte, 4096)
	for i := range payloads {
		payloads[i] = []byte(rawCmd(fmt.Sprint("cmd-", i), "set", fmt.Sprintf(`{"brightness":%d,"power":"on"}`, i%101)))
	}
	state := map[string]any{"power": "on", "brightness": 50, "color_temp": 4000}
	// The baseline runs b.N times in the same invocation (testing.Benchmark
	// cannot nest: it would wait for the benchmark lock we hold).
	start := time.Now()
	for i := range b.N {
		var cmd wire.Command
		if err := json.Unmarshal(payloads[i%len(payloads)], &cmd); err != nil {
			b.Fatal(err)
		}
		_, _ = json.Marshal(wire.Ack{ID: cmd.ID, OK: true, State: state})
	}
	rawPerOp := float64(time.Since(start)) / float64(b.N)
	d := offlineDevice(b, TypeLight, Faults{AckLoss: 0.1})
	// As the agent runs its simulated home below info level: at info a
	// device logs every command, which would be most of what is measured.
	d.log = discard
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		d.handle(payloads[i%len(payloads)], now)
	}
	b.StopTimer()
	b.ReportMetric(rawPerOp, "raw_ns/op")
	b.ReportMetric(float64(b.Elapsed())/float64(b.N)/rawPerOp, "x_raw")
}

// BenchmarkRoundTrip measures command → ack through a real broker
// against a raw QoS 1 publish → delivery round trip through the same
// broker. x_raw is the ratio.
func BenchmarkRoundTrip(b *testing.B) {
	br := brokertest.Start(b)
	startHome(b, br, DeviceConfig{ID: "light", Type: TypeLight})
	got := make(chan struct{}, 1)
	c := paho.NewClient(paho.NewClientOptions().AddBroker(br.URL()).SetClientID("bench"))
	if err := waitToken(c.Connect(), "connect"); err != nil {
		b.Fatal(err)
	}
	defer c.Disconnect(100)
	topics := wire.Topics{}
	signal := func(paho.Client, paho.Message) { got <- struct{}{} }
	if err := subscribed(c.SubscribeMultiple(map[string]byte{"bench/echo": 1, topics.Ack("light"): 1}, signal), "subscribe"); err != nil {
		b.Fatal(err)
	}
	roundTrip := func(topic string, payload func(i int) string, n int) time.Duration {
		start := time.Now()
		for i := range n {
			if err := waitToken(c.Publish(topic, 1, false, payload(i)), "publish"); err != nil {
				b.Fatal(err)
			}
			testkit.Receive(b, got, wait, "no answer")
		}
		return time.Since(start)
	}
	const n = 500
	rawPerOp := float64(roundTrip("bench/echo", func(int) string { return "x" }, n)) / n
	b.ResetTimer()
	el := roundTrip(topics.Command("light"), func(i int) string { return rawCmd(fmt.Sprint("c", i, "-", b.N), "set", `{"brightness":5}`) }, b.N)
	b.StopTimer()
	b.ReportMetric(rawPerOp, "raw_ns/op")
	b.ReportMetric(float64(el)/float64(b.N)/rawPerOp, "x_raw")
}
