package metrics

import (
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"time"
)

// NewGoCollector returns a Collector of the Go runtime's metrics, read at
// each scrape (runtime.ReadMemStats stops the world for a few
// microseconds):
//
//   - go_goroutines, go_threads (OS threads created), go_info{version},
//     go_sched_gomaxprocs_threads;
//   - go_gc_duration_seconds, a summary of the stop-the-world pauses of
//     the last collections (quantiles 0, 0.25, 0.5, 0.75, 1), and
//     go_gc_gogc_percent and go_gc_gomemlimit_bytes, the collector's
//     settings (GOGC, GOMEMLIMIT);
//   - go_memstats_*: the fields of runtime.MemStats that client_golang
//     exported, under its names (heap_alloc_bytes, sys_bytes,
//     alloc_bytes_total, next_gc_bytes, last_gc_time_seconds, ...).
func NewGoCollector() Collector {
	c := &goCollector{
		goroutines: NewDesc("go_goroutines", "Goroutines that exist now.", TypeGauge),
		threads:    NewDesc("go_threads", "OS threads the Go runtime created.", TypeGauge),
		info:       NewDesc("go_info", "The Go version the program was built with, as a label; the value is 1.", TypeGauge, "version"),
		procs:      NewDesc("go_sched_gomaxprocs_threads", "GOMAXPROCS: the OS threads that may run Go code at once.", TypeGauge),
		gcPause:    NewDesc("go_gc_duration_seconds", "Stop-the-world pauses of the garbage collector, in seconds: quantiles of the last ones, sum and count of all.", TypeSummary),
		gogc:       NewDesc("go_gc_gogc_percent", "Heap growth, in percent of the live heap, that triggers a collection (GOGC; 100 unless set).", TypeGauge),
		memLimit:   NewDesc("go_gc_gomemlimit_bytes", "Soft memory limit of the Go runtime (GOMEMLIMIT; math.MaxInt64 unless set).", TypeGauge),
		samples: []rtmetrics.Sample{
			{Name: "/gc/gogc:percent"},
			{Name: "/gc/gomemlimit:bytes"},
		},
	}
	for _, m := range memStats {
		c.mem = append(c.mem, NewDesc(m.name, m.help, m.typ))
	}
	return c
}

type goCollector struct {
	goroutines, threads, info, procs, gcPause, gogc, memLimit *Desc
	mem                                                       []*Desc // one per memStats entry
	samples                                                   []rtmetrics.Sample
}

// memStats are the go_memstats_* families and the runtime.MemStats field
// each reads.
var memStats = []struct {
	name, help string
	typ        Type
	value      func(*runtime.MemStats) float64
}{
	{"go_memstats_alloc_bytes", "Bytes of heap objects allocated and not yet freed.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.Alloc) }},
	{"go_memstats_alloc_bytes_total", "Bytes allocated for heap objects since the start, freed ones included.", TypeCounter, func(m *runtime.MemStats) float64 { return float64(m.TotalAlloc) }},
	{"go_memstats_sys_bytes", "Bytes of memory the Go runtime obtained from the OS.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.Sys) }},
	{"go_memstats_mallocs_total", "Heap objects allocated since the start.", TypeCounter, func(m *runtime.MemStats) float64 { return float64(m.Mallocs) }},
	{"go_memstats_frees_total", "Heap objects freed since the start.", TypeCounter, func(m *runtime.MemStats) float64 { return float64(m.Frees) }},
	{"go_memstats_heap_alloc_bytes", "Bytes of heap objects allocated and not yet freed.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapAlloc) }},
	{"go_memstats_heap_sys_bytes", "Bytes of heap memory obtained from the OS.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapSys) }},
	{"go_memstats_heap_idle_bytes", "Bytes in heap spans holding no object.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapIdle) }},
	{"go_memstats_heap_inuse_bytes", "Bytes in heap spans holding at least one object.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapInuse) }},
	{"go_memstats_heap_released_bytes", "Bytes of idle heap spans returned to the OS.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapReleased) }},
	{"go_memstats_heap_objects", "Heap objects allocated and not yet freed.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.HeapObjects) }},
	{"go_memstats_stack_inuse_bytes", "Bytes in stack spans.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.StackInuse) }},
	{"go_memstats_stack_sys_bytes", "Bytes of stack memory obtained from the OS.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.StackSys) }},
	{"go_memstats_mspan_inuse_bytes", "Bytes of mspan structures in use.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MSpanInuse) }},
	{"go_memstats_mspan_sys_bytes", "Bytes of memory obtained from the OS for mspan structures.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MSpanSys) }},
	{"go_memstats_mcache_inuse_bytes", "Bytes of mcache structures in use.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MCacheInuse) }},
	{"go_memstats_mcache_sys_bytes", "Bytes of memory obtained from the OS for mcache structures.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.MCacheSys) }},
	{"go_memstats_buck_hash_sys_bytes", "Bytes of memory in profiling bucket hash tables.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.BuckHashSys) }},
	{"go_memstats_gc_sys_bytes", "Bytes of memory in garbage collection metadata.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.GCSys) }},
	{"go_memstats_other_sys_bytes", "Bytes of memory in other runtime allocations.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.OtherSys) }},
	{"go_memstats_next_gc_bytes", "Heap size at which the next collection is due.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.NextGC) }},
	{"go_memstats_last_gc_time_seconds", "End of the last collection, in seconds since the epoch; 0 before the first.", TypeGauge, func(m *runtime.MemStats) float64 { return float64(m.LastGC) / 1e9 }},
}

func (c *goCollector) Describe() []*Desc {
	return append([]*Desc{c.goroutines, c.threads, c.info, c.procs, c.gcPause, c.gogc, c.memLimit}, c.mem...)
}

func (c *goCollector) Collect(s *Scrape) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for i, m := range memStats {
		s.Emit(c.mem[i], m.value(&ms))
	}
	s.Emit(c.goroutines, float64(runtime.NumGoroutine()))
	threads, _ := runtime.ThreadCreateProfile(nil) // with no records to fill, it only counts them
	s.Emit(c.threads, float64(threads))
	s.Emit(c.info, 1, runtime.Version())
	s.Emit(c.procs, float64(runtime.GOMAXPROCS(0)))

	gc := debug.GCStats{PauseQuantiles: make([]time.Duration, 5)}
	debug.ReadGCStats(&gc)
	pauses := sample{value: gc.PauseTotal.Seconds(), count: uint64(gc.NumGC), points: make([]point, len(gc.PauseQuantiles))}
	for i, q := range gc.PauseQuantiles {
		pauses.points[i] = point{at: float64(i) / float64(len(gc.PauseQuantiles)-1), v: q.Seconds()}
	}
	s.add(c.gcPause, pauses)

	samples := make([]rtmetrics.Sample, len(c.samples)) // Read writes the values: one copy per scrape
	copy(samples, c.samples)
	rtmetrics.Read(samples)
	for i, d := range []*Desc{c.gogc, c.memLimit} {
		if samples[i].Value.Kind() == rtmetrics.KindUint64 {
			s.Emit(d, float64(samples[i].Value.Uint64()))
		}
	}
}
