package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/sortie-edge/sortie/store"
)

// cmdBackup copies a running agent's database into FILE, replacing it
// if it exists. The copy is written beside FILE under a temporary name,
// synced, checked to be a whole store file, given its own WAL identity
// (so that, restored beside the live database's log, it refuses that log
// instead of replaying writes made after the backup), and only then
// renamed into place: FILE is never a partial copy.
func cmdBackup(ctx context.Context, args []string, o cliOut) error {
	fs, cf := newAPIFlagSet("backup", o.stderr)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return &usageError{fmt.Sprintf("backup takes one argument, the file to write, got %q", pos)}
	}
	dst := pos[0]
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return fmt.Errorf("backup: %s is a directory; name the file to write, e.g. %s", dst, filepath.Join(dst, "missions.db"))
	}
	// Replacing a database an agent has open would leave it writing to a
	// file nobody can see any more.
	if busy, err := store.InUse(dst); err != nil {
		return fmt.Errorf("backup: %w", err)
	} else if busy {
		return fmt.Errorf("backup: %s is the database of a running agent; name another file", dst)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	c.http.Timeout = 0 // a large database takes longer than an API call
	resp, err := c.send(ctx, http.MethodGet, "/api/backup", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	n, tmp, err := writeTemp(dst, resp.Body)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // gone already once renamed
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return fmt.Errorf("the copy received is %d bytes, not the %d announced; %s not written", n, resp.ContentLength, dst)
	}
	// Checked before it is written to: bbolt answers a page past the end
	// of a cut file with SIGBUS.
	if err := store.CheckFile(tmp); err != nil {
		return fmt.Errorf("the copy received is not a whole database; %s not written: %w", dst, err)
	}
	if err := store.NewIdentity(tmp); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	size := fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	if n < 1<<20 {
		size = fmt.Sprintf("%d KiB", (n+1023)/1024)
	}
	fmt.Fprintf(o.stdout, "backup written to %s (%s)\n", dst, size)
	fmt.Fprintf(o.stdout, "to restore it: stop the agent, then: agent restore -config <agent config> %s\n", dst)
	return nil
}

// cmdRestore puts a backup in place of the stopped agent's database,
// keeping the database it replaces beside it.
func cmdRestore(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "config file (TOML) of the agent whose database to replace")
	data := fs.String("data", "", "data directory (overrides the config's data_dir)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return &usageError{fmt.Sprintf("restore takes one argument, the backup file, got %q", pos)}
	}
	path, err := offlineDB(*config, *data)
	if err != nil {
		return err
	}
	kept, err := store.Restore(pos[0], path)
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w; stop the agent first", err)
		}
		return err
	}
	fmt.Fprintf(stdout, "restored %s into %s\n", pos[0], path)
	for _, k := range kept {
		fmt.Fprintf(stdout, "kept what it replaced as %s\n", k)
	}
	return nil
}

// writeTemp copies r into a new file beside dst and syncs it.
func writeTemp(dst string, r io.Reader) (int64, string, error) {
	dir := filepath.Dir(dst)
	f, err := os.CreateTemp(dir, filepath.Base(dst)+".part-*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // its path is a temporary name nobody asked for
		}
		return 0, "", fmt.Errorf("backup: cannot write in %s: %w", dir, err)
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return n, "", fmt.Errorf("backup: after %d bytes: %w", n, err)
	}
	return n, f.Name(), nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
