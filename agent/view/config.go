package view

import (
	"fmt"
	"strings"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/bundle"
)

// Config renders what "agent config" shows: the configuration that runs,
// from where and since when, a trial under way, and the latest outcome.
func Config(c api.ConfigInfo, o Options) string {
	var b strings.Builder
	ts := func(t time.Time) string { return t.In(o.loc()).Format("2006-01-02 15:04:05 MST") }
	since := func(t time.Time) string {
		if o.Now.IsZero() {
			return ts(t)
		}
		return fmt.Sprintf("%s (%s ago)", ts(t), o.Now.Sub(t).Round(time.Second))
	}
	fmt.Fprintf(&b, "running:  %s\n", ref(c.Current))
	fmt.Fprintf(&b, "hash:     %s\n", c.Current.Hash)
	fmt.Fprintf(&b, "since:    %s\n", since(c.Current.Since))
	if t := c.Trial; t != nil {
		fmt.Fprintf(&b, "trial:    until %s: kept if %s answer and no mission of %s fails",
			ts(t.Until), list(t.Devices, "no device"), list(t.Scenes, "no changed scene"))
		if !t.ConfirmBy.IsZero() {
			fmt.Fprintf(&b, ", and the hub is connected by %s", ts(t.ConfirmBy))
		}
		b.WriteString("\n")
		if c.Previous != nil {
			fmt.Fprintf(&b, "reverts to: %s %s\n", ref(*c.Previous), bundle.Short(c.Previous.Hash))
		}
	}
	if c.HubVersion > 0 {
		fmt.Fprintf(&b, "hub:      newest version taken %d\n", c.HubVersion)
	}
	if l := c.Last; l != nil {
		fmt.Fprintf(&b, "last:     %s\n", Outcome(*l, o))
	}
	if c.FilesHash != "" {
		fmt.Fprintf(&b, "files:    the config files now make %s, not what runs", bundle.Short(c.FilesHash))
		if c.Current.Source == "files" {
			b.WriteString(" (edited since the start; restart, or \"agent apply\", to run them)")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Outcome renders what became of one bundle, on one line.
func Outcome(l api.BundleOutcome, o Options) string {
	s := fmt.Sprintf("%s %s from %s", l.Status, bundle.Short(l.Hash), l.Source)
	if l.Version > 0 {
		s += fmt.Sprintf(" version %d", l.Version)
	}
	if l.Reason != "" {
		s += fmt.Sprintf(": %s", l.Reason)
	}
	if l.Message != "" {
		s += fmt.Sprintf(" (%s)", l.Message)
	}
	return s + ", at " + l.At.In(o.loc()).Format("2006-01-02 15:04:05 MST")
}

func ref(r api.ConfigRef) string {
	s := r.Source
	switch r.Source {
	case "files":
		s = "the config files"
	case "local":
		s = "a bundle applied locally"
	case "hub":
		s = fmt.Sprintf("the hub's bundle, version %d", r.Version)
		if r.Rollout != "" {
			s += ", rollout " + r.Rollout
		}
	}
	return s
}

func list(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}
