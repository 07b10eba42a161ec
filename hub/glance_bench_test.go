package hub

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// glanceGateways is the fleet the glance's benchmarks measure.
const glanceGateways = 10000

// fillGlance stores n gateways in st (a tenth offline, a twentieth with
// a backlog; each heartbeat with 8 devices) and roll-up rows for each,
// in 20 hours of the week before now, and for 50 scenes in every hour:
// the shape of a million missions a week.
func fillGlance(b *testing.B, st Backing, n int, now time.Time) []string {
	b.Helper()
	ids := make([]string, n)
	var in []Inbound
	flush := func() {
		if _, err := st.Apply(context.Background(), in); err != nil {
			b.Fatal(err)
		}
		in = in[:0]
	}
	for i := range ids {
		id := fmt.Sprintf("gw-%05d", i)
		ids[i] = id
		state := StateOnline
		if i%10 == 9 {
			state = StateOffline
		}
		in = append(in, Inbound{Gateway: id, Status: &uplink.Status{Gateway: id, State: state, Time: now}, Received: now})
		if state == StateOnline {
			hb := &uplink.Heartbeat{Gateway: id, Version: "v1.4.0", Time: now, Backlog: (i % 20) / 19 * 12}
			for d := range 8 {
				hb.Devices = append(hb.Devices, uplink.DeviceState{ID: fmt.Sprintf("dev-%d", d), Type: "light", Room: "hall", Online: true})
			}
			in = append(in, Inbound{Gateway: id, Heartbeat: hb, Received: now})
		}
		if len(in) >= 1000 {
			flush()
		}
	}
	if len(in) > 0 {
		flush()
	}
	hour := now.Unix() / 3600
	var ds []outcomeDelta
	for i, id := range ids {
		for h := range 20 {
			var v OutcomeRow
			v[oSucceeded], v[oFailed], v[oHist+20] = 4, int64(i%7), 4+int64(i%7)
			ds = append(ds, outcomeDelta{scope: scopeGateway(id), hour: hour - int64((i+h*8)%168), v: v})
		}
	}
	for s := range 50 {
		for h := range 168 {
			var v OutcomeRow
			v[oSucceeded], v[oFailed] = 500, int64(s)
			ds = append(ds, outcomeDelta{scope: scopeScene(fmt.Sprintf("scene-%02d", s)), hour: hour - int64(h), v: v})
		}
	}
	writeDeltas(b, st, ds)
	return ids
}

// writeDeltas writes roll-up rows straight into the store, 5,000 a
// transaction (into PostgreSQL with COPY: the rows are new).
func writeDeltas(b *testing.B, st Backing, ds []outcomeDelta) {
	b.Helper()
	for len(ds) > 0 {
		n := min(len(ds), 5000)
		var err error
		switch s := st.(type) {
		case *Store:
			err = s.update(context.Background(), func(tx *bolt.Tx) error { return boltOutcomes(tx, ds[:n]) })
		case *PGStore:
			rows := make([][]any, n)
			for i, d := range ds[:n] {
				rows[i] = []any{d.scope, d.hour, d.v[:]}
			}
			_, err = s.pool.CopyFrom(context.Background(), pgx.Identifier{"sortie_outcomes"}, []string{"scope", "hour", "v"}, pgx.CopyFromRows(rows))
		default:
			b.Fatalf("store %T", st)
		}
		if err != nil {
			b.Fatal(err)
		}
		ds = ds[n:]
	}
}

// BenchmarkGlance10k measures the fleet's glance at 10,000 gateways on
// the bbolt store: each endpoint the dashboard reads, its time and the
// bytes it sends, beside the whole gateways list and the whole rollout
// (what the page read before).
func BenchmarkGlance10k(b *testing.B) {
	st := testStore(b).(*Store)
	now := time.Now()
	ids := fillGlance(b, st, glanceGateways, now)
	f := NewFleet(st, FleetOptions{Send: func(string, uplink.Control) error { return nil }})
	if err := f.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, bn := range []*struct{ desc string }{{""}, {"v2"}} {
		enc, err := testBundle(b, bn.desc, "").Encode()
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := f.PushBundle(context.Background(), "", enc); err != nil {
			b.Fatal(err)
		}
	}
	for _, id := range ids {
		f.NoteGateway(Gateway{ID: id, State: StateOnline})
	}
	if err := f.Step(context.Background()); err != nil {
		b.Fatal(err)
	}
	v, err := f.StartRollout(context.Background(), RolloutSpec{Canary: 100})
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Step(context.Background()); err != nil {
		b.Fatal(err)
	}
	e := newEnv(b)
	api := NewAPIOn(rigBackend{e.svc, f}, st, APIOptions{Token: testToken})
	srv := httptest.NewServer(api)
	b.Cleanup(func() { api.Close(); srv.Close() })
	for _, c := range []struct{ name, path string }{
		{"overview", "/api/fleet/overview"},
		{"gateways-page", "/api/gateways?limit=50&state=offline"},
		{"gateways-all", "/api/gateways"},
		{"worst-gateway", "/api/fleet/worst?by=gateway&range=7d"},
		{"worst-scene", "/api/fleet/worst?by=scene&range=7d"},
		{"rollout-page", "/api/rollouts/" + v.ID + "?limit=200"},
		{"rollout-all", "/api/rollouts/" + v.ID},
	} {
		b.Run(c.name, func(b *testing.B) {
			size := 0
			cpu0 := cpuTime()
			for b.Loop() {
				api.worst, api.overview = ttlCache[Worst]{}, ttlCache[FleetOverview]{} // each read computes its answer
				req, _ := http.NewRequest(http.MethodGet, srv.URL+c.path, nil)
				req.Header.Set("Authorization", "Bearer "+testToken)
				req.Header.Set("Accept-Encoding", "identity")
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				if res.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d", c.path, res.StatusCode)
				}
				size = int(n)
			}
			b.ReportMetric(float64(size), "bytes/resp")
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e6, "cpu-ms/op")
		})
	}
}

// BenchmarkWorstPG measures the ranking's aggregate on PostgreSQL, over
// the roll-up rows of 10,000 gateways and 50 scenes.
func BenchmarkWorstPG(b *testing.B) {
	pg := clustertest.StartPostgres(b, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(context.Background(), pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	now := time.Now()
	fillGlance(b, st, glanceGateways, now)
	for _, by := range []string{"gateway", "scene"} {
		b.Run(by, func(b *testing.B) {
			cpu0 := cpuTime()
			for b.Loop() {
				if _, err := BuildWorst(context.Background(), st, by, "7d", worstMin, worstLimit, now); err != nil {
					b.Fatal(err)
				}
			}
			// PostgreSQL's own CPU is another process's: this is the hub's.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N)/1e6, "hub-cpu-ms/op")
		})
	}
}
