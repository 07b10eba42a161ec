package store

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/sortie-edge/sortie/driver"
)

// TestReviewRewindAfterFailedAppend: a failed append's records carry the
// LSNs the next append will reuse (append does not advance w.lsn on
// error). When everything before it was checkpointed, the next commit
// rewinds, and rewind clears failedEnd, so the new pass writes no zero
// frame. If the new pass then ends on a frame boundary of the failed
// batch, the failed batch's later records continue the LSN sequence and
// a crash replays a write its caller was told had failed.
func TestReviewRewindAfterFailedAppend(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		t.Run(fmt.Sprintf("buffered=%v", buffered), func(t *testing.T) {
			db, path := openPaused(t)
			if buffered {
				useBuffered(t, db)
			}
			x := newMission(mid(1))
			mustCreate(t, db, x) // LSN 1
			if err := db.checkpoint(); err != nil {
				t.Fatal(err)
			}
			a := int(db.wal.off) // where the failed batch will go

			// Failed batch at a: save v2 (p, LSN 2) then save v3 (p3,
			// LSN 3). p ends on a block boundary.
			p := x.Clone()
			padTo(t, p, walBlock-a, func(m *driver.Mission) int { return saveFrameSize(t, m, driver.StateRunning) })
			p, pev := advance(p, driver.StateRunning)
			p3, p3ev := advance(p, driver.StateStepRunning)
			db.wmu.Lock()
			failed := &walFile{f: db.wal.f, path: db.wal.path, off: db.wal.off, lsn: db.wal.lsn,
				direct: db.wal.direct, hdr: db.wal.hdr, tail: bytes.Clone(db.wal.tail)}
			_, err := failed.append([][]byte{payloadOf(t, false, p, pev), payloadOf(t, false, p3, p3ev)})
			db.wal.failedEnd = failed.off // what append's error path records
			db.wmu.Unlock()
			if err != nil {
				t.Fatal(err)
			}

			// The caller, told both failed, saves v2 again, differently.
			// applied == wal.lsn == 1, so this commit rewinds; its frame
			// fills the first block exactly, ending where failed LSN 3
			// starts.
			q := x.Clone()
			q.Priority = 6
			padTo(t, q, walBlock-walHeaderLen, func(m *driver.Mission) int { return saveFrameSize(t, m, driver.StateRunning) })
			q, qev := advance(q, driver.StateRunning)
			if err := db.Save(context.Background(), q, qev); err != nil {
				t.Fatal(err)
			}
			if db.wal.off != walBlock {
				t.Fatalf("test premise: offset %d after the rewound save, want %d", db.wal.off, walBlock)
			}
			sameJSON(t, mustGet(t, db, x.ID), q)
			crash(t, db)
			t.Logf("log after the crash holds LSNs %v", lsnsOf(readLog(t, walPath(path))))

			db = openAt(t, path)
			got := mustGet(t, db, x.ID)
			if got.Version != 2 || got.Priority != 6 {
				t.Errorf("after replay %s is at version %d (priority %d, state %s); want the acknowledged version 2 with priority 6", x.ID, got.Version, got.Priority, got.State)
			}
		})
	}
}
