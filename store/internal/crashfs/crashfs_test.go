package crashfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"testing"
)

func mustOpen(tb testing.TB, c *FS, name string, flag int) interface {
	WriteAt([]byte, int64) (int, error)
	Sync() error
	Close() error
} {
	tb.Helper()
	f, err := c.OpenFile(name, flag, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func read(tb testing.TB, c *FS, name string) []byte {
	tb.Helper()
	b, err := c.ReadFile(name)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestCutKeepsSyncedAndTearsTheLastWrite: in Drop mode, a cut keeps
// synced bytes, loses earlier unsynced writes whole, and keeps of the last
// one only whole sectors, some of them.
func TestCutKeepsSyncedAndTearsTheLastWrite(t *testing.T) {
	for seed := range uint64(20) {
		c := New(Options{Seed: seed})
		f := mustOpen(t, c, "/d/f", os.O_RDWR|os.O_CREATE)
		synced := bytes.Repeat([]byte{1}, 2*Sector)
		_, err := f.WriteAt(synced, 0)
		must(t, err)
		must(t, f.Sync())
		must(t, c.SyncDir("/d/f"))
		_, err = f.WriteAt(bytes.Repeat([]byte{2}, Sector), 0) // lost: not the last
		must(t, err)
		_, err = f.WriteAt(bytes.Repeat([]byte{3}, 4*Sector), Sector)
		must(t, err)
		if !c.Cut() {
			t.Fatal("Cut: the power was already off")
		}
		if _, err := f.WriteAt([]byte{9}, 0); !errors.Is(err, ErrPowerCut) {
			t.Fatalf("write after the cut: %v, want ErrPowerCut", err)
		}
		got := read(t, c.Restart(seed), "/d/f")
		if !bytes.Equal(got[:Sector], synced[:Sector]) {
			t.Fatalf("seed %d: a synced sector changed, or an earlier unsynced write landed: % x", seed, got[:8])
		}
		for s := 1; s*Sector < len(got); s++ {
			sec := got[s*Sector : (s+1)*Sector]
			// Past the synced end, an old sector is a hole: zeros.
			old := s < 2 && bytes.Equal(sec, synced[s*Sector:(s+1)*Sector]) || s >= 2 && allZero(sec)
			if !old && !bytes.Equal(sec, bytes.Repeat([]byte{3}, Sector)) {
				t.Fatalf("seed %d: sector %d is neither old nor new", seed, s)
			}
		}
	}
}

// TestCutLosesUnsyncedDirectoryEntries: a file created, or removed, and
// not followed by SyncDir is back as it was; with SyncDir the change
// stays.
func TestCutLosesUnsyncedDirectoryEntries(t *testing.T) {
	c := New(Options{})
	for _, name := range []string{"/d/kept", "/d/removed", "/d/created"} {
		f := mustOpen(t, c, name, os.O_RDWR|os.O_CREATE)
		_, err := f.WriteAt([]byte("data"), 0)
		must(t, err)
		must(t, f.Sync())
		if name != "/d/created" {
			must(t, c.SyncDir(name))
		}
	}
	must(t, c.Remove("/d/removed"))
	c.Cut()
	r := c.Restart(1)
	if got := r.Names(); len(got) != 2 || got[0] != "/d/kept" || got[1] != "/d/removed" {
		t.Fatalf("after the cut: %v, want /d/kept and /d/removed", got)
	}

	c = New(Options{})
	f := mustOpen(t, c, "/d/created", os.O_RDWR|os.O_CREATE)
	_, err := f.WriteAt([]byte("data"), 0)
	must(t, err)
	must(t, f.Sync())
	must(t, c.SyncDir("/d/created"))
	c.Cut()
	if got := read(t, c.Restart(1), "/d/created"); string(got) != "data" {
		t.Fatalf("synced file after the cut: %q", got)
	}
}

// TestCutAtCountsOperations: the n-th operation cuts the power, runs the
// function given and fails, and so does every later one.
func TestCutAtCountsOperations(t *testing.T) {
	c := New(Options{})
	ran := false
	c.CutAt(3, func() { ran = true })
	f := mustOpen(t, c, "/d/f", os.O_RDWR|os.O_CREATE|oDSync) // 1
	_, err := f.WriteAt([]byte("ab"), 0)                      // 2, durable on return
	must(t, err)
	if _, err := f.WriteAt([]byte("cd"), 2); !errors.Is(err, ErrPowerCut) || !ran { // 3
		t.Fatalf("third operation: %v (cut function ran: %v)", err, ran)
	}
	if err := f.Sync(); !errors.Is(err, ErrPowerCut) {
		t.Fatalf("sync after the cut: %v", err)
	}
	if _, err := c.Restart(0).ReadFile("/d/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("file never synced into its directory: %v, want not found", err)
	}
}

// TestDirectWritesMustBeAligned: O_DIRECT refuses unaligned writes, as
// the kernel does, and NoDirect refuses O_DIRECT itself.
func TestDirectWritesMustBeAligned(t *testing.T) {
	if oDirect == 0 {
		t.Skip("no O_DIRECT on this platform")
	}
	c := New(Options{})
	f := mustOpen(t, c, "/d/f", os.O_RDWR|os.O_CREATE|oDirect)
	if _, err := f.WriteAt(make([]byte, 100), 0); err == nil {
		t.Fatal("unaligned direct write accepted")
	}
	c = New(Options{NoDirect: true})
	if _, err := c.OpenFile("/d/f", os.O_RDWR|os.O_CREATE|oDirect, 0o600); err == nil {
		t.Fatal("O_DIRECT accepted under NoDirect")
	}
}
