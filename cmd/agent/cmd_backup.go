package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/sortie-edge/sortie/internal/cli"
	"github.com/sortie-edge/sortie/store"
)

// cmdBackup copies a running agent's database into FILE, replacing it
// if it exists, never leaving FILE a partial copy (store.WriteBackup).
func cmdBackup(ctx context.Context, e *cli.Env, args []string) error {
	o := newCLIOut(e)
	fs, cf := newAPIFlagSet(e)
	pos, err := cli.Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return &usageError{Msg: fmt.Sprintf("backup takes one argument, the file to write, got %q", pos)}
	}
	dst := pos[0]
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return fmt.Errorf("backup: %s is a directory; name the file to write, e.g. %s", dst, filepath.Join(dst, "missions.db"))
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	c.HTTP.Timeout = 0 // a large database takes longer than an API call
	resp, err := c.Send(ctx, http.MethodGet, "/api/backup", nil)
	if err != nil {
		return err
	}
	// WriteBackup checks the copy against the Content-Length; closing the
	// body after it only frees the connection.
	defer func() { _ = resp.Body.Close() }()
	n, err := store.WriteBackup(resp.Body, resp.ContentLength, dst)
	if err != nil {
		return err
	}
	size := fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	if n < 1<<20 {
		size = fmt.Sprintf("%d KiB", (n+1023)/1024)
	}
	_, err = fmt.Fprintf(o.stdout, "backup written to %s (%s)\n"+
		"to restore it: stop the agent, then: agent restore -config <agent config> %s\n", dst, size, dst)
	return err
}

// cmdRestore puts a backup in place of the stopped agent's database,
// keeping the database it replaces beside it.
func cmdRestore(_ context.Context, e *cli.Env, args []string) error {
	path, pos, err := offlineDB(e, args, 1)
	if err != nil {
		return err
	}
	kept, err := store.Restore(pos[0], path)
	if err != nil {
		return stopFirst(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "restored %s into %s\n", pos[0], path)
	for _, k := range kept {
		fmt.Fprintf(&b, "kept what it replaced as %s\n", k)
	}
	_, err = io.WriteString(e.Stdout, b.String())
	return err
}
