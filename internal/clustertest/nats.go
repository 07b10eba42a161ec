package clustertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// NATSOptions shape the nodes of StartNATS. The zero value is a cluster
// with one account, SORTIE (JetStream enabled), whose only user is the
// admin ([NATS.User]) with every permission.
type NATSOptions struct {
	// Users are added to the SORTIE account beside the admin. Each can
	// connect as a NATS client and as an MQTT client.
	Users []User

	// Accounts is nats-server configuration inserted inside the accounts
	// block as is, for accounts of the test's own (with JetStream, add
	// `jetstream: enabled`).
	Accounts string

	// JetStream and MQTT are lines inserted inside the jetstream and mqtt
	// blocks as they are, e.g. "max_file_store: 1GB" or "ack_wait: 5s",
	// "max_ack_pending: 100", "stream_replicas: 1".
	JetStream, MQTT string

	// Config is appended to every node's configuration file as is.
	Config string

	// ReadyTimeout bounds each wait for a node's health (StartNATS,
	// Node.Restart); zero is 30 s.
	ReadyTimeout time.Duration

	// Trace starts the nodes with -DV: debug and protocol trace in the
	// logs. Verbose.
	Trace bool
}

// User is a user of the SORTIE account, for NATS and MQTT clients alike
// (an MQTT client gives Name and Password in its CONNECT).
type User struct {
	Name, Password string

	// Publish and Subscribe are the subjects the user may publish and
	// subscribe to (wildcards allowed); nil allows every subject. MQTT
	// topics are subjects here: topic a/b is subject a.b, + is *, and #
	// is > (plus the level above it).
	Publish, Subscribe []string

	// ConnectionTypes, if not empty, limits the user to those kinds of
	// connection: "STANDARD" (NATS), "MQTT", "WEBSOCKET", ...
	ConnectionTypes []string
}

// NATS is a running cluster of nats-server processes. Its fields are set
// by StartNATS and read-only after.
type NATS struct {
	// Nodes in order: Nodes[0] is n1.
	Nodes []*Node

	// User and Password are the SORTIE account's admin, every permission.
	User, Password string

	// SysUser and SysPassword are the system account's user, for $SYS
	// requests (server and JetStream meta information).
	SysUser, SysPassword string

	readyTimeout time.Duration
}

// Node is one nats-server process of a cluster, listening on 127.0.0.1.
// Its ports and store directory stay the same across restarts. Its
// methods are safe for concurrent use.
type Node struct {
	Name string // server_name: n1, n2, ...

	ClientPort  int // NATS clients
	ClusterPort int // routes between the nodes
	MQTTPort    int // MQTT clients
	MonitorPort int // HTTP monitoring: /healthz, /varz, /jsz, ...

	StoreDir   string // JetStream's store_dir (its files go in a jetstream folder there)
	ConfigFile string
	LogFile    string

	proc         *proc
	readyTimeout time.Duration
}

// StartNATS starts an n-node NATS cluster (a single server for n = 1),
// JetStream and MQTT enabled on every node, and waits until every node
// reports healthy: routes up and a JetStream meta leader elected. The
// nodes are stopped when the test ends, and their logs printed if it
// failed. A busy port (taken by another process between picking and
// binding) makes it start the cluster again on new ports, twice at most.
func StartNATS(tb testing.TB, n int, opts NATSOptions) *NATS {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("StartNATS: %d nodes", n)
	}
	bin, err := natsServer()
	if err != nil {
		tb.Fatal(err)
	}
	c := &NATS{
		User: "admin", Password: secret(),
		SysUser: "sys", SysPassword: secret(),
		readyTimeout: opts.ReadyTimeout,
	}
	if c.readyTimeout <= 0 {
		c.readyTimeout = 30 * time.Second
	}
	dir := tb.TempDir()
	for try := 1; ; try++ {
		c.Nodes, err = c.configure(dir, bin, n, opts)
		if err != nil {
			tb.Fatal(err)
		}
		err = c.start()
		if err == nil {
			break
		}
		busy := c.portBusy()
		for _, nd := range c.Nodes {
			nd.proc.stopQuietly()
		}
		if !busy || try == 3 {
			printLogsOnFailure(tb, c.procs()...)
			tb.Fatalf("start NATS cluster: %v", err)
		}
		tb.Logf("start NATS cluster: a port was taken, trying new ones: %v", err)
	}
	printLogsOnFailure(tb, c.procs()...)
	tb.Cleanup(func() {
		for _, nd := range c.Nodes {
			nd.proc.stopQuietly()
		}
	})
	if err := c.warmMQTT(); err != nil {
		tb.Fatal(err)
	}
	return c
}

// warmMQTT connects an MQTT client to every node until one gets in. A
// node sets up its MQTT session streams when the account's first MQTT
// client arrives, and in a new cluster that lookup can outlast the
// node's 5 s JetStream API timeout: that client is refused (EOF), and
// real gateways simply retry (docs/cluster.md). A test's first client
// must not depend on that race.
func (c *NATS) warmMQTT() error {
	for _, nd := range c.Nodes {
		deadline := time.Now().Add(c.readyTimeout)
		for try := 1; ; try++ {
			mc := paho.NewClient(paho.NewClientOptions().AddBroker(nd.MQTTURL()).
				SetClientID("clustertest-warm-" + nd.Name).SetUsername(c.User).SetPassword(c.Password).
				SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(10 * time.Second))
			tok := mc.Connect()
			ok := tok.WaitTimeout(15*time.Second) && tok.Error() == nil
			if ok {
				mc.Disconnect(100)
				break
			}
			if time.Now().After(deadline) {
				err := tok.Error()
				if err == nil {
					err = errors.New("connect timed out")
				}
				return fmt.Errorf("MQTT on %s: no client admitted after %d tries: %w", nd.Name, try, err)
			}
			time.Sleep(200 * time.Millisecond) // a retry's pause, as a gateway's
		}
	}
	return nil
}

// ClientURLs is every node's client URL, comma-separated, the form
// nats.Connect takes.
func (c *NATS) ClientURLs() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.ClientURL()
	}
	return strings.Join(urls, ",")
}

// Node returns the node whose server_name is name (the name JetStream
// gives a stream's leader), or nil.
func (c *NATS) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// WaitHealthy waits until every running node reports healthy.
func (c *NATS) WaitHealthy() error {
	for _, n := range c.Nodes {
		if n.PID() == 0 {
			continue
		}
		if err := n.WaitHealthy(); err != nil {
			return err
		}
	}
	return nil
}

// ClientURL is the node's NATS URL, "nats://127.0.0.1:port".
func (n *Node) ClientURL() string { return "nats://" + hostPort(n.ClientPort) }

// MQTTURL is the node's MQTT URL in paho's form, "tcp://127.0.0.1:port".
func (n *Node) MQTTURL() string { return "tcp://" + hostPort(n.MQTTPort) }

// MonitorURL is the base URL of the node's monitoring endpoints,
// "http://127.0.0.1:port".
func (n *Node) MonitorURL() string { return "http://" + hostPort(n.MonitorPort) }

// PID is the process ID of the running node, or 0 if it is not running.
func (n *Node) PID() int { return n.proc.pid() }

// Kill sends SIGKILL to the node and waits for it to exit: a crash, no
// flush, no goodbye to the cluster.
func (n *Node) Kill() error { return n.proc.signal(syscall.SIGKILL, 10*time.Second) }

// Stop shuts the node down cleanly (SIGTERM) and waits for it to exit;
// after 10 s it kills it and says so.
func (n *Node) Stop() error { return n.proc.signal(syscall.SIGTERM, 10*time.Second) }

// Start starts a node that was killed or stopped, with the same ports
// and store, without waiting for it to be healthy: for a node that
// cannot be healthy alone (a majority of the cluster down).
func (n *Node) Start() error { return n.proc.start() }

// Restart starts the node again with the same ports and store, stopping
// it first (Stop) if it runs, and waits until it reports healthy: its
// routes up and its JetStream streams and consumers caught up with their
// leaders. A port taken meanwhile by another process is retried for a
// few seconds.
func (n *Node) Restart() error {
	if n.PID() != 0 {
		if err := n.Stop(); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := n.Start(); err != nil {
			return err
		}
		err := n.WaitHealthy()
		if err == nil {
			return nil
		}
		if !n.portBusy() || time.Now().After(deadline) {
			return fmt.Errorf("restart %s: %w", n.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitHealthy polls the node's /healthz until it answers 200: routes up,
// a JetStream meta leader known, every stream and consumer it holds
// current. It fails when the node exits or after the ready timeout.
func (n *Node) WaitHealthy() error {
	return waitHealthz(n.proc, n.MonitorURL()+"/healthz", n.readyTimeout)
}

// configure writes the nodes' configuration files, on new free ports.
func (c *NATS) configure(dir, bin string, n int, opts NATSOptions) ([]*Node, error) {
	ports, err := freePorts(4 * n)
	if err != nil {
		return nil, err
	}
	nodes := make([]*Node, n)
	for i := range nodes {
		name := "n" + strconv.Itoa(i+1)
		nd := &Node{
			Name:         name,
			ClientPort:   ports[4*i],
			ClusterPort:  ports[4*i+1],
			MQTTPort:     ports[4*i+2],
			MonitorPort:  ports[4*i+3],
			StoreDir:     filepath.Join(dir, name, "store"),
			ConfigFile:   filepath.Join(dir, name, "nats.conf"),
			LogFile:      filepath.Join(dir, name, "nats.log"),
			readyTimeout: c.readyTimeout,
		}
		// A new try starts from an empty store.
		if err := os.RemoveAll(filepath.Dir(nd.StoreDir)); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(nd.StoreDir, 0o755); err != nil {
			return nil, err
		}
		args := []string{"-c", nd.ConfigFile}
		if opts.Trace {
			args = append(args, "-DV")
		}
		nd.proc = &proc{name: "nats " + name, path: bin, args: args, log: nd.LogFile}
		nodes[i] = nd
	}
	for _, nd := range nodes {
		if err := os.WriteFile(nd.ConfigFile, []byte(c.config(nd, nodes, opts)), 0o644); err != nil {
			return nil, err
		}
	}
	return nodes, nil
}

// config is node nd's configuration file.
func (c *NATS) config(nd *Node, nodes []*Node, opts NATSOptions) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("server_name: %s", q(nd.Name))
	w("listen: %s", q(hostPort(nd.ClientPort)))
	w("http: %s", q(hostPort(nd.MonitorPort)))
	w("jetstream {")
	w("  store_dir: %s", q(nd.StoreDir))
	w("%s", opts.JetStream)
	w("}")
	if len(nodes) > 1 {
		routes := make([]string, len(nodes))
		for i, o := range nodes {
			routes[i] = q("nats-route://" + hostPort(o.ClusterPort))
		}
		w("cluster {")
		w("  name: sortie")
		w("  listen: %s", q(hostPort(nd.ClusterPort)))
		w("  routes: [%s]", strings.Join(routes, ", "))
		w("}")
	}
	w("mqtt {")
	w("  listen: %s", q(hostPort(nd.MQTTPort)))
	w("%s", opts.MQTT)
	w("}")
	w("system_account: SYS")
	w("accounts {")
	w("  SYS { users: [{user: %s, password: %s}] }", q(c.SysUser), q(c.SysPassword))
	w("  SORTIE {")
	w("    jetstream: enabled")
	w("    users: [")
	w("      {user: %s, password: %s}", q(c.User), q(c.Password))
	for _, u := range opts.Users {
		w("      %s", userConfig(u))
	}
	w("    ]")
	w("  }")
	w("%s", opts.Accounts)
	w("}")
	w("%s", opts.Config)
	return b.String()
}

// userConfig is u's entry in an account's users list.
func userConfig(u User) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{user: %s, password: %s", q(u.Name), q(u.Password))
	var perms []string
	if u.Publish != nil {
		perms = append(perms, "publish: {allow: "+qlist(u.Publish)+"}")
	}
	if u.Subscribe != nil {
		perms = append(perms, "subscribe: {allow: "+qlist(u.Subscribe)+"}")
	}
	if len(perms) > 0 {
		fmt.Fprintf(&b, ", permissions: {%s}", strings.Join(perms, ", "))
	}
	if len(u.ConnectionTypes) > 0 {
		fmt.Fprintf(&b, ", allowed_connection_types: %s", qlist(u.ConnectionTypes))
	}
	b.WriteString("}")
	return b.String()
}

// start starts every node and waits for all to be healthy.
func (c *NATS) start() error {
	for _, nd := range c.Nodes {
		if err := nd.Start(); err != nil {
			return err
		}
	}
	return c.WaitHealthy()
}

// procs is the nodes' processes.
func (c *NATS) procs() []*proc {
	ps := make([]*proc, len(c.Nodes))
	for i, n := range c.Nodes {
		ps[i] = n.proc
	}
	return ps
}

// portBusy reports whether a node's log says it could not bind.
func (c *NATS) portBusy() bool {
	for _, n := range c.Nodes {
		if n.portBusy() {
			return true
		}
	}
	return false
}

func (n *Node) portBusy() bool {
	return strings.Contains(n.proc.tail(4<<10), "address already in use")
}

// waitHealthz polls url until it answers 200, p exits, or timeout passes.
func waitHealthz(p *proc, url string, timeout time.Duration) error {
	exited := p.exited()
	if exited == nil {
		return fmt.Errorf("%s: %w", p.name, errNotRunning)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10)) // only for the message
			_ = resp.Body.Close()                                   // read-only request
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited (%w) before it was healthy", p.name, p.exitErr())
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy within %v: last %s", p.name, timeout, last)
		case <-tick.C:
		}
	}
}

// The nats-server binary, built once per test binary.
var natsBin struct {
	once sync.Once
	path string
	err  error
}

// NATSServer returns the path of the nats-server of go.mod's tool
// directive. `go tool -n` builds it into Go's build cache (once per
// version and toolchain, then a cache hit) and prints its path.
func NATSServer() (string, error) { return natsServer() }

func natsServer() (string, error) {
	natsBin.once.Do(func() {
		gobin, err := GoCommand()
		if err != nil {
			natsBin.err = err
			return
		}
		cmd := exec.Command(gobin, "tool", "-n", "nats-server")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			natsBin.err = fmt.Errorf("build nats-server (go tool -n nats-server): %w: %s", err, stderr.String())
			return
		}
		natsBin.path = strings.TrimSpace(string(out))
	})
	return natsBin.path, natsBin.err
}

// goCommand finds the go command: on PATH, or in $GOROOT/bin.
// GoCommand is the go command's path: on PATH, else in $GOROOT/bin.
func GoCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("go command not found on PATH nor in $GOROOT/bin: it builds nats-server")
}

// secret is a random password.
func secret() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// q quotes s for a nats-server configuration file.
func q(s string) string { return strconv.Quote(s) }

// qlist is a list of quoted strings, "[...]".
func qlist(ss []string) string {
	qs := make([]string, len(ss))
	for i, s := range ss {
		qs[i] = q(s)
	}
	return "[" + strings.Join(qs, ", ") + "]"
}
