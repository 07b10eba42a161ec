package hub

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// TestPGStoreKeepsTheSameRules runs the store's cases on PostgreSQL:
// the cluster mode must store, deduplicate, chain acks, page, prune and
// count exactly as the single hub does.
func TestPGStoreKeepsTheSameRules(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(context.Background(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	openPG = func(tb testing.TB) Backing {
		tb.Helper()
		if _, err := st.pool.Exec(context.Background(), `TRUNCATE sortie_gateways, sortie_missions, sortie_events, sortie_traces`); err != nil {
			tb.Fatal(err)
		}
		return st
	}
	t.Cleanup(func() { openPG = nil })
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Ingest", TestIngest},
		{"IngestRejects", TestIngestRejects},
		{"Presence", TestPresence},
		{"PresenceIgnoresOlderNews", TestPresenceIgnoresOlderNews},
		{"MissionsPaging", TestMissionsPaging},
		{"Prune", TestPrune},
		{"FailedSince", TestFailedSinceCountsRecentFailuresPerGateway},
		{"ChainAcksOnlyWhatIsStored", TestChainAcksOnlyWhatIsStored},
		{"ChainUnderLossAndReorder", TestChainNeverAcksBeyondStoredUnderLossAndReorder},
		{"ChainStartsAgainForAnotherOutbox", TestChainStartsAgainForAnotherOutbox},
		{"OlderGatewayCumulative", TestBatchFromOlderGatewayAckedCumulatively},
		{"TraceRecords", TestTraceRecordsAreKeptOncePerSeqAndAcked},
	} {
		t.Run(tc.name, tc.run)
	}
}

// TestPGStoreReplicasShareAGateway: two replicas applying one gateway's
// batches at the same moment (as two consumers of one stream do) store
// each event once and ack only what the chain has stored; the gateway's
// row lock keeps their read-modify-write of the cursor apart.
func TestPGStoreReplicasShareAGateway(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	var replicas [2]*PGStore
	for i := range replicas {
		st, err := OpenPG(context.Background(), pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		replicas[i] = st
	}
	const batches, size = 200, 3
	work := make(chan uplink.Batch)
	go func() {
		for i := range uint64(batches) {
			work <- chained("gw", i*size, (i+1)*size, 0)
		}
		close(work)
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	for _, st := range replicas {
		wg.Go(func() {
			for b := range work {
				res, err := ingest(st, t0, "gw", b)
				if err != nil {
					mu.Lock()
					bad = append(bad, err.Error())
					mu.Unlock()
					continue
				}
				// Every entry up to the ack is in the database.
				var n int64
				ack := res.Acks["gw"].Upto
				if err := st.pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_events WHERE gateway = 'gw' AND mission = ANY($1)`, missionsUpTo(ack)).Scan(&n); err != nil || uint64(n) != ack {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("ack %d with %d of its events stored (%v)", ack, n, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d problems, first: %s", len(bad), bad[0])
	}
	g, err := replicas[0].Gateway("gw")
	if err != nil {
		t.Fatal(err)
	}
	if g.Acked != batches*size || g.Events != batches*size || g.Duplicates != 0 || len(g.Pending) != 0 {
		t.Fatalf("gateway after both replicas: acked %d, events %d, duplicates %d, pending %d; want %d, %d, 0, 0",
			g.Acked, g.Events, g.Duplicates, len(g.Pending), batches*size, batches*size)
	}
}

// missionsUpTo names the missions of chained's entries 1..n.
func missionsUpTo(n uint64) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = fmt.Sprintf("m%d", i+1)
	}
	return out
}

// TestPGStoreTakesANulInASummary: a NUL is valid JSON but not PostgreSQL
// text; one gateway's odd summary must not fail the transaction (and
// with it every other gateway's batches in the group).
func TestPGStoreTakesANulInASummary(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	st, err := OpenPG(context.Background(), pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	odd := chained("odd", 0, 1, 0)
	odd.Entries[0].Mission.Scene, odd.Entries[0].Mission.State = "go\x00home", "RUN\x00NING"
	fine := chained("fine", 0, 1, 0)
	res, err := st.Apply([]Inbound{{Gateway: "odd", Batch: &odd, Received: t0}, {Gateway: "fine", Batch: &fine, Received: t0}})
	if err != nil || res.Stored != 2 {
		t.Fatalf("apply: %+v, %v; want both stored", res, err)
	}
	d, err := st.Mission("odd", "m1")
	if err != nil || d.Summary.Scene != "go\x00home" {
		t.Fatalf("odd mission: %+v, %v; want its summary as sent", d.Summary, err)
	}
}

// TestPGStorePrunesABacklogInBatches: retention works through more
// missions than one batch, from two replicas at once, and removes each
// mission once.
func TestPGStorePrunesABacklogInBatches(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	var reps [2]*PGStore
	for i := range reps {
		st, err := OpenPG(context.Background(), pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		reps[i] = st
	}
	const total, keep = 2*pruneBatch + 500, 100
	var in []Inbound
	for i := range total {
		e := entry(uint64(i+1), fmt.Sprintf("m%05d", i), 1, driver.StateSucceeded)
		e.Mission.Finished = t0.Add(time.Duration(i) * time.Second)
		b := uplink.Batch{Gateway: "gw", Entries: []uplink.Entry{e}}
		in = append(in, Inbound{Gateway: "gw", Batch: &b, Received: t0})
	}
	if _, err := reps[0].Apply(in); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var removed [2]int
	for i, st := range reps {
		wg.Go(func() {
			n, err := st.Prune(t0.Add(time.Hour*24*365), Retention{MaxCount: keep})
			if err != nil {
				t.Errorf("prune on replica %d: %v", i, err)
			}
			removed[i] = n
		})
	}
	wg.Wait()
	var missions, events int
	_ = reps[0].pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_missions`).Scan(&missions)
	_ = reps[0].pool.QueryRow(context.Background(), `SELECT count(*) FROM sortie_events`).Scan(&events)
	if removed[0]+removed[1] != total-keep || missions != keep || events != keep {
		t.Fatalf("removed %v, left %d missions and %d events; want %d removed, %d left", removed, missions, events, total-keep, keep)
	}
	// The newest are kept.
	if _, err := reps[1].Mission("gw", fmt.Sprintf("m%05d", total-1)); err != nil {
		t.Fatalf("the newest mission: %v", err)
	}
}

// TestPGObjectsNameWhatTheSchemaCreates: a replica skips the schema when
// every object in pgObjects exists, so the list must name all it creates.
func TestPGObjectsNameWhatTheSchemaCreates(t *testing.T) {
	re := regexp.MustCompile(`IF NOT EXISTS (\w+)`)
	var created []string
	for _, q := range pgSchema {
		for _, m := range re.FindAllStringSubmatch(q, -1) {
			created = append(created, m[1])
		}
	}
	if !slices.Equal(created, pgObjects) {
		t.Fatalf("pgSchema creates %v, pgObjects lists %v", created, pgObjects)
	}
}

// TestOpenPGTellsWaitingFromRefused: a database that cannot be reached
// is worth waiting for (ErrStoreUnavailable, which cmd/hub retries); one
// that refuses the hub's password or has no such database is not.
func TestOpenPGTellsWaitingFromRefused(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, err := url.Parse(pg.DSN())
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(pg.User, "wrong")
	wrong := u.String()
	for _, tc := range []struct {
		name, dsn string
		waiting   bool
	}{
		{"nothing listens", "postgres://nobody:x@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", true},
		{"a wrong password", wrong, false},
		{"no such database", pg.DSNFor("no_such_db"), false},
	} {
		_, err := OpenPG(ctx, tc.dsn)
		if err == nil || errors.Is(err, ErrStoreUnavailable) != tc.waiting {
			t.Errorf("%s: %v; want an error, marked unavailable: %v", tc.name, err, tc.waiting)
		}
	}
}
