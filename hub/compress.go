package hub

import (
	"compress/gzip"
	"net/http"
	"strings"
	"sync"
)

// The API's JSON and the dashboard's files go out gzipped to a client
// that accepts it. A fleet's lists repeat the same keys and devices on
// every gateway: 10,000 gateways' records are tens of megabytes of JSON
// and a tenth of that gzipped (docs/performance.md, "The dashboard
// under a month of a fleet"). The event stream is left alone: each
// event must reach the page when sent, not when a block fills.

// gzipLevel trades ratio for the hub's CPU: BestSpeed already takes a
// repetitive list to about a tenth, at a fraction of the default
// level's cost.
const gzipLevel = gzip.BestSpeed

var gzipPool = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, gzipLevel) // the level is a valid constant
	return w
}}

// acceptsGzip says whether the request's Accept-Encoding takes gzip.
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
			if strings.EqualFold(strings.TrimSpace(name), "gzip") && strings.ReplaceAll(strings.TrimSpace(q), " ", "") != "q=0" {
				return true
			}
		}
	}
	return false
}

// compressible is a Content-Type worth gzipping.
func compressible(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.TrimSpace(strings.ToLower(ct))
	if ct == "text/event-stream" {
		return false
	}
	return strings.HasPrefix(ct, "text/") || ct == "application/json" || ct == "text/javascript" ||
		ct == "application/javascript" || ct == "image/svg+xml"
}

// gzipWriter gzips a response once its header says it is a whole (200)
// body of a compressible type that is not encoded already; anything
// else passes through untouched.
type gzipWriter struct {
	http.ResponseWriter
	gz      *gzip.Writer
	decided bool
}

func (w *gzipWriter) decide(code int) {
	if w.decided {
		return
	}
	w.decided = true
	h := w.Header()
	if code != http.StatusOK || h.Get("Content-Encoding") != "" || !compressible(h.Get("Content-Type")) {
		return
	}
	h.Del("Content-Length")
	h.Set("Content-Encoding", "gzip")
	h.Add("Vary", "Accept-Encoding")
	w.gz = gzipPool.Get().(*gzip.Writer)
	w.gz.Reset(w.ResponseWriter)
}

func (w *gzipWriter) WriteHeader(code int) {
	w.decide(code)
	w.ResponseWriter.WriteHeader(code)
}

func (w *gzipWriter) Write(p []byte) (int, error) {
	if !w.decided {
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", http.DetectContentType(p))
		}
		w.WriteHeader(http.StatusOK)
	}
	if w.gz != nil {
		return w.gz.Write(p)
	}
	return w.ResponseWriter.Write(p)
}

// Flush sends what is compressed so far.
func (w *gzipWriter) Flush() {
	if w.gz != nil {
		_ = w.gz.Flush() // its error is the connection's, which the next Write reports
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *gzipWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// close ends the gzip stream and returns its writer to the pool.
func (w *gzipWriter) close() {
	if w.gz == nil {
		return
	}
	_ = w.gz.Close() // the client hung up, or the body is complete: nothing to tell either way
	gzipPool.Put(w.gz)
	w.gz = nil
}

// withGzip serves h with its response gzipped when r accepts it.
func withGzip(w http.ResponseWriter, r *http.Request, h http.Handler) {
	if !acceptsGzip(r) {
		h.ServeHTTP(w, r)
		return
	}
	gw := &gzipWriter{ResponseWriter: w}
	defer gw.close()
	h.ServeHTTP(gw, r)
}
