package clustertest

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to an address, so that a test can cut
// them as a network failure would, or hold a client off for as long as
// it likes: a gateway's way to a node, which the test opens when it has
// seen what happens while it is shut.
type Proxy struct {
	ln    net.Listener
	to    string
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

// StartProxy forwards a listener on 127.0.0.1 to to (host:port, or a
// tcp:// URL) until the test ends.
func StartProxy(tb testing.TB, to string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, to: strings.TrimPrefix(to, "tcp://")}
	p.wg.Go(p.serve)
	tb.Cleanup(func() {
		_ = ln.Close() // ends the accept loop; nothing else to report
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_ = c.Close() // refused: the client sees its server down
			continue
		}
		up, err := net.Dial("tcp", p.to)
		if err != nil {
			_ = c.Close() // the server is gone: so is this connection
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
			p.wg.Go(func() {
				_, _ = io.Copy(pair[0], pair[1])
				// One side ended: end the other; their errors are the
				// cut the test made.
				_ = pair[0].Close()
				_ = pair[1].Close()
			})
		}
	}
}

// URL is the proxy's address as an MQTT broker URL.
func (p *Proxy) URL() string { return "tcp://" + p.ln.Addr().String() }

// Cut closes every connection made so far.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close() // a cut is the point; a connection already gone is fine
	}
	p.conns = nil
}

// SetDown makes the proxy refuse new connections (accept and close
// them at once) while v is true.
func (p *Proxy) SetDown(v bool) {
	p.mu.Lock()
	p.down = v
	p.mu.Unlock()
}
