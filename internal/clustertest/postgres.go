package clustertest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PostgresOptions shape the server of StartPostgres. The zero value is
// PostgreSQL's defaults, listening on 127.0.0.1 only.
type PostgresOptions struct {
	// Settings are server settings given as -c name=value, over the
	// defaults: {"fsync": "off"} for a test that crashes processes, not
	// machines (a committed row survives an immediate stop either way;
	// fsync off only loses what a power cut would). Keep the defaults
	// for measurements.
	Settings map[string]string

	// ReadyTimeout bounds each wait for the server to accept
	// connections; zero is 30 s.
	ReadyTimeout time.Duration
}

// Postgres is a running PostgreSQL server with its data in a temporary
// directory. Its fields are set by StartPostgres and read-only after;
// its methods are safe for concurrent use.
type Postgres struct {
	Port     int    // on 127.0.0.1
	User     string // a superuser, "postgres"
	Password string
	Database string // the database DSN names: "postgres"

	DataDir string
	LogFile string

	bin          string // the directory of initdb, postgres, createdb
	proc         *proc
	readyTimeout time.Duration
}

// StartPostgres copies a database cluster (the machine's template, made
// once by initdb: postgresTemplate) into a new temporary directory and
// starts PostgreSQL on it, on a free port of 127.0.0.1
// with password authentication, and waits until it accepts connections.
// Run as root, the server runs as the postgres user (initdb and postgres
// refuse root) in a directory that user owns. The server is stopped and
// its directory removed when the test ends; its log is printed if the
// test failed.
//
// Without PostgreSQL's binaries (Debian's package postgresql, under
// /usr/lib/postgresql/*/bin) the test is skipped, or fails when CI=true.
func StartPostgres(tb testing.TB, opts PostgresOptions) *Postgres {
	tb.Helper()
	bin := needPostgres(tb)
	cred, err := postgresCredential()
	if err != nil {
		tb.Fatal(err)
	}
	// Not tb.TempDir: its parents are root's, 0700, closed to postgres.
	dir, err := os.MkdirTemp("", "sortie-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("remove postgres directory: %v", err)
		}
	})
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			tb.Fatal(err)
		}
	}
	tmpl, err := postgresTemplate(bin, cred)
	if err != nil {
		tb.Fatal(err)
	}
	p := &Postgres{
		User: "postgres", Password: tmpl.password, Database: "postgres",
		DataDir:      filepath.Join(dir, "data"),
		LogFile:      filepath.Join(tb.TempDir(), "postgres.log"),
		bin:          bin,
		readyTimeout: opts.ReadyTimeout,
	}
	if p.readyTimeout <= 0 {
		p.readyTimeout = 30 * time.Second
	}
	// cp -a keeps the postgres user's ownership and the 0700 mode the
	// postmaster insists on.
	if out, err := exec.Command("cp", "-a", tmpl.data, p.DataDir).CombinedOutput(); err != nil {
		tb.Fatalf("copy the database cluster template: %v: %s", err, out)
	}

	p.proc = &proc{
		name: "postgres", path: filepath.Join(bin, "postgres"), dir: dir,
		env: postgresEnv(), cred: cred, log: p.LogFile,
	}
	printLogsOnFailure(tb, p.proc)
	tb.Cleanup(func() {
		if p.PID() != 0 {
			if err := p.Stop(); err != nil {
				tb.Errorf("stop postgres: %v", err)
			}
		}
	})
	for try := 1; ; try++ {
		ports, err := freePorts(1)
		if err != nil {
			tb.Fatal(err)
		}
		p.Port = ports[0]
		p.proc.args = postgresArgs(p.DataDir, dir, p.Port, opts.Settings)
		err = p.start()
		if err == nil {
			break
		}
		if !p.portBusy() || try == 3 {
			tb.Fatal(err)
		}
		tb.Logf("start postgres: port %d was taken, trying another: %v", p.Port, err)
	}
	return p
}

// DSN is the connection string of the server's database, for pgx:
// postgres://postgres:...@127.0.0.1:port/postgres?sslmode=disable.
func (p *Postgres) DSN() string { return p.DSNFor(p.Database) }

// DSNFor is the connection string of database db on the server.
func (p *Postgres) DSNFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(p.User, p.Password),
		Host:     hostPort(p.Port),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// CreateDatabase creates database name (createdb) and returns its DSN:
// tests that share a server keep apart that way.
func (p *Postgres) CreateDatabase(name string) (string, error) {
	if err := p.client("createdb", name); err != nil {
		return "", fmt.Errorf("%w (creating %s)", err, name)
	}
	return p.DSNFor(name), nil
}

// Dump writes database db to path in pg_dump's custom format, for
// Restore: a test that fills a database for minutes can keep the fill.
func (p *Postgres) Dump(db, path string) error {
	return p.client("pg_dump", "-Fc", "-f", path, "-d", db)
}

// Restore loads a Dump into database db (empty, or the server's own),
// two jobs at a time.
func (p *Postgres) Restore(db, path string) error {
	return p.client("pg_restore", "-j", "2", "--no-owner", "-d", db, path)
}

// client runs one of PostgreSQL's client programs against the server.
func (p *Postgres) client(name string, args ...string) error {
	args = append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", p.User}, args...)
	cmd := exec.Command(filepath.Join(p.bin, name), args...)
	cmd.Env = append(postgresEnv(), "PGPASSWORD="+p.Password)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// PID is the process ID of the running postmaster, or 0.
func (p *Postgres) PID() int { return p.proc.pid() }

// Stop shuts the server down in immediate mode and waits for it to exit:
// SIGQUIT to the postmaster, what `pg_ctl stop -m immediate` sends. Its
// backends quit at once, with no checkpoint; the next Start recovers
// from the write-ahead log, as after a crash, so committed transactions
// are there and the rest are not.
func (p *Postgres) Stop() error { return p.proc.signal(syscall.SIGQUIT, 20*time.Second) }

// Start starts the server again on the same data directory and port, and
// waits until it accepts connections (after crash recovery, if Stop
// left it to do). A port taken meanwhile is retried for a few seconds.
func (p *Postgres) Start() error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := p.start()
		if err == nil || !p.portBusy() || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// start starts the postmaster and waits until it is ready.
func (p *Postgres) start() error {
	if err := p.proc.start(); err != nil {
		return err
	}
	pid := p.proc.pid()
	if err := p.waitReady(pid); err != nil {
		p.proc.stopQuietly()
		return err
	}
	return nil
}

// waitReady waits until postmaster.pid names pid and says "ready": the
// postmaster's own word that it accepts connections (PostgreSQL 10+).
func (p *Postgres) waitReady(pid int) error {
	exited := p.proc.exited()
	ctx, cancel := context.WithTimeout(context.Background(), p.readyTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	pidFile := filepath.Join(p.DataDir, "postmaster.pid")
	for {
		if b, err := os.ReadFile(pidFile); err == nil {
			lines := strings.Split(string(b), "\n")
			if len(lines) >= 8 && lines[0] == strconv.Itoa(pid) && strings.TrimSpace(lines[7]) == "ready" {
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited (%w) before it was ready", p.proc.exitErr())
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready within %v", p.readyTimeout)
		case <-tick.C:
		}
	}
}

func (p *Postgres) portBusy() bool {
	return strings.Contains(strings.ToLower(p.proc.tail(4<<10)), "address already in use")
}

// pgTemplate is a database cluster initdb made, which each server of
// StartPostgres starts on a copy of.
type pgTemplate struct{ data, password string }

// postgresTemplate returns the machine's database cluster template for
// the PostgreSQL in bin, making it the first time: initdb costs 1-2 s of
// CPU (several seconds under load) at each of the twenty servers the
// tests start, a copy of its 39 MB a tenth of a second. It is kept, like
// Go's build cache, in the temporary directory, one per PostgreSQL
// version, set of initdb flags and user (remove it to have it made
// again), made in a directory of its own and renamed into place so that
// test processes running at once never see half of one. One not owned
// by the user the servers run as, or writable by others, is not used:
// the temporary directory is shared, and its superuser's password file
// and configuration are in it.
func postgresTemplate(bin string, cred *syscall.Credential) (pgTemplate, error) {
	out, err := exec.Command(filepath.Join(bin, "initdb"), "--version").Output()
	if err != nil {
		return pgTemplate{}, fmt.Errorf("initdb --version: %w", err)
	}
	// "initdb (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)" -> "15.18"
	version := "unknown"
	if f := strings.Fields(string(out)); len(f) >= 3 {
		version = strings.Map(func(r rune) rune {
			if r == '.' || r >= '0' && r <= '9' {
				return r
			}
			return '-'
		}, f[2])
	}
	flags := sha256.Sum256([]byte(strings.Join(initdbFlags, "\x00")))
	root := filepath.Join(os.TempDir(), fmt.Sprintf("sortie-pg-template-%s-%x-%d", version, flags[:4], os.Geteuid()))
	owner := uint32(os.Geteuid())
	if cred != nil {
		owner = cred.Uid
	}
	if t, err := readTemplate(root, owner); err == nil {
		return t, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return pgTemplate{}, err
	}
	tmp, err := os.MkdirTemp(os.TempDir(), "sortie-pg-template-new-")
	if err != nil {
		return pgTemplate{}, err
	}
	defer func() { _ = os.RemoveAll(tmp) }() // gone once renamed; else a failed attempt's
	password := secret()
	if cred != nil {
		if err := os.Chown(tmp, int(cred.Uid), int(cred.Gid)); err != nil {
			return pgTemplate{}, err
		}
	}
	if err := initdb(bin, tmp, password, cred); err != nil {
		return pgTemplate{}, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "password"), []byte(password), 0o600); err != nil {
		return pgTemplate{}, err
	}
	if err := os.Rename(tmp, root); err != nil {
		// Another test process made it meanwhile: use that one.
		if t, rerr := readTemplate(root, owner); rerr == nil {
			return t, nil
		}
		return pgTemplate{}, fmt.Errorf("database cluster template: %w", err)
	}
	return readTemplate(root, owner)
}

// readTemplate reads a template postgresTemplate made, owned by owner and
// writable by no one else.
func readTemplate(root string, owner uint32) (pgTemplate, error) {
	fi, err := os.Lstat(root)
	if err != nil {
		return pgTemplate{}, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || !ok || st.Uid != owner || fi.Mode().Perm()&0o022 != 0 {
		return pgTemplate{}, fmt.Errorf("database cluster template %s: not a directory of uid %d writable by it alone (%v); remove it", root, owner, fi.Mode())
	}
	pw, err := os.ReadFile(filepath.Join(root, "password"))
	if err != nil {
		return pgTemplate{}, err
	}
	data := filepath.Join(root, "data")
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); err != nil {
		return pgTemplate{}, err
	}
	return pgTemplate{data: data, password: string(pw)}, nil
}

// initdbFlags are initdb's flags but the directory and the password file;
// the template's name carries their hash, so a change makes a new one.
var initdbFlags = []string{"-U", "postgres",
	"--auth-local=trust", "--auth-host=scram-sha-256",
	"-E", "UTF8", "--no-locale",
	// No fsync of the new files: a test's data directory need not
	// survive the machine, and it saves seconds.
	"--no-sync"}

// initdb creates a database cluster in dir/data, with the superuser's
// password from a file it removes after.
func initdb(bin, dir, password string, cred *syscall.Credential) error {
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer func() { _ = os.Remove(pwfile) }() // best effort: the directory goes at cleanup
	if cred != nil {
		if err := os.Chown(pwfile, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	args := append([]string{"-D", filepath.Join(dir, "data"), "--pwfile=" + pwfile}, initdbFlags...)
	cmd := exec.Command(filepath.Join(bin, "initdb"), args...)
	cmd.Dir = dir
	cmd.Env = postgresEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	return nil
}

// postgresArgs is the postmaster's command line: listen on port of
// 127.0.0.1 only, its Unix socket in sockDir (not /run/postgresql).
func postgresArgs(data, sockDir string, port int, settings map[string]string) []string {
	args := []string{"-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + sockDir}
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", k+"="+settings[k])
	}
	return args
}

// postgresEnv is the environment of PostgreSQL's programs: the test's
// PATH and the C locale.
func postgresEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "LANG=C"}
}

// postgresCredential is the postgres user's, when run as root; nil
// otherwise (the programs run as the test's user).
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL must run as the postgres user: %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("postgres user: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// needPostgres returns the directory of PostgreSQL's server programs, or
// skips the test (fails it when CI=true) when there is none.
func needPostgres(tb testing.TB) string {
	tb.Helper()
	return Need(tb, "PostgreSQL", findPostgres(), "postgresql")
}

// Need returns found, the path of what a test needs, or when it is ""
// skips the test, and fails it when CI=true: CI installs Debian's
// package pkg, so a missing program there is a broken set-up.
func Need(tb testing.TB, what, found, pkg string) string {
	tb.Helper()
	if found == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s not found and CI=true: install it (apt-get install -y %s)", what, pkg)
		}
		tb.Skipf("%s not found; install it with apt-get install -y %s (required when CI=true)", what, pkg)
	}
	return found
}

// findPostgres returns the bin directory of the newest PostgreSQL under
// /usr/lib/postgresql (Debian's layout), else the directory of an initdb
// on PATH, else "".
func findPostgres() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin") // the pattern is valid
	best, bestVer := "", -1
	for _, d := range dirs {
		ver, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil || ver <= bestVer || !hasServer(d) {
			continue
		}
		best, bestVer = d, ver
	}
	if best != "" {
		return best
	}
	if p, err := exec.LookPath("initdb"); err == nil && hasServer(filepath.Dir(p)) {
		return filepath.Dir(p)
	}
	return ""
}

// hasServer reports whether dir holds initdb, postgres and createdb.
func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres", "createdb"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}
