//go:build !linux

package metrics

// NewProcessCollector returns a Collector of the process's own metrics;
// they are read from /proc, so on this system it collects nothing.
func NewProcessCollector() Collector { return processCollector{} }

type processCollector struct{}

func (processCollector) Describe() []*Desc { return nil }
func (processCollector) Collect(*Scrape)   {}
