package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices/wire"
)

const wait = 10 * time.Second

// TestRunDemoHome runs the demo home on an embedded broker, commands a
// device through it and stops on cancel.
func TestRunDemoHome(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-config", "../../configs/home.toml", "-listen", "127.0.0.1:0"}, outW, io.Discard)
		_ = outW.Close()
	}()
	lines := bufio.NewScanner(out)
	var url string
	for url == "" && lines.Scan() {
		if _, rest, ok := strings.Cut(lines.Text(), "("); ok && strings.HasPrefix(lines.Text(), "embedded broker") {
			url = strings.TrimSuffix(rest, ")")
		}
	}
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "home online: 7 devices") {
		t.Fatalf("after the broker line got %q, want home online", lines.Text())
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()

	topics := wire.Topics{}
	c := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("agent"))
	if tok := c.Connect(); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", url, tok.Error())
	}
	defer c.Disconnect(100)
	acks := make(chan []byte, 10)
	if tok := c.Subscribe(topics.Ack("front-door"), 1, func(_ paho.Client, m paho.Message) { acks <- m.Payload() }); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	if tok := c.Publish(topics.Command("front-door"), 1, false, `{"id":"c1","action":"unlock"}`); !tok.WaitTimeout(wait) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	select {
	case b := <-acks:
		ack, err := wire.DecodeAck(b)
		if err != nil || !ack.OK || ack.State["locked"] != false {
			t.Fatalf("ack %s: %v", b, err)
		}
	case <-time.After(wait):
		t.Fatal("no ack")
	}
	stopRun(t, cancel, done)
}

// stopRun cancels run's context and waits, bounded, for it to return
// without an error.
func stopRun(t *testing.T, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(wait):
		t.Fatal("run did not stop")
	}
}

func TestRunErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no config", []string{"-config", "nope.toml"}, "nope.toml"},
		{"bad flag", []string{"-colour"}, "colour"},
		{"extra args", []string{"x"}, "unexpected"},
		{"bad broker", []string{"-config", "../../configs/home.toml", "-broker", "http://x"}, "broker"},
		{"bad level", []string{"-log-level", "loud"}, "log-level"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := run(t.Context(), c.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run(%q) = %v, want error naming %q", c.args, err, c.want)
			}
		})
	}
}

func TestRunPortTaken(t *testing.T) {
	b := brokertest.Start(t)
	err := run(t.Context(), []string{"-config", "../../configs/home.toml", "-listen", b.Addr()}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), b.Addr()) {
		t.Fatalf("run on a taken port: %v", err)
	}
}

func TestVersion(t *testing.T) {
	var b strings.Builder
	if err := run(t.Context(), []string{"-version"}, &b, io.Discard); err != nil || b.String() != fmt.Sprintln("sim", Version) {
		t.Fatalf("%q, %v", b.String(), err)
	}
}
