package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/sortie-edge/sortie/broker/brokertest"
)

// TestFleetConnectsItsGatewaysButTheOfflineOnes runs "sim fleet"
// against a broker on 127.0.0.1 and stops it on cancel.
func TestFleetConnectsItsGatewaysButTheOfflineOnes(t *testing.T) {
	b := brokertest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"fleet", "-hub", b.URL(), "-gateways", "4", "-offline", "0.25", "-seed", "3"}, outW, io.Discard)
		_ = outW.Close()
	}()
	lines := bufio.NewScanner(out)
	var got []string
	for lines.Scan() {
		got = append(got, lines.Text())
		if strings.Contains(lines.Text(), "connected in") {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	if len(got) != 3 || !strings.HasPrefix(got[0], "fleet of 4 gateways (seed 3)") ||
		!strings.HasPrefix(got[1], "  offline: 1 (sim-0000") || !strings.HasPrefix(got[2], "3 connected in") {
		t.Fatalf("output %q, want the fleet, its one offline gateway, 3 connected", got)
	}
	stopRun(t, cancel, done)
}

func TestFleetPrintsTheHubsGatewayLines(t *testing.T) {
	var b strings.Builder
	if err := run(t.Context(), []string{"fleet", "-gateways", "2", "-password", "pw-{id}-secret", "-hub-config", "-hash-iterations", "10"}, &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || lines[0] != "[gateways]" || !strings.HasPrefix(lines[1], `"sim-00000" = "pbkdf2-sha256$10$`) {
		t.Fatalf("output %q", b.String())
	}
}

func TestFleetErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no hub", []string{"fleet"}, "-hub"},
		{"hub config without password", []string{"fleet", "-hub-config"}, "-password"},
		{"bad fraction", []string{"fleet", "-hub", "tcp://127.0.0.1:1", "-drift", "2"}, "drift"},
		{"bad files", []string{"fleet", "-hub", "tcp://127.0.0.1:1", "-files", "nope"}, "-files"},
		{"extra args", []string{"fleet", "x"}, "unexpected"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := run(t.Context(), c.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("run(%q) = %v, want error naming %q", c.args, err, c.want)
			}
		})
	}
}
