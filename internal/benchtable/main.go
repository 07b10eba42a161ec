// Command benchtable turns `go test -bench` output into a Markdown table,
// one row per benchmark with its reported figures, for `make bench` and
// the README's performance section. It copies its input to stderr so the
// raw output stays visible.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	if err := run(os.Stdin, os.Stdout, os.Stderr); err != nil {
		_, _ = fmt.Fprintln(os.Stderr, "benchtable:", err) // nowhere else to report it
		os.Exit(1)
	}
}

// row is one benchmark result line.
type row struct {
	pkg, name string
	figures   []string
}

func run(in io.Reader, out, echo io.Writer) error {
	var rows []row
	pkg := ""
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	failed := false
	for sc.Scan() {
		line := sc.Text()
		_, _ = fmt.Fprintln(echo, line) // a courtesy copy; the table is the output
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(p, "github.com/sortie-edge/sortie/")
			continue
		}
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "--- FAIL") {
			failed = true
		}
		if r, ok := parse(line); ok {
			r.pkg = pkg
			rows = append(rows, r)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var table strings.Builder
	table.WriteString("| package | benchmark | figures |\n| --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&table, "| %s | %s | %s |\n", r.pkg, r.name, strings.Join(r.figures, ", "))
	}
	if _, err := io.WriteString(out, table.String()); err != nil {
		return err
	}
	if failed {
		return fmt.Errorf("a benchmark failed")
	}
	return nil
}

// parse reads "BenchmarkX-2  N  v1 unit1  v2 unit2 ...", dropping the
// iteration count and a zero ns/op (benchmarks that report their own
// figures set it to 0).
func parse(line string) (row, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return row{}, false
	}
	name := strings.TrimPrefix(f[0], "Benchmark")
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		name = name[:i]
	}
	r := row{name: name}
	for i := 2; i+1 < len(f); i += 2 {
		v, unit := f[i], f[i+1]
		if unit == "ns/op" && (v == "0" || v == "0.0") {
			continue
		}
		r.figures = append(r.figures, v+" "+unit)
	}
	return r, true
}
