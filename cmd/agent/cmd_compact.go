package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/sortie-edge/sortie/store"
)

// cmdCompact rewrites the mission database without its free pages. bbolt
// never shrinks its file by itself; after retention has deleted many
// missions this gives the space back. The agent must be stopped.
func cmdCompact(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("compact", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "config file (TOML); its data_dir holds missions.db")
	data := fs.String("data", "", "data directory (overrides the config's data_dir)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error()}
	}
	path, err := offlineDB(*config, *data)
	if err != nil {
		return err
	}
	before, after, err := store.Compact(path, store.Options{})
	if errors.Is(err, store.ErrLocked) {
		return fmt.Errorf("%w (stop the agent first)", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "compacted %s: %.1f MiB -> %.1f MiB\n", path, float64(before)/(1<<20), float64(after)/(1<<20))
	return nil
}

// offlineDB is the mission database the offline commands (compact,
// restore) work on: the one in the config's data_dir, or in data when
// the -data flag gives one.
func offlineDB(config, data string) (string, error) {
	cfg, err := LoadConfig(config)
	if err != nil {
		return "", err
	}
	dir := cfg.Path(cfg.DataDir)
	if data != "" {
		dir = data
	}
	return filepath.Join(dir, "missions.db"), nil
}
