package hub

import (
	"context"
	"sync"
	"time"
)

// presence is what a Service knows of when each gateway was last heard
// from, to find the silent ones without reading every gateway from the
// store at each look. It follows every gateway update the service's
// watchers get (in the cluster mode, every replica's, through the
// feed), and is read again from the store when that feed may have
// missed one.
type presence struct {
	mu     sync.Mutex
	loaded bool
	gws    map[string]heard
}

// heard is a gateway's presence as of its record's change at at.
type heard struct {
	online   bool
	lastSeen time.Time
	at       time.Time
}

func heardOf(g Gateway) heard {
	return heard{online: g.State == StateOnline, lastSeen: g.LastSeen, at: later(g.LastSeen, g.Since)}
}

// note records a gateway's record after a change; an older one than
// what is known (the store read while updates came) changes nothing.
func (p *presence) note(g Gateway) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteLocked(g.ID, heardOf(g))
}

func (p *presence) noteLocked(id string, h heard) {
	if p.gws == nil {
		p.gws = map[string]heard{}
	}
	if old, ok := p.gws[id]; !ok || !h.at.Before(old.at) {
		p.gws[id] = h
	}
}

// forget makes the next look read every gateway from the store: an
// update may have been missed.
func (p *presence) forget() {
	p.mu.Lock()
	p.loaded, p.gws = false, nil
	p.mu.Unlock()
}

// silent returns the gateways online and unheard since cutoff, reading
// them from the store first if need be.
func (p *presence) silent(ctx context.Context, st Backing, cutoff time.Time) ([]string, error) {
	p.mu.Lock()
	loaded := p.loaded
	p.mu.Unlock()
	if !loaded {
		gws, err := st.Gateways(ctx)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		for _, g := range gws {
			p.noteLocked(g.ID, heardOf(g))
		}
		p.loaded = true
		p.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for id, h := range p.gws {
		if h.online && h.lastSeen.Before(cutoff) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// presenceLoop marks offline the gateways silent for OfflineAfter. It
// judges only silence the hub was listening through: connected to the
// gateways' broker and storing without failure for the whole window
// (after a hub outage, or while PostgreSQL was away, heartbeats wait in
// the broker or the stream, and no gateway is to blame). Each gateway
// is marked in a transaction that checks again under its lock, so
// replicas doing it at once, or a stale view, change nothing twice.
func (s *Service) presenceLoop(ctx context.Context) error {
	every := max(s.opts.OfflineAfter/4, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var listening time.Time // since when the link has been up; zero: down
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := s.opts.Now()
		if !s.link.connected() {
			listening = time.Time{}
			continue
		}
		if listening.IsZero() {
			listening = now
		}
		since := listening
		if f := s.storeFailed.Load(); f != 0 {
			since = later(since, time.Unix(0, f))
		}
		cutoff := now.Add(-s.opts.OfflineAfter)
		if since.After(cutoff) {
			continue
		}
		ids, err := s.presence.silent(ctx, s.st, cutoff)
		if err != nil {
			s.log.Warn("read gateways for presence", "err", err)
			continue
		}
		if len(ids) == 0 {
			continue
		}
		in := make([]Inbound, len(ids))
		for i, id := range ids {
			in[i] = Inbound{Gateway: id, Silent: &cutoff, Received: now}
		}
		res, err := s.st.Apply(ctx, in)
		if err != nil {
			s.log.Warn("mark silent gateways offline", "gateways", len(ids), "err", err)
			continue
		}
		marked := map[string]bool{}
		for _, g := range res.Gateways {
			marked[g.ID] = true
			s.log.Info("gateway silent: marked offline", "gateway", g.ID, "last_seen", g.LastSeen, "offline_after", s.opts.OfflineAfter)
		}
		s.report(res)
		for _, id := range ids {
			if marked[id] {
				continue
			}
			// Heard from after all (an update this replica missed): the
			// record says when, so it is not asked again at every look.
			if g, err := s.st.Gateway(ctx, id); err == nil {
				s.presence.note(g)
			}
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
