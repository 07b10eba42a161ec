package main

import (
	"io"
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	in := `goos: linux
pkg: github.com/sortie-edge/sortie/store
BenchmarkDriverSteps/missions=64-2   	   10000	    250576 ns/op	         2.455 ratio	      4877 raw-commits/s
BenchmarkEndToEnd-2   915  0 ns/op  0.8097 first-cmd-p50-ms
PASS
`
	var out strings.Builder
	if err := run(strings.NewReader(in), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	want := `| package | benchmark | figures |
| --- | --- | --- |
| store | DriverSteps/missions=64 | 250576 ns/op, 2.455 ratio, 4877 raw-commits/s |
| store | EndToEnd | 0.8097 first-cmd-p50-ms |
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
	if err := run(strings.NewReader("--- FAIL: BenchmarkX\n"), io.Discard, io.Discard); err == nil {
		t.Error("a failed benchmark run must fail the table")
	}
}
