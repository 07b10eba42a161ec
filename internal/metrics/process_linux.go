package metrics

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
)

// NewProcessCollector returns a Collector of the process's own metrics,
// read from /proc/self and getrlimit at each scrape: process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes,
// process_virtual_memory_max_bytes, process_open_fds, process_max_fds and
// process_start_time_seconds. A value that cannot be read is left out of
// the scrape. On systems other than Linux it collects nothing.
func NewProcessCollector() Collector {
	return &processCollector{
		cpu:     NewDesc("process_cpu_seconds_total", "CPU time, user and system, the process has used, in seconds.", TypeCounter),
		rss:     NewDesc("process_resident_memory_bytes", "Resident memory size of the process, in bytes.", TypeGauge),
		vsize:   NewDesc("process_virtual_memory_bytes", "Virtual memory size of the process, in bytes.", TypeGauge),
		vmax:    NewDesc("process_virtual_memory_max_bytes", "Limit of the process's virtual memory size (RLIMIT_AS), in bytes.", TypeGauge),
		openFDs: NewDesc("process_open_fds", "File descriptors the process has open.", TypeGauge),
		maxFDs:  NewDesc("process_max_fds", "Limit of the process's open file descriptors (RLIMIT_NOFILE).", TypeGauge),
		start:   NewDesc("process_start_time_seconds", "Start of the process, in seconds since the epoch.", TypeGauge),
	}
}

type processCollector struct {
	cpu, rss, vsize, vmax, openFDs, maxFDs, start *Desc

	startOnce sync.Once
	started   float64 // 0: unknown
}

func (c *processCollector) Describe() []*Desc {
	return []*Desc{c.cpu, c.rss, c.vsize, c.vmax, c.openFDs, c.maxFDs, c.start}
}

// userHZ is the unit of the times in /proc/self/stat: clock ticks, 100 a
// second on every Linux (sysconf(_SC_CLK_TCK) is fixed by the ABI).
const userHZ = 100

func (c *processCollector) Collect(s *Scrape) {
	if st, err := readStat("/proc/self/stat"); err == nil {
		s.Emit(c.cpu, float64(st.utime+st.stime)/userHZ)
		s.Emit(c.rss, float64(st.rss*uint64(os.Getpagesize())))
		s.Emit(c.vsize, float64(st.vsize))
		c.startOnce.Do(func() {
			if boot, err := bootTime("/proc/stat"); err == nil {
				c.started = float64(boot) + float64(st.starttime)/userHZ
			}
		})
		if c.started > 0 {
			s.Emit(c.start, c.started)
		}
	}
	if n, err := countDir("/proc/self/fd"); err == nil {
		s.Emit(c.openFDs, float64(n))
	}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil {
		s.Emit(c.maxFDs, float64(rl.Cur))
	}
	if syscall.Getrlimit(syscall.RLIMIT_AS, &rl) == nil {
		s.Emit(c.vmax, float64(rl.Cur))
	}
}

// procStat holds the fields of /proc/self/stat the collector reads (proc(5)).
type procStat struct {
	utime, stime uint64 // clock ticks
	starttime    uint64 // clock ticks after boot
	vsize        uint64 // bytes
	rss          uint64 // pages
}

var errFormat = errors.New("unexpected format")

// readStat parses a /proc/PID/stat file. The command name, field 2, is
// in parentheses and may hold spaces and parentheses itself: the fields
// are counted from the last ')'.
func readStat(path string) (procStat, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errFormat
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state): field n is f[n-3]
	if len(f) < 22 {
		return procStat{}, errFormat
	}
	var st procStat
	for _, x := range []struct {
		to    *uint64
		field int
	}{{&st.utime, 14}, {&st.stime, 15}, {&st.starttime, 22}, {&st.vsize, 23}, {&st.rss, 24}} {
		if *x.to, err = strconv.ParseUint(string(f[x.field-3]), 10, 64); err != nil {
			return procStat{}, err
		}
	}
	return st, nil
}

// bootTime reads the boot time, in seconds since the epoch, from the
// btime line of /proc/stat.
func bootTime(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("btime ")); ok {
			return strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, errFormat
}

// countDir counts the entries of a directory (of /proc/self/fd, the open
// descriptors, the one reading it included).
func countDir(path string) (int, error) {
	d, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = d.Close() }() // read only: nothing to lose
	n := 0
	for {
		names, err := d.Readdirnames(256)
		n += len(names)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}
