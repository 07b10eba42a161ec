package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/store"
)

// cmdCompact rewrites the mission database without its free pages. bbolt
// never shrinks its file by itself; after retention has deleted many
// missions this gives the space back. A rewrite that would not shrink
// the file is dropped, and the command says so. The agent must be
// stopped.
func cmdCompact(_ context.Context, e *cli.Env, args []string) error {
	path, _, err := offlineDB(e, args, 0)
	if err != nil {
		return err
	}
	res, err := store.Compact(path, store.Options{})
	if err != nil {
		return stopFirst(err)
	}
	if res.Kept {
		_, err = fmt.Fprintf(e.Stdout, "kept %s as it was (%s): compacted it would be %s, no smaller\n", path, humanBytes(res.Before), humanBytes(res.Copy))
		return err
	}
	_, err = fmt.Fprintf(e.Stdout, "compacted %s: %s -> %s\n", path, humanBytes(res.Before), humanBytes(res.After))
	return err
}

// offlineDB parses the command line of an offline command (compact,
// restore), which takes nargs arguments, and returns the mission
// database it works on: the one in the config's data_dir, or in the
// -data directory.
func offlineDB(e *cli.Env, args []string, nargs int) (path string, pos []string, err error) {
	fs := e.FlagSet()
	config := fs.String("config", "", "config file (TOML) of the agent; its data_dir holds missions.db")
	data := fs.String("data", "", "data directory (overrides the config's data_dir)")
	if pos, err = cli.Parse(fs, args); err != nil {
		return "", nil, err
	}
	if len(pos) != nargs {
		return "", nil, &usageError{Msg: fmt.Sprintf("%s takes %d argument(s), got %q", e.Path(), nargs, pos)}
	}
	cfg, err := LoadConfig(*config)
	if err != nil {
		return "", nil, err
	}
	dir := cfg.Path(cfg.DataDir)
	if *data != "" {
		dir = *data
	}
	return filepath.Join(dir, "missions.db"), pos, nil
}

// stopFirst says what to do about a database the agent holds.
func stopFirst(err error) error {
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("%w (stop the agent first)", err)
	}
	return err
}

// humanBytes writes a file size in the unit that shows it: KiB below a
// MiB, so that a small store does not read "0.0 MiB -> 0.0 MiB".
func humanBytes(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
