package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

func eval(id, outcome string, at time.Time) Evaluation {
	e := Evaluation{RequestID: id, At: at, Via: "mqtt", Scene: "go_home", Source: "alexa", Outcome: outcome}
	switch outcome {
	case "rejected":
		e.Reason, e.Message = "already_running", "scene go_home is already running as mission m-1 (mode single)"
	case "accepted", "duplicate":
		e.MissionID = "m-" + id
	}
	return e
}

func TestTracesSurviveReopenWithEveryField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	db := openAt(t, path)
	ctx := context.Background()
	at := time.UnixMilli(1_800_000_000_123)
	want := eval("r-1", "rejected", at)
	want.Via, want.Source = "api", "app"
	if err := db.AddTraces(ctx, []Evaluation{want, eval("r-1", "accepted", at.Add(time.Second))}, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openAt(t, path)
	got, err := db.Trace(ctx, "r-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Evaluations) != 2 || got.Evaluations[0] != want || got.Evaluations[1].Outcome != "accepted" || got.Evaluations[1].MissionID != "m-r-1" {
		t.Fatalf("trace = %+v, want the rejection %+v then the acceptance", got, want)
	}
	if _, err := db.Trace(ctx, "r-2"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("unknown request: err = %v, want ErrNotFound", err)
	}
}

func TestTraceKeepsTheFirstAndTheLatestEvaluations(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	at := time.UnixMilli(1_800_000_000_000)
	for i := range 20 {
		outcome := "duplicate"
		if i == 0 {
			outcome = "accepted"
		}
		if err := db.AddTraces(ctx, []Evaluation{eval("r", outcome, at.Add(time.Duration(i)*time.Second))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err := db.Trace(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Evaluations) != MaxEvaluations || got.Dropped != 20-MaxEvaluations {
		t.Fatalf("kept %d, dropped %d; want %d and %d", len(got.Evaluations), got.Dropped, MaxEvaluations, 20-MaxEvaluations)
	}
	if got.Evaluations[0].Outcome != "accepted" || !got.Evaluations[MaxEvaluations-1].At.Equal(at.Add(19*time.Second)) {
		t.Fatalf("evaluations = %+v, want the first and the latest", got.Evaluations)
	}
	recs, n, err := db.TraceStats()
	if err != nil || recs != 1 || n <= 0 {
		t.Fatalf("TraceStats = %d records, %d bytes, %v", recs, n, err)
	}
}

func TestLongMessagesAreClippedOnARuneBoundary(t *testing.T) {
	db := openTest(t)
	e := eval("r", "rejected", time.UnixMilli(1))
	e.Message = strings.Repeat("é", 1000)
	if err := db.AddTraces(context.Background(), []Evaluation{e}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := db.Trace(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	m := got.Evaluations[0].Message
	if len(m) > maxTraceText+len("…") || !strings.HasSuffix(m, "é…") {
		t.Fatalf("message of %d bytes ends %q", len(m), m[len(m)-8:])
	}
}

func TestPruneTracesDropsSucceededRecordsBeforeFailedOnes(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	now := time.UnixMilli(1_800_000_000_000)
	var evs []Evaluation
	for i := range 400 {
		outcome := "accepted"
		if i%5 == 0 {
			outcome = "rejected"
		}
		evs = append(evs, eval(fmt.Sprintf("r-%03d", i), outcome, now.Add(time.Duration(i)*time.Second)))
	}
	if err := db.AddTraces(ctx, evs, nil); err != nil {
		t.Fatal(err)
	}
	_, total, err := db.TraceStats()
	if err != nil {
		t.Fatal(err)
	}
	// Half the bytes keeps every failure (a fifth of the records, with
	// longer messages)
	// and the newest of the rest.
	n, err := db.PruneTraces(ctx, TraceLimits{MaxBytes: total / 2}, now)
	if err != nil {
		t.Fatal(err)
	}
	recs, left, err := db.TraceStats()
	if err != nil {
		t.Fatal(err)
	}
	if left > total/2 || recs != 400-n {
		t.Fatalf("after prune: %d records, %d bytes (budget %d), %d deleted", recs, left, total/2, n)
	}
	for i := 0; i < 400; i += 5 {
		if _, err := db.Trace(ctx, fmt.Sprintf("r-%03d", i)); err != nil {
			t.Fatalf("failed record r-%03d was pruned before records that succeeded: %v", i, err)
		}
	}
	if _, err := db.Trace(ctx, "r-001"); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("the oldest record that succeeded is still there: %v", err)
	}
	if _, err := db.Trace(ctx, "r-399"); err != nil {
		t.Fatalf("the newest record that succeeded was pruned: %v", err)
	}

	// By age: records that succeeded go after MaxAge, failures after
	// FailedMaxAge.
	later := now.Add(400*time.Second + time.Hour)
	if _, err := db.PruneTraces(ctx, TraceLimits{MaxAge: time.Minute, FailedMaxAge: 2 * time.Hour}, later); err != nil {
		t.Fatal(err)
	}
	ok, err := db.RecentTraces(ctx, false, 1000)
	if err != nil || len(ok) != 0 {
		t.Fatalf("records that succeeded past MaxAge: %d left (%v)", len(ok), err)
	}
	failed, err := db.RecentTraces(ctx, true, 1000)
	if err != nil || len(failed) != 80 {
		t.Fatalf("failed records within FailedMaxAge: %d left, want 80 (%v)", len(failed), err)
	}
	if failed[0].RequestID != "r-395" || failed[79].RequestID != "r-000" {
		t.Fatalf("RecentTraces is not newest first: %s ... %s", failed[0].RequestID, failed[79].RequestID)
	}
}

func TestScheduleCursorNeverMovesBack(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.db")
	db := openAt(t, path)
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	for _, at := range []time.Time{t0, t0.Add(time.Hour), t0.Add(time.Minute)} {
		if err := db.AddTraces(ctx, nil, []Cursor{{Schedule: "go_home/1", At: at}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openAt(t, path)
	got, err := db.Cursors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !got["go_home/1"].Equal(t0.Add(time.Hour)) || len(got) != 1 {
		t.Fatalf("cursors = %v, want go_home/1 at %v", got, t0.Add(time.Hour))
	}
}

func FuzzDecodeTrace(f *testing.F) {
	at := time.UnixMilli(1_800_000_000_000)
	t := Trace{RequestID: "r"}
	t.add(eval("r", "rejected", at))
	t.add(eval("r", "accepted", at))
	f.Add(encodeTrace(nil, t))
	f.Add([]byte{traceFormat, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := decodeTrace([]byte("r"), b)
		if err != nil {
			return
		}
		again, err := decodeTrace([]byte("r"), encodeTrace(nil, tr))
		if err != nil || len(again.Evaluations) != len(tr.Evaluations) {
			t.Fatalf("a decoded record does not round-trip: %v", err)
		}
	})
}

func TestTraceLogKeepsEvaluationsForTheHubUntilAcked(t *testing.T) {
	o := testOptions()
	o.Outbox = true
	db, err := Open(filepath.Join(t.TempDir(), "m.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }() // a test store
	ctx := context.Background()
	at := time.UnixMilli(1_800_000_000_000)
	if err := db.AddTraces(ctx, []Evaluation{eval("a", "rejected", at), eval("b", "accepted", at), eval("a", "accepted", at)}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := db.TraceLog(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].Seq != 1 || got[0].RequestID != "a" || got[0].Outcome != "rejected" || got[2].Seq != 3 || got[2].Outcome != "accepted" {
		t.Fatalf("trace log = %+v", got)
	}
	if n, err := db.AckTraceLog(ctx, 2); err != nil || n != 2 {
		t.Fatalf("ack = %d, %v; want 2", n, err)
	}
	if got, _ := db.TraceLog(ctx, 0, 10); len(got) != 1 || got[0].Seq != 3 {
		t.Fatalf("after the ack: %+v", got)
	}
	// Bounded: the oldest go first.
	many := make([]Evaluation, MaxTraceLog+5)
	for i := range many {
		many[i] = eval(fmt.Sprintf("m-%d", i), "accepted", at)
	}
	if err := db.AddTraces(ctx, many, nil); err != nil {
		t.Fatal(err)
	}
	got, err = db.TraceLog(ctx, 0, MaxOutboxLimit)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Seq != 3+6 || got[0].RequestID != "m-5" {
		t.Fatalf("first kept = %d %s, want seq 9 (m-5)", got[0].Seq, got[0].RequestID)
	}
}

func TestTraceLogIsNotKeptWithoutAHub(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	if err := db.AddTraces(ctx, []Evaluation{eval("a", "rejected", time.UnixMilli(1))}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := db.TraceLog(ctx, 0, 10); err != nil || len(got) != 0 {
		t.Fatalf("trace log without a hub = %+v, %v", got, err)
	}
}

func TestFailedRecordsArePrunedByAgeBehindOnesThatSucceeded(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	old := eval("old-rejection", "rejected", now.Add(-40*24*time.Hour))
	recent := eval("recent-success", "accepted", now.Add(-time.Hour))
	if err := db.AddTraces(ctx, []Evaluation{old, recent}, nil); err != nil {
		t.Fatal(err)
	}
	n, err := db.PruneTraces(ctx, TraceLimits{MaxAge: 7 * 24 * time.Hour, FailedMaxAge: 30 * 24 * time.Hour}, now)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want the 40-day-old rejection", n, err)
	}
	if _, err := db.Trace(ctx, "old-rejection"); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("a rejection past failed_max_age survived: %v", err)
	}
	// A clock near 1970 (no battery, before NTP) prunes nothing.
	if n, err := db.PruneTraces(ctx, TraceLimits{MaxAge: time.Hour, FailedMaxAge: time.Hour}, time.Unix(60, 0)); err != nil || n != 0 {
		t.Errorf("pruned %d at 1970 (%v), want none", n, err)
	}
}

func TestEveryTextFieldOfARecordIsBounded(t *testing.T) {
	db := openTest(t)
	e := eval("r", "rejected", time.UnixMilli(1))
	e.Scene, e.Source, e.Reason = strings.Repeat("s", 60000), strings.Repeat("o", 60000), strings.Repeat("r", 60000)
	if err := db.AddTraces(context.Background(), []Evaluation{e}, nil); err != nil {
		t.Fatal(err)
	}
	_, n, err := db.TraceStats()
	if err != nil || n > 2000 {
		t.Fatalf("a record with 180 KB of fields takes %d bytes (%v)", n, err)
	}
}

// TestAnUnreadableRecordBeginsAfreshWithoutTakingItsSuccessor: a damaged
// record does not block later writes, and the age key it leaves behind
// neither prunes the record that replaced it nor breaks the listing.
func TestAnUnreadableRecordBeginsAfreshWithoutTakingItsSuccessor(t *testing.T) {
	db := openTest(t)
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	if err := db.AddTraces(ctx, []Evaluation{eval("r", "rejected", now.Add(-40*24*time.Hour))}, nil); err != nil {
		t.Fatal(err)
	}
	if err := db.bolt.Update(func(tx *bolt.Tx) error { return tx.Bucket(bTraces).Put([]byte("r"), []byte{0xff, 1, 2}) }); err != nil {
		t.Fatal(err)
	}
	if err := db.AddTraces(ctx, []Evaluation{eval("r", "rejected", now)}, nil); err != nil {
		t.Fatalf("a damaged record blocks the next write: %v", err)
	}
	if _, err := db.PruneTraces(ctx, TraceLimits{MaxAge: time.Hour, FailedMaxAge: 30 * 24 * time.Hour}, now); err != nil {
		t.Fatal(err)
	}
	got, err := db.Trace(ctx, "r")
	if err != nil || len(got.Evaluations) != 1 || !got.Evaluations[0].At.Equal(now) {
		t.Fatalf("the record that began afresh: %+v, %v", got, err)
	}
	recent, err := db.RecentTraces(ctx, true, 10)
	if err != nil || len(recent) != 1 {
		t.Fatalf("recent failed records: %+v, %v", recent, err)
	}
}
