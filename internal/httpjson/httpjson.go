// Package httpjson writes the JSON answers of the agent's and the hub's
// HTTP APIs, with the one error shape both document:
// {"error":{"code":"...","message":"..."}}.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Error is the body of every error answer.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is an error answer's code (machine-readable) and message
// (for people).
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Write answers status with v as JSON, never cached; indent makes it
// readable as it is (the agent's CLI shows it with -json).
func Write(w http.ResponseWriter, status int, v any, indent bool) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if indent {
		enc.SetIndent("", "  ")
	}
	_ = enc.Encode(v) // the client may be gone; nothing to do about it
}

// WriteError answers status with an Error of code and msg.
func WriteError(w http.ResponseWriter, status int, code, msg string, indent bool) {
	Write(w, status, Error{Error: ErrorBody{Code: code, Message: msg}}, indent)
}
