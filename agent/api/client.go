package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

// Client calls an agent's management API; the agent's CLI is built on
// it. Its zero value is not usable: set Base.
type Client struct {
	// Base is the API's URL, http://host:port or https://host:port.
	Base string
	// Token is sent as a bearer token when set.
	Token string
	// Hint is added to the message of a 401 answer (see CallError).
	Hint string
	// HTTP makes the requests; nil uses http.DefaultClient.
	HTTP *http.Client
}

// CallError is an error answer of the API.
type CallError struct {
	Status  int    // HTTP status
	Code    string // the answer's error code (Code* constants), or "http"
	Message string
	// Hint, when set, is added to the message of a 401 answer: where
	// this client's user sets the token.
	Hint string
}

func (e *CallError) Error() string {
	if e.Status == http.StatusUnauthorized && e.Hint != "" {
		return e.Message + " (" + e.Hint + ")"
	}
	return e.Message
}

// Call sends one request and returns the raw JSON answer; out, when not
// nil, receives it decoded.
func (c *Client) Call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	resp, err := c.Send(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	// Once the answer is read, closing the body only frees the connection:
	// its error tells the caller nothing.
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("answer of %s %s is not what this client expects (version mismatch?): %w", method, path, err)
		}
	}
	return raw, nil
}

// Send sends one request and returns a successful response, whose body
// the caller closes; an error answer becomes a *CallError.
func (c *Client) Send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if k, ok := body.(interface{ IdempotencyKey() string }); ok && k.IdempotencyKey() != "" {
		// A kept-alive connection the agent closes as idle (IdleTimeout)
		// while this request is on its way is reset; net/http sends a
		// request again on a new connection only when it is GET-like or
		// carries this header, and a repeated request ID is answered
		// with the mission it made. Seen as "connection reset by peer"
		// on POST /api/missions under load.
		req.Header.Set("Idempotency-Key", k.IdempotencyKey())
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the agent at %s (is it running? see -addr): %w", c.Base, err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	// The status is the error; a body that cannot be read or closed only
	// loses its message, which the fallback below replaces.
	defer func() { _ = resp.Body.Close() }()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var ae Error
	if json.Unmarshal(raw, &ae) != nil || ae.Error.Message == "" {
		return nil, &CallError{Status: resp.StatusCode, Code: "http", Hint: c.Hint, Message: fmt.Sprintf("%s %s: %s", method, path, resp.Status)}
	}
	return nil, &CallError{Status: resp.StatusCode, Code: ae.Error.Code, Hint: c.Hint, Message: ae.Error.Message}
}

// watchPoll is how often Watch asks for new events: the API has no
// stream, and a few requests a second cost the agent nothing.
const watchPoll = 250 * time.Millisecond

// Watch calls each with the mission's events as they are committed,
// in order, and the mission as last read (its steps' results as of then),
// until the mission is terminal, and returns it as it ended (or as last
// read, with ctx's error).
func (c *Client) Watch(ctx context.Context, id string, each func(driver.Event, *driver.Mission) error) (*driver.Mission, error) {
	seen := 0
	for {
		var d MissionDetail
		if _, err := c.Call(ctx, http.MethodGet, "/api/missions/"+url.PathEscape(id), nil, &d); err != nil {
			return nil, err
		}
		if d.Mission == nil {
			return nil, fmt.Errorf("mission %s: the answer holds no mission", id)
		}
		for _, ev := range d.Timeline[min(seen, len(d.Timeline)):] {
			if err := each(ev, d.Mission); err != nil {
				return nil, err
			}
		}
		seen = max(seen, len(d.Timeline))
		if d.Mission.State.Terminal() {
			return d.Mission, nil
		}
		select {
		case <-ctx.Done():
			return d.Mission, ctx.Err()
		case <-time.After(watchPoll):
		}
	}
}
