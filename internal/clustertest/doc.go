// Package clustertest runs the real parts of the hub's cluster mode for
// tests: a NATS cluster (JetStream and MQTT on every node) and a
// PostgreSQL server, each as separate processes on 127.0.0.1 with free
// ports and their data in temporary directories, the way
// net/http/httptest runs a server. Only tests import it: no binary links
// package testing, nats-server or PostgreSQL.
//
// The NATS nodes are the nats-server of go.mod's tool directive, built
// once per test binary (`go tool -n nats-server`, which builds it into
// Go's build cache and prints its path); PostgreSQL is Debian's, found
// under /usr/lib/postgresql/*/bin. A test faults them by process:
// [Node.Kill] is SIGKILL, [Postgres.Stop] an immediate shutdown, and both
// start again on the same ports and data.
//
// Every process writes its log to a file in the test's temporary
// directory; when the test fails, the end of each log is printed. Each
// process gets SIGKILL if the test binary dies, so a test that times
// out leaves nothing running.
//
// The helpers take a testing.TB and stop everything in its Cleanup. The
// methods that fault a process return errors instead of failing the
// test, so that a test may call them from its own goroutines.
package clustertest
